"""Errors that name a request field, and the hardened JSON reader behind every request body."""

from __future__ import annotations

import json
from typing import Any

#: Deepest nesting of a JSON body or field.
MAX_DEPTH = 32


class FieldError(ValueError):
    """A bad request field: ``status`` (4xx, or 503 for a context still building), the ``field``, a
    message, and ``extra`` fields of the body (a building context's status and progress)."""

    def __init__(self, field: str | None, message: str, status: int = 422, extra: dict | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message
        self.status = status
        self.extra = extra

    def payload(self) -> dict:
        """The JSON body of the error response."""
        return {**(self.extra or {}), "error": str(self), "field": self.field}


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)``, shortened to about ``limit`` characters."""
    text = repr(value) if not isinstance(value, (list, dict)) or len(value) < 16 else \
        f"<{type(value).__name__} of {len(value)} entries>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_tree(value: Any, field: str, status: int = 422) -> None:
    """Refuse JSON nested deeper than :data:`MAX_DEPTH` (with ``status``) and strings that are not
    valid Unicode (a lone surrogate such as ``"\\ud800"``, 422), naming the place, e.g. ``filter.label[2]``."""
    stack = [(value, field, 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise FieldError(field, f"is nested more than {MAX_DEPTH} levels deep; send a flat JSON object", status)
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise FieldError(where, f"holds a lone surrogate ({item[exc.start]!r} at position {exc.start}); "
                                        "send valid Unicode text") from None
        elif isinstance(item, dict):
            for key, child in item.items():
                try:
                    str(key).encode("utf-8")
                except UnicodeEncodeError:
                    raise FieldError(where, "has a key holding a lone surrogate; send valid Unicode text") from None
                name = str(key)[:64]
                stack.append((child, name if where == "body" else f"{where}.{name}", depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{i}]", depth + 1) for i, child in enumerate(item))


def loads(text: str | bytes, field: str, status: int = 422) -> Any:
    """``json.loads`` whose every failure (bad syntax, too deep, lone surrogates) is a :class:`FieldError`."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise FieldError(field, f"is nested more than {MAX_DEPTH} levels deep; send a flat JSON object",
                         status) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise FieldError(field, f"is not valid JSON ({exc})", status) from None
    check_tree(data, field, status)
    return data


def parse_json_object(body: bytes, field: str = "body") -> dict:
    """A JSON object from request bytes (400 when it is not one)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FieldError(field, f"is not valid UTF-8 ({exc})", 400) from None
    data = loads(text, field, 400) if text.strip() else None
    if not isinstance(data, dict):
        raise FieldError(field, "must be a JSON object", 400)
    return data
