"""Option values shared by the ``anchordiv`` commands: ``--param KEY=VALUE`` and ``--rank``."""

from __future__ import annotations

from typing import Any, Sequence

import click


def parse_rank(value: str | None) -> int | float | None:
    """``--rank`` as an int k or a float variance fraction."""
    if value is None:
        return None
    text = value.strip()
    try:
        if any(c in text for c in ".eE"):
            return float(text)
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an int k or a variance fraction in (0, 1]", param_hint="--rank") from None


def parse_params(values: Sequence[str]) -> dict:
    """``--param KEY=VALUE`` options as a dict; values read as int, float or bool where they parse."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--param")
        raw = raw.strip()
        value: Any = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        out[key] = value
    return out
