"""Request and response models of the service, with its size limits.

Requests are validated with :meth:`pydantic.BaseModel.model_validate`; what depends on the
collection (its dimension, its metadata columns) comes in the validation ``context``
(``{"dim": ..., "columns": [...]}``). Every failure becomes a :class:`FieldError` naming
one field (:func:`field_error`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic_core import PydanticCustomError

from .._util import TAU_RANGE  # the one τ range of every source
from .errors import FieldError, check_tree, loads, show

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
#: Norms of a query embedding accepted (float32 squares neither overflow nor underflow inside it).
NORM_RANGE = (1e-12, 1e12)
#: Most anchors written in one context, and most characters in one anchor.
MAX_ANCHORS, MAX_ANCHOR_CHARS = 256, 300

Id = Union[int, str]
Scalar = Union[str, int, float, bool, None]


def fail(message: str, field: str | None = None, **values: Any) -> PydanticCustomError:
    """A validation error; ``field`` names a place below the field (``filter.colour``)."""
    return PydanticCustomError("anchordiv", message, {**values, **({"field": field} if field else {})})


# ----------------------------------------------------------------------------- field kinds
def _integer(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail("must be an integer, got {got}", got=show(value))
    return value


def _whole(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail("must be an integer row number, got {got}", got=show(value))
    return value


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail("must be a finite number, got {got}", got=show(value))
    return float(value)


def _boolean(value: Any) -> Any:
    if not isinstance(value, bool):
        raise fail("must be true or false, got {got}", got=show(value))
    return value


def _text(max_len: int, allow_empty: bool = False) -> BeforeValidator:
    def check(value: Any) -> Any:
        if not isinstance(value, str):
            raise fail("must be a string, got {got}", got=type(value).__name__)
        if len(value) > max_len:
            raise fail("is longer than {max} characters ({n})", max=max_len, n=len(value))
        if "\x00" in value:
            raise fail("must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise fail("holds a lone surrogate (position {at}); send valid Unicode text", at=exc.start) from None
        if not allow_empty and not value.strip():
            raise fail("is empty")
        return value

    return BeforeValidator(check)


def _item_id(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise fail("must be an item id (an integer or a string), got {got}", got=show(value))
    return value


def _embedding(value: Any, info: ValidationInfo) -> Any:
    """A list of ``dim`` finite numbers whose norm is in :data:`NORM_RANGE` (exactly, in float32)."""
    dim = (info.context or {}).get("dim")
    if not isinstance(value, list) or (dim is not None and len(value) != dim):
        got = f"{len(value)} values" if isinstance(value, list) else type(value).__name__
        raise fail("must be a list of {dim} numbers (the collection's dimension), got {got}", dim=dim, got=got)
    for i, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            raise fail("entry {i} must be a finite number, got {got}", i=i, got=show(x))
    if not any(x != 0 for x in value):
        raise fail("must not be all zeros")
    arr = np.asarray(value, dtype=np.float64)
    over = np.flatnonzero(np.abs(arr) > np.finfo(np.float32).max)
    if over.size:
        raise fail("entry {i} ({x}) is beyond float32; scale the embedding (the collection's embeddings have "
                   "norm about 1)", i=int(over[0]), x=f"{arr[over[0]]:g}")
    lo, hi = NORM_RANGE
    norm = float(np.linalg.norm(arr.astype(np.float32).astype(np.float64)))  # as the service will see it
    if not lo <= norm <= hi:
        raise fail("has norm {norm}, outside [{lo}, {hi}]; scale it (the collection's embeddings have norm about 1)",
                   norm=f"{norm:.3g}", lo=f"{lo:g}", hi=f"{hi:g}")
    return [float(x) for x in value]


def _filter(value: Any, info: ValidationInfo) -> Any:
    """``{column: value or [values]}`` on metadata columns: rows must match every column."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise fail('must be an object such as {"label": "cat"} or {"label": ["cat", "dog"]}')
    columns = (info.context or {}).get("columns", [])
    out: dict[str, list] = {}
    total = 0
    for col, allowed in value.items():
        where = f"filter.{col}"
        if col not in columns:
            raise fail("is not a metadata column; columns: {columns}", where, columns=", ".join(columns) or "(none)")
        values = allowed if isinstance(allowed, list) else [allowed]
        if not values:
            raise fail("is an empty list", where)
        for x in values:
            if not (x is None or isinstance(x, (str, int, float, bool))):
                raise fail("values must be strings or numbers, got {got}", where, got=type(x).__name__)
            if isinstance(x, str) and len(x) > MAX_TEXT:
                raise fail("values must be at most {max} characters", where, max=MAX_TEXT)
        total += len(values)
        if total > MAX_FILTER_VALUES:
            raise fail("has more than {max} values", max=MAX_FILTER_VALUES)
        out[col] = values
    return out


def _params(value: Any) -> Any:
    if value is not None and not isinstance(value, dict):
        raise fail('must be an object such as {"rank": 8}')
    return value


def _ids(value: Any) -> Any:
    if not isinstance(value, list):
        raise fail("must be a list of ids")
    if len(value) > MAX_IDS:
        raise fail("has more than {max} ids", max=MAX_IDS)
    for x in value:
        _item_id(x)
    return value


def _anchor_texts(value: Any) -> Any:
    """1 to :data:`MAX_ANCHORS` distinct, non-blank anchor phrases of at most :data:`MAX_ANCHOR_CHARS` characters."""
    if not isinstance(value, list):
        raise fail('must be a list of anchor phrases, e.g. ["a photo of a husky", "a photo of a beagle"]')
    if not value or len(value) > MAX_ANCHORS:
        raise fail("must hold 1 to {max} anchors, got {n}", max=MAX_ANCHORS, n=len(value))
    check = _text(MAX_ANCHOR_CHARS).func
    seen: dict[str, int] = {}
    out = []
    for i, text in enumerate(value):
        try:
            text = check(text).strip()
        except PydanticCustomError as exc:
            raise fail("entry {i} " + exc.message_template, f"anchors[{i}]", i=i, **(exc.context or {})) from None
        if text in seen:
            raise fail("entry {i} repeats entry {j} ({text}); write each anchor once (weights sets how much each "
                       "counts)", f"anchors[{i}]", i=i, j=seen[text], text=show(text))
        seen[text] = i
        out.append(text)
    return out


def _weights(value: Any) -> Any:
    if not isinstance(value, list) or len(value) > MAX_ANCHORS:
        raise fail("must be a list of at most {max} numbers, one per anchor", max=MAX_ANCHORS)
    out = [_number(w) for w in value]
    if any(w < 0 for w in out) or not any(w > 0 for w in out):
        raise fail("must be numbers >= 0, not all zero")
    return out


Integer = BeforeValidator(_integer)
Number = BeforeValidator(_number)
Boolean = BeforeValidator(_boolean)


# ----------------------------------------------------------------------------- requests
class Request(BaseModel):
    """A request body: a field that is null is absent."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class SearchRequest(Request):
    """``POST /api/search``: one query (``text``, ``row``, ``id``, ``embedding`` or an uploaded ``image``)
    under one context."""

    model_config = ConfigDict(extra="forbid")

    k: Annotated[int, Field(ge=1, le=MAX_K, description="Neighbours to return."), Integer] = 10
    symmetric: Annotated[bool, Field(description="Rank by the symmetrised divergence."), Boolean] = True
    include_self: Annotated[bool, Field(
        description="Keep the queried item among the results (row and id queries)."), Boolean] = False
    filter: Annotated[dict[str, list[Scalar]], Field(
        description='Metadata to match, e.g. {"place": ["beach", "park"]}; rows must match every column '
                    f"(at most {MAX_FILTER_VALUES} values in all)."), BeforeValidator(_filter)] = {}
    index: Annotated[Optional[str], Field(
        max_length=200, description="A saved index to search (instead of model, context, tau and params)."),
        _text(200)] = None
    model: Annotated[Optional[str], Field(
        max_length=64, description="Geometry, e.g. softmax, gaussian, cosine (default: the default context's)."),
        _text(64)] = None
    context: Annotated[Optional[str], Field(
        max_length=MAX_CONTEXT, description="A context name (softmax:breeds, cosine, index:NAME) or anchor sets "
                                            "for model (breeds:0.7,places:0.3)."),
        _text(MAX_CONTEXT, allow_empty=True)] = None
    tau: Annotated[Optional[float], Field(
        ge=TAU_RANGE[0], le=TAU_RANGE[1], description="Temperature of the geometry (default: the service's)."),
        Number] = None
    params: Annotated[Optional[dict[str, Any]], Field(
        description='Model parameters, e.g. {"rank": 8}; GET /api/contexts lists each geometry\'s.'),
        BeforeValidator(_params)] = None
    text: Annotated[Optional[str], Field(max_length=MAX_TEXT, description="A text query (needs an encoder)."),
                    _text(MAX_TEXT)] = None
    row: Annotated[Optional[int], Field(description="Query by the item at this 0-based row."),
                   BeforeValidator(_whole)] = None
    id: Annotated[Optional[Id], Field(description="Query by the item with this id (the collection's id column)."),
                  BeforeValidator(_item_id)] = None
    embedding: Annotated[Optional[list[float]], Field(description="A query embedding of the collection's dimension."),
                         BeforeValidator(_embedding)] = None

    @model_validator(mode="after")
    def _one_query(self, info: ValidationInfo) -> "SearchRequest":
        given = [f for f in ("text", "row", "id", "embedding") if getattr(self, f) is not None]
        if (info.context or {}).get("image"):
            given.append("image")
        if len(given) != 1:
            got = f" (got {', '.join(given)})" if given else ""
            raise fail("give exactly one of text, row, id, embedding or image{got}", "query", got=got)
        return self

    @property
    def kind(self) -> str:
        """Which query this is: text, row, id or embedding (image: an upload beside the fields)."""
        return next((f for f in ("text", "row", "id", "embedding") if getattr(self, f) is not None), "image")


class ContextRequest(Request):
    """``POST /api/contexts``: a context of anchors written by hand (mixed, optionally, with the file's sets)."""

    model_config = ConfigDict(extra="forbid")

    anchors: Annotated[list[str], Field(
        description=f"The anchor phrases, one per anchor (at most {MAX_ANCHORS}, each at most {MAX_ANCHOR_CHARS} "
                    "characters).", examples=[["a photo of a husky", "a photo of a beagle"]]),
        BeforeValidator(_anchor_texts)]
    weights: Annotated[Optional[list[float]], Field(
        description="A weight per anchor (default: equal)."), BeforeValidator(_weights)] = None
    sets: Annotated[Optional[str], Field(
        max_length=MAX_CONTEXT, description="A mixture with the anchors file's sets, the written anchors being the "
                                            "set 'typed', e.g. typed:0.6,breeds:0.4 (default: typed)."),
        _text(MAX_CONTEXT)] = None
    model: Annotated[Optional[str], Field(
        max_length=64, description="An anchor geometry, e.g. softmax (default: the default context's, else softmax)."),
        _text(64)] = None
    tau: Annotated[Optional[float], Field(
        ge=TAU_RANGE[0], le=TAU_RANGE[1], description="Temperature of the geometry (default: the service's)."),
        Number] = None
    params: Annotated[Optional[dict[str, Any]], Field(
        description='Model parameters, e.g. {"rank": 8}, as in /api/search.'), BeforeValidator(_params)] = None
    symmetric: Annotated[bool, Field(description="Rank by the symmetrised divergence."), Boolean] = True

    @model_validator(mode="after")
    def _one_weight_each(self) -> "ContextRequest":
        if self.weights is not None and len(self.weights) != len(self.anchors):
            raise fail("must hold one weight per anchor ({n}), got {m}", "weights", n=len(self.anchors),
                       m=len(self.weights))
        return self


class ContextStatus(BaseModel):
    """A context's build: ``building`` (with progress), ``ready``, ``failed`` (with the error) or ``stored``
    (a written context not built since the service started)."""

    model_config = ConfigDict(extra="allow")

    context: str = Field(description="The context's name, usable in /api/search, /knn-service and /indices-list.")
    status: Literal["building", "ready", "failed", "stored", "deleted"]
    progress: Optional[float] = Field(None, description="Share of the collection's rows built, in [0, 1].")
    path: Optional[str] = Field(None, description='"scan" (compact features) or "index" (an index backend).')


class KnnRequest(Request):
    """``POST /knn-service`` (clip-retrieval): one of ``text``, ``image`` (base64) or ``embedding_input``."""

    model_config = ConfigDict(extra="ignore")

    indice_name: Annotated[Optional[str], Field(
        max_length=MAX_CONTEXT + 64, description="A context name from /indices-list (default: the default context)."),
        _text(MAX_CONTEXT + 64)] = None
    use_mclip: Annotated[bool, Field(description="Multilingual CLIP: not available here."), Boolean] = False
    image_url: Annotated[Optional[str], Field(description="Not supported: this service fetches nothing.")] = None
    num_images: Annotated[int, Field(ge=1, le=MAX_K, description="Results to return."), Integer] = 40
    num_result_ids: Annotated[Optional[int], Field(ge=1, le=MAX_K, description="Results to search."), Integer] = None
    deduplicate: Annotated[bool, Field(description="Drop results whose embedding repeats."), Boolean] = False
    text: Annotated[Optional[Any], Field(description="A text query.")] = None
    image: Annotated[Optional[str], Field(description=f"A base64 image of at most {MAX_IMAGE_BYTES} bytes.")] = None
    embedding_input: Annotated[Optional[list[float]], Field(
        description="A query embedding of the collection's dimension."), BeforeValidator(_embedding)] = None

    @model_validator(mode="before")
    @classmethod
    def _blank_is_absent(cls, data: Any) -> Any:
        if isinstance(data, dict):
            data = {k: v for k, v in data.items() if not (k in ("text", "image", "image_url") and v == "")}
            if data.get("image_url") is not None:
                raise fail("is not supported: this service fetches nothing; send the image as base64", "image_url")
            image = data.get("image")
            if image is not None and (not isinstance(image, str) or len(image) > 4 * MAX_IMAGE_BYTES // 3 + 8):
                raise fail("must be a base64 string of at most {max} bytes", "image", max=MAX_IMAGE_BYTES)
        return data


class MetadataRequest(Request):
    """``POST /metadata`` (clip-retrieval): the metadata of items by id."""

    model_config = ConfigDict(extra="ignore")

    ids: Annotated[list[Id], Field(description=f"Item ids (at most {MAX_IDS})."), BeforeValidator(_ids)]
    indice_name: Annotated[Optional[str], Field(
        max_length=MAX_CONTEXT + 64, description="A context name (ignored: metadata is the same under every context)."),
        _text(MAX_CONTEXT + 64, allow_empty=True)] = None


# ----------------------------------------------------------------------------- responses
class Why(BaseModel):
    """An anchor the query puts mass on."""

    anchor: str = Field(description="The anchor's phrase.")
    set: Optional[str] = Field(description="The anchor set it belongs to.")
    mass: float = Field(description="p(anchor | query).")


class Item(BaseModel):
    """One item of the collection."""

    id: Id = Field(description="The item's id (its id column's value, else its row).")
    row: int = Field(description="Its 0-based row.")
    text: Optional[str] = Field(description="Its caption, text or image file name.")
    labels: dict[str, Any] = Field(description="Its label columns.")
    metadata: dict[str, Any] = Field(description="Its metadata columns.")
    thumbnail: Optional[str] = Field(description="Absolute url of its thumbnail (image collections).")


class Hit(Item):
    """One result."""

    rank: int = Field(description="1 for the nearest.")
    distance: float = Field(description="The divergence (model.search units).")
    similarity: float = Field(description="A decreasing function of the distance (see GET /api/contexts).")


class SearchResponse(BaseModel):
    """Neighbours of a query under a context."""

    query: dict[str, Any] = Field(description="What was searched: kind, and for items id, row, text, labels.")
    context: dict[str, Any] = Field(description="The context's name, geometry, anchors, tau, params, similarity.")
    k: int
    filter: Optional[dict[str, list[Scalar]]] = Field(description="The filter applied, if any.")
    results: list[Hit]
    why: list[Why] = Field(description="Anchors the query puts the most mass on.")
    took_ms: float


class Health(BaseModel):
    """The service is up."""

    status: Literal["ok"]
    cache: dict[str, Any] = Field(description="Statistics of the context cache.")


class Contexts(BaseModel):
    """Anchor sets, geometries, the default context, context names and the collection."""

    title: str
    collection: dict[str, Any]
    sets: list[dict[str, Any]]
    models: list[dict[str, Any]]
    indexes: list[dict[str, Any]]
    default: dict[str, Any]
    names: list[str]
    written: list[dict[str, Any]] = Field(description="The contexts written by hand (POST /api/contexts).")
    limits: dict[str, int]
    similarity: dict[str, str]


class KnnHit(BaseModel):
    """A clip-retrieval result: id, similarity and the item's metadata fields."""

    model_config = ConfigDict(extra="allow")

    id: Id
    similarity: float


class MetadataEntry(BaseModel):
    """A clip-retrieval metadata entry."""

    id: Id
    metadata: dict[str, Any]


class ErrorBody(BaseModel):
    """An error: one line naming the field, and the field."""

    error: str = Field(description='"FIELD: message".', examples=["k: Input should be less than or equal to 1000"])
    field: Optional[str] = Field(description="The field at fault (null for a failure of the server).")


#: The error responses every endpoint documents.
ERRORS = {"4XX": {"model": ErrorBody, "description": "A bad request; the error names the field."}}


# ----------------------------------------------------------------------------- errors
def field_error(errors: list[dict], allowed: Any = (), status: int = 422) -> FieldError:
    """The first of Pydantic's ``errors`` as a :class:`FieldError` naming its field."""
    errors = sorted(errors, key=lambda e: e.get("type") != "extra_forbidden")
    err = errors[0] if errors else {}
    ctx = err.get("ctx") or {}
    loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "path", "query")]
    field = ctx.get("field") or (loc[0] if loc else None)
    message = str(err.get("msg", "is invalid")).removeprefix("Value error, ")
    if err.get("type") == "extra_forbidden":
        message = f"is not a known field; fields: {', '.join(sorted(allowed))}"
    elif message[:1].isupper() and not message.startswith("NUL"):
        message = message[0].lower() + message[1:]
    return FieldError(field, message, status)


def validated(model: type[BaseModel], data: Any, **context: Any) -> Any:
    """``model`` from ``data``, or the :class:`FieldError` of its first problem."""
    if isinstance(data, model):
        return data
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise field_error(exc.errors(), model.model_fields) from None


#: How form fields of ``POST /api/search`` are read: JSON values, booleans, or strings as sent.
FORM_JSON = ("k", "tau", "row", "embedding", "filter", "params")
FORM_BOOL = ("symmetric", "include_self")


def from_form(data: dict[str, str]) -> dict[str, Any]:
    """A multipart form's fields as the JSON values they stand for (empty fields are absent)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if value in (None, ""):
            continue
        text = value.strip()
        if key in FORM_BOOL:
            if text.lower() not in ("true", "1", "on", "yes", "false", "0", "off", "no", ""):
                raise FieldError(key, f"must be true or false, got {show(value)}")
            out[key] = text.lower() in ("true", "1", "on", "yes")
        elif key in FORM_JSON:
            if text:
                out[key] = loads(text, key)
        else:
            check_tree(value, key)
            out[key] = value
    return out


# ----------------------------------------------------------------------------- model parameters
def model_params(model: str, params: dict | None, dim: int) -> tuple[tuple[str, Any], ...]:
    """``params`` of the geometry ``model`` checked against its declaration
    (:func:`anchordiv.models.model_params`), sorted by name.

    A service also caps what makes a fit costly: a parameter's ``request_max``, and a rank at the
    collection's dimension.
    """
    from ..models import model_params as declared

    if not params:
        return ()
    allowed = declared(model)
    clean = []
    for name, value in (params or {}).items():
        field = f"params.{name}"
        param = allowed.get(name)
        if param is None:
            raise FieldError(field, f"is not a parameter of {model!r} (parameters: {', '.join(allowed) or 'none'})")
        try:
            value = param.check(value, field)
        except ValueError as exc:
            raise FieldError(field, str(exc).removeprefix(f"{field} ").rstrip(".")) from None
        cap = dim if param.kind == "rank" else param.request_max
        if cap is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap \
                and (param.kind != "rank" or isinstance(value, int)):
            raise FieldError(field, f"must be at most {cap:g} on this service, got {value}")
        clean.append((name, value))
    return tuple(sorted(clean))
