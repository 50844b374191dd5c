"""Validation of request fields: every problem is a :class:`FieldError` naming the field."""

from __future__ import annotations

import json
import math
from typing import Any

#: Largest k a request may ask for.
MAX_K = 1000
#: Longest text query, in characters.
MAX_TEXT = 1000
#: Longest anchors spec (``context``), in characters.
MAX_CONTEXT = 500
#: Largest uploaded image, in bytes.
MAX_IMAGE_BYTES = 10 * 1024 * 1024
#: Largest JSON body, in bytes.
MAX_JSON_BYTES = 1024 * 1024
#: At most this many filter values in all.
MAX_FILTER_VALUES = 200
#: At most this many ids in one /metadata request.
MAX_IDS = 1000
#: Temperatures accepted.
TAU_RANGE = (1e-4, 100.0)


class FieldError(ValueError):
    """A bad request field: ``status`` (4xx), the ``field`` and a message."""

    def __init__(self, field: str | None, message: str, status: int = 422):
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message
        self.status = status

    def payload(self) -> dict:
        """The JSON body of the error response."""
        return {"error": str(self), "field": self.field}


def parse_json_object(body: bytes, field: str = "body") -> dict:
    """A JSON object from request bytes."""
    try:
        data = json.loads(body.decode("utf-8")) if body.strip() else None
    except (UnicodeDecodeError, ValueError) as exc:
        raise FieldError(field, f"is not valid JSON ({exc})", 400) from None
    if not isinstance(data, dict):
        raise FieldError(field, "must be a JSON object", 400)
    return data


def _from_form(value: Any, kind: str, field: str) -> Any:
    """Form fields arrive as strings: turn them into the JSON value they stand for."""
    if not isinstance(value, str) or kind == "str":
        return value
    text = value.strip()
    if kind == "bool":
        if text.lower() in ("true", "1", "on", "yes"):
            return True
        if text.lower() in ("false", "0", "off", "no", ""):
            return False
        raise FieldError(field, f"must be true or false, got {value!r}")
    if text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise FieldError(field, f"is not valid JSON: {value!r}") from None


def integer(data: dict, field: str, default: Any = None, lo: int | None = None, hi: int | None = None,
            form: bool = False) -> Any:
    """An integer field in [lo, hi], or ``default`` when absent or null."""
    value = data.get(field)
    value = _from_form(value, "int", field) if form else value
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(field, f"must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise FieldError(field, f"must be an integer {span}, got {value}")
    return value


def number(data: dict, field: str, default: Any = None, lo: float | None = None, hi: float | None = None,
           form: bool = False) -> Any:
    """A finite number in [lo, hi], or ``default`` when absent or null."""
    value = data.get(field)
    value = _from_form(value, "float", field) if form else value
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise FieldError(field, f"must be a finite number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise FieldError(field, f"must be between {lo:g} and {hi:g}, got {value:g}")
    return float(value)


def boolean(data: dict, field: str, default: bool, form: bool = False) -> bool:
    """A boolean field."""
    value = data.get(field)
    value = _from_form(value, "bool", field) if form else value
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FieldError(field, f"must be true or false, got {value!r}")
    return value


def string(data: dict, field: str, default: Any = None, max_len: int = MAX_TEXT, allow_empty: bool = False) -> Any:
    """A string field of at most ``max_len`` characters, or ``default`` when absent or null."""
    value = data.get(field)
    if value is None:
        return default
    if not isinstance(value, str):
        raise FieldError(field, f"must be a string, got {type(value).__name__}")
    if len(value) > max_len:
        raise FieldError(field, f"is longer than {max_len} characters ({len(value)})", 422)
    if "\x00" in value:
        raise FieldError(field, "must not contain NUL characters")
    if not allow_empty and not value.strip():
        raise FieldError(field, "is empty")
    return value


def json_field(data: dict, field: str, form: bool = False) -> Any:
    """A field holding a JSON object or list (sent as a JSON string by a form)."""
    value = data.get(field)
    return _from_form(value, "json", field) if form else value


def embedding(value: Any, dim: int, field: str = "embedding") -> list[float]:
    """A list of ``dim`` finite numbers."""
    if not isinstance(value, list) or len(value) != dim:
        got = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        raise FieldError(field, f"must be a list of {dim} numbers (the collection's dimension), got {got}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise FieldError(field, f"entry {i} must be a finite number, got {v!r}")
    if not any(v != 0 for v in value):
        raise FieldError(field, "must not be all zeros")
    return [float(v) for v in value]


def filter_spec(value: Any, columns: list[str], field: str = "filter") -> dict[str, list]:
    """``{column: value or [values]}`` on metadata columns: rows must match every column."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(field, 'must be an object such as {"label": "cat"} or {"label": ["cat", "dog"]}')
    out: dict[str, list] = {}
    total = 0
    for col, allowed in value.items():
        if col not in columns:
            raise FieldError(f"{field}.{col}", f"is not a metadata column; columns: {', '.join(columns) or '(none)'}")
        values = allowed if isinstance(allowed, list) else [allowed]
        if not values:
            raise FieldError(f"{field}.{col}", "is an empty list")
        for v in values:
            if not (v is None or isinstance(v, (str, int, float, bool))):
                raise FieldError(f"{field}.{col}", f"values must be strings or numbers, got {type(v).__name__}")
            if isinstance(v, str) and len(v) > MAX_TEXT:
                raise FieldError(f"{field}.{col}", f"values must be at most {MAX_TEXT} characters")
        total += len(values)
        if total > MAX_FILTER_VALUES:
            raise FieldError(field, f"has more than {MAX_FILTER_VALUES} values")
        out[col] = values
    return out


def check_fields(data: dict, allowed: set[str], where: str = "") -> None:
    """Reject fields that are not in ``allowed`` (a typo should not be silently ignored)."""
    for key in data:
        if key not in allowed:
            raise FieldError(f"{where}{key}", f"is not a known field; fields: {', '.join(sorted(allowed))}")
