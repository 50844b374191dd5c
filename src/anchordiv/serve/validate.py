"""Validation of request fields: every problem is a :class:`FieldError` naming the field."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

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
#: Deepest nesting of a JSON body or field.
MAX_DEPTH = 32
#: Norms of a query embedding accepted (float32 squares neither overflow nor underflow inside it).
NORM_RANGE = (1e-12, 1e12)


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
    """A JSON object from request bytes."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FieldError(field, f"is not valid UTF-8 ({exc})", 400) from None
    data = loads(text, field, 400) if text.strip() else None
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
        raise FieldError(field, f"must be true or false, got {show(value)}")
    if text == "":
        return None
    return loads(text, field)


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
        raise FieldError(field, f"must be an integer, got {show(value)}")
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
        raise FieldError(field, f"must be a finite number, got {show(value)}")
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
        raise FieldError(field, f"must be true or false, got {show(value)}")
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
    check_tree(value, field)
    if not allow_empty and not value.strip():
        raise FieldError(field, "is empty")
    return value


def json_field(data: dict, field: str, form: bool = False) -> Any:
    """A field holding a JSON object or list (sent as a JSON string by a form)."""
    value = data.get(field)
    return _from_form(value, "json", field) if form else value


def embedding(value: Any, dim: int, field: str = "embedding") -> list[float]:
    """A list of ``dim`` finite numbers whose norm is in :data:`NORM_RANGE` (exactly, in float32)."""
    if not isinstance(value, list) or len(value) != dim:
        got = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        raise FieldError(field, f"must be a list of {dim} numbers (the collection's dimension), got {got}")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise FieldError(field, f"entry {i} must be a finite number, got {show(v)}")
    if not any(v != 0 for v in value):
        raise FieldError(field, "must not be all zeros")
    arr = np.asarray(value, dtype=np.float64)
    over = np.flatnonzero(np.abs(arr) > np.finfo(np.float32).max)
    if over.size:
        raise FieldError(field, f"entry {int(over[0])} ({arr[over[0]]:g}) is beyond float32; scale the embedding "
                                "(the collection's embeddings have norm about 1)")
    lo, hi = NORM_RANGE
    norm = float(np.linalg.norm(arr.astype(np.float32).astype(np.float64)))  # as the service will see it
    if not lo <= norm <= hi:
        raise FieldError(field, f"has norm {norm:.3g}, outside [{lo:g}, {hi:g}]; scale it "
                                "(the collection's embeddings have norm about 1)")
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
