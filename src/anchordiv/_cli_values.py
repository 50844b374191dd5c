"""Values shared by the ``anchordiv`` commands: the options ``--param KEY=VALUE``, ``--rank`` and
``--tau``, and the cells of the CSV files they write."""

from __future__ import annotations

import re
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


def tau_option(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """Click callback of every ``--tau`` option: each temperature (one, or a list) checked by
    :func:`anchordiv.models.base.check_tau`, the range shared with models, manifests and the service."""
    from .models.base import check_tau

    if value is None:
        return None
    try:
        if isinstance(value, (list, tuple)):
            return type(value)(check_tau(v, "--tau") for v in value)
        return check_tau(value, "--tau")
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("--tau "), ctx, param, param_hint="--tau") from None


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)
#: First characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """``value`` as a CSV cell that no spreadsheet runs: text starting with ``= + - @``, tab or CR
    gets a leading ``'`` (OWASP's advice), unless it reads as a number; None is empty."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if text.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


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
