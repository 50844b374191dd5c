"""The search service behind ``anchordiv serve``, independent of the web framework.

A *context* is (geometry, anchor selection, τ, model parameters, symmetric). Its fitted
model and an exact :class:`anchordiv.Index` of every collection row (the key features ψ,
ids = row numbers) are built once and kept in a byte-bounded LRU
(:class:`~anchordiv.serve.cache.ByteLRU`); a query then costs one feature map φ(q) and the
exact backend's filtered top-k over ψ (:meth:`anchordiv.Index.search` with ``filter`` and
``exclude``), the same computation as ``model.search``. Saved indexes (``--index``) are
searched with :meth:`anchordiv.Index.search` too. Requests are the Pydantic models of
:mod:`anchordiv.serve.schemas`.

Words of the API:

* ``id``: the item's value in the collection's ``id`` column (the row number when the
  collection has no ``id`` column); ``row``: its 0-based position in the collection.
* a context's *name*: ``MODEL:ANCHORS`` (``softmax:breeds``, ``softmax:breeds:0.7,places:0.3``),
  ``MODEL`` for a geometry without anchors (``cosine``), ``index:NAME`` for a saved index.
  ``/indices-list`` lists such names, and ``/api/search`` and ``/knn-service`` accept them.
* ``similarity`` (higher is closer, a monotone function of the distance d):
  ``cos(q, g) = 1 − d`` for ``cosine``; ``−d = γ*ᵀg`` (the cosine to the query's proxy
  anchor) for ``iti``; ``exp(−d)`` in (0, 1] for the anchor divergences (d ≥ 0).
"""

from __future__ import annotations

import io
import math
import os
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import torch

from .. import anchorsfile
from .._util import check_tau, json_scalar
from ..anchors import AnchorSet
from ..models import make_model, model_names, model_params, registry
from ..diagnostics import explain
from ..index import Index
from . import schemas
from .cache import ByteLRU, storage_nbytes, storages
from .errors import FieldError
from .schemas import KnnRequest, MetadataRequest, SearchRequest, validated

#: Geometries that need anchors / take a temperature.
ANCHOR_MODELS = model_names(needs_anchors=True)
TAU_MODELS = model_names(takes_temperature=True)
#: Columns shown as the item's text, in order of preference.
ITEM_COLUMNS = ("caption", "text", "image_path")
#: Columns never offered as labels.
NOT_LABELS = {"caption", "text", "image_path", "id", "url"}
#: Thumbnail size in pixels.
THUMB_PX = 256
#: ``similarity`` per kind of geometry, as ``GET /api/contexts`` states it.
SIMILARITY = {"cosine": "cos(q, g) = 1 - distance, in [-1, 1]",
              "iti": "-distance = the cosine to the query's proxy anchor, in [-1, 1]",
              "divergence": "exp(-distance), in (0, 1] (softmax, gaussian, gmm, latent_*)"}


def similarity_kind(model: Any) -> str:
    """``"divergence"`` for an anchor model, ``"cosine"`` for cosine, else ``"iti"``."""
    if type(model).tags().anchor_model:
        return "divergence"
    return "cosine" if isinstance(model, registry()["cosine"]) else "iti"


def similarity(kind: str, distance: float) -> float:
    """Similarity from a distance d: exp(−max(d, 0)) for a divergence, 1 − d for cosine, −d for iti."""
    if kind == "divergence":
        return math.exp(-max(distance, 0.0))
    if kind == "cosine":
        return min(1.0, max(-1.0, 1.0 - distance))
    return min(1.0, max(-1.0, -distance))


def anchors_spec(selection: tuple[tuple[str, float], ...]) -> str | None:
    """``breeds`` for one set, ``breeds:0.7,places:0.3`` for several, None for none."""
    if not selection:
        return None
    if len(selection) == 1:
        return selection[0][0]
    return ",".join(f"{n}:{p:g}" for n, p in selection)


@dataclass(frozen=True)
class ContextKey:
    """What defines one cached context."""

    model: str
    selection: tuple[tuple[str, float], ...]
    tau: float | None
    params: tuple[tuple[str, Any], ...]
    symmetric: bool

    @property
    def anchors(self) -> str | None:
        """The canonical anchors spec, e.g. ``breeds`` or ``breeds:0.7,places:0.3``."""
        return anchors_spec(self.selection)

    @property
    def name(self) -> str:
        """``MODEL`` or ``MODEL:ANCHORS`` (the clip-retrieval index name)."""
        return self.model if self.anchors is None else f"{self.model}:{self.anchors}"


@dataclass
class Context:
    """A fitted geometry with an exact index of every collection row (ids are row numbers)."""

    key: ContextKey
    model: Any
    index: Index
    anchors: AnchorSet | None
    anchor_sets: list[str]
    seconds: float

#: Bytes counted per context besides its arrays (the Python objects).
CONTEXT_OVERHEAD = 4096


class Service:
    """Searches one collection under anchor contexts; used by the HTTP app.

    Parameters
    ----------
    collection : anchordiv.io.Collection
        Embeddings and metadata.
    anchors : anchordiv.anchorsfile.EmbeddedAnchors, optional
        The anchor sets (from :func:`anchordiv.anchorsfile.embed_anchors`).
    encoder : Encoder, optional
        Embeds text (and image) queries; without one only row, id and embedding queries work.
    indexes : dict of str to anchordiv.Index, optional
        Saved indexes over the collection (ids = row numbers), searchable by name.
    tau : float, optional
        Default temperature (else the collection's, the anchors', the encoder's).
    default_model : str
        Geometry of the default context.
    default_context : str, optional
        Anchor sets of the default context (``breeds`` or ``breeds:0.7,places:0.3``, at most
        two sets); default: the first set. The default context (``default_model:default_context``)
        answers a request that names no context, and is the page's initial context.
    label_columns : list of str, optional
        Metadata columns shown as label chips (default: ``label``, else the columns with
        at most 50 distinct values).
    cache_bytes : int
        Bound of the context cache (fitted models and key features).
    title : str, optional
        Shown on the page.
    root : str or Path, optional
        Folder that relative ``image_path`` values are resolved against (default: the
        collection's folder; never the working directory).
    """

    def __init__(self, collection: Any, anchors: Any = None, encoder: Any = None, *, indexes: dict | None = None,
                 tau: float | None = None, default_model: str = "softmax", default_context: str | None = None,
                 label_columns: list[str] | None = None, cache_bytes: int = 1 << 30, title: str | None = None,
                 root: str | os.PathLike | None = None):
        self.collection = collection
        self.anchors = anchors
        self.encoder = encoder
        self.indexes = dict(indexes or {})
        self.n, self.dim = len(collection), collection.dim
        self.G = torch.from_numpy(np.ascontiguousarray(collection.embeddings, dtype=np.float32))
        self.meta = collection.metadata
        self.columns = [] if self.meta is None else [str(c) for c in self.meta.columns]
        self._values = {c: self.meta[c].tolist() for c in self.columns} if self.meta is not None else {}
        self._ids = ([json_scalar(x) for x in self._values["id"]] if "id" in self.columns
                     else list(range(self.n)))
        self.item_column = getattr(collection, "item_column", None) or next(
            (c for c in ITEM_COLUMNS if c in self.columns), None)
        self.has_images = collection.kind == "image" and "image_path" in self.columns
        self.label_columns = self._labels(label_columns)
        self.title = title or f"anchordiv · {os.path.basename(str(collection.path or 'collection'))}"
        self.root = Path(root) if root is not None else getattr(collection, "folder", None)
        if default_model not in registry():
            raise ValueError(f"default_model: unknown geometry {default_model!r}")
        if default_model in ANCHOR_MODELS and anchors is None:
            default_model = "cosine"
        self.default_model = default_model
        self.tau = tau if tau is not None else (collection.tau if collection.tau is not None else
                                                getattr(anchors, "tau", None))
        if self.tau is None and encoder is not None:
            self.tau = float(encoder.tau)
        if self.tau is not None:  # the manifest's, the anchors' or the encoder's: one range for every source
            self.tau = check_tau(self.tau, "the service's tau (from --tau, the collection's manifest or the encoder)")
        if anchors is not None and next(iter(anchors.sets.values())).dim != self.dim:
            raise ValueError(f"the anchors have dimension {next(iter(anchors.sets.values())).dim} but the "
                             f"collection has {self.dim}; embed them with the collection's encoder")
        for name, idx in self.indexes.items():
            if idx.dim != self.dim or (len(idx) and (int(np.min(idx.ids)) < 0 or int(np.max(idx.ids)) >= self.n)):
                raise ValueError(f"index {name!r} does not match the collection (its ids must be row numbers "
                                 f"0..{self.n - 1} and its dimension {self.dim})")
        self.contexts = ByteLRU(cache_bytes)
        self._held = storages(self.G, self.anchors)  # alive for the service's lifetime: not charged to a context
        self._thumbs = ByteLRU(64 << 20)
        self._texts = ByteLRU(16 << 20)
        self._filters = ByteLRU(64 << 20)
        self._encode_lock = threading.Lock()  # tokenizers are not safe under concurrent calls
        self._image_queries: bool | None = None
        self._id_rows: dict[str, list[int]] | None = None
        self.default_anchors = None
        if anchors is not None:
            try:
                sel = self._selection(default_context or next(iter(anchors.sets)))
            except FieldError as exc:
                raise ValueError(f"default_context: {exc.message}") from None
            if len(sel) > 2:
                raise ValueError(f"default_context: {default_context!r} mixes {len(sel)} sets; the page mixes at "
                                 "most two, so give one or two sets")
            self.default_anchors = anchors_spec(sel)
        elif default_context:
            raise ValueError("default_context: the service has no anchors")
        try:
            self.default_key = self.context_key(default_model)
        except FieldError as exc:
            raise ValueError(str(exc)) from None

    # ------------------------------------------------------------------ info
    def _labels(self, given: list[str] | None) -> list[str]:
        if given is not None:
            missing = [c for c in given if c not in self.columns]
            if missing:
                raise ValueError(f"label column {missing[0]!r} is not in the collection; columns: {self.columns}")
            return list(given)
        if "label" in self.columns:
            return ["label"]
        out = []
        for c in self.columns:
            if c in NOT_LABELS or c == self.item_column:
                continue
            values = self._values[c]
            if len(set(map(str, values))) <= min(50, max(1, len(values) // 2)):
                out.append(c)
        return out

    @property
    def text_queries(self) -> bool:
        return self.encoder is not None

    @property
    def image_queries(self) -> bool:
        if self.encoder is None:
            return False
        if self._image_queries is None:
            with self._encode_lock:  # a lazy encoder loads here: once, and not while another thread encodes
                self._image_queries = bool(getattr(self.encoder, "has_images", False))
        return self._image_queries

    def warm_up(self) -> None:
        """Load a lazy encoder now (e.g. in a background thread while the server starts); a failure
        is left for the first query to report."""
        try:
            _ = self.image_queries
        except Exception:
            pass

    def set_names(self) -> list[str]:
        return [] if self.anchors is None else list(self.anchors.sets)

    def indices_list(self) -> list[str]:
        """Context names (clip-retrieval's index names): the default context first, then ``cosine``,
        ``MODEL:SET`` for every anchor model and set, and ``index:NAME`` for every saved index."""
        names = [m for m in registry() if m not in ANCHOR_MODELS]
        for m in registry():
            if m in ANCHOR_MODELS:
                names += [f"{m}:{s}" for s in self.set_names()]
        names += [f"index:{n}" for n in self.indexes]
        default = self.default_key.name
        return [default] + [n for n in names if n != default]

    def info(self) -> dict:
        """What ``GET /api/contexts`` returns."""
        sets = []
        if self.anchors is not None:
            for name, s in self.anchors.sets.items():
                texts = list(s.texts or [])
                sets.append({"name": name, "size": len(s), "mix": float(self.anchors.mix.get(name, 1.0)),
                             "phrases": texts[:100]})
        models = []
        for name, cls in registry().items():
            params: dict[str, Any] = {}
            if name in TAU_MODELS:
                params["tau"] = self.tau
            params.update({p.name: p.default for p in model_params(name).values()})
            models.append({"name": name, "needs_anchors": name in ANCHOR_MODELS,
                           "takes_temperature": name in TAU_MODELS, "params": params,
                           "available": name not in ANCHOR_MODELS or self.anchors is not None})
        labels = {c: sorted({str(x) for x in self._values[c]})[:100] for c in self.label_columns}
        return {
            "title": self.title,
            "collection": {"n": self.n, "dim": self.dim, "kind": self.collection.kind,
                           "encoder": getattr(self.encoder, "name", None) or self.collection.encoder,
                           "tau": self.tau, "columns": self.columns, "item_column": self.item_column,
                           "label_columns": self.label_columns, "labels": labels, "has_images": self.has_images,
                           "text_queries": self.text_queries, "image_queries": self.image_queries},
            "sets": sets,
            "models": models,
            "indexes": [{"name": n, "backend": i.backend, "model": type(i.model).__name__, "n": len(i)}
                        for n, i in self.indexes.items()],
            "default": {"name": self.default_key.name, "model": self.default_key.model,
                        "anchors": self.default_key.anchors, "tau": self.tau, "k": 12},
            "names": self.indices_list(),
            "limits": {"max_k": schemas.MAX_K, "max_text": schemas.MAX_TEXT, "max_context": schemas.MAX_CONTEXT,
                       "max_image_bytes": schemas.MAX_IMAGE_BYTES},
            "similarity": dict(SIMILARITY),
        }

    # -------------------------------------------------------------- contexts
    def _selection(self, context: str | None) -> tuple[tuple[str, float], ...]:
        """The canonical selection: sets with positive proportions, summing to 1."""
        if self.anchors is None:
            raise FieldError("model", "this geometry needs anchors, but the service has none (start it with --anchors)")
        try:
            sel = None if context is None or not context.strip() else anchorsfile._parse_selection(context, "context")
            names, props = anchorsfile._select(list(self.anchors.sets), self.anchors.mix, sel, "context",
                                               self.anchors.path)
        except ValueError as exc:
            raise FieldError("context", str(exc).removeprefix("context: ")) from None
        if not all(math.isfinite(p) for p in props):
            raise FieldError("context", f"proportions must be finite numbers >= 0, got {', '.join(map(str, props))}")
        top = max(props)
        if not top > 0:
            raise FieldError("context", "proportions are all zero; give at least one set positive mass")
        scaled = [p / top for p in props]  # in [0, 1]: the sum cannot overflow
        total = math.fsum(scaled)
        rounded = [(n, round(p / total, 6)) for n, p in zip(names, scaled)]
        return tuple((n, p) for n, p in rounded if p > 0)

    def parse_context(self, context: str | None,
                      model: str | None = None) -> tuple[str | None, str | None, str | None]:
        """``(model, anchors, index)`` of a request's ``context`` and ``model`` fields.

        ``context`` is a context name (``MODEL``, ``MODEL:ANCHORS``, ``index:NAME``: what
        ``/indices-list`` gives), or anchor sets alone (``breeds:0.7,places:0.3``) for the
        geometry ``model``. Without a context: the default context, or ``model`` with the
        default context's anchors.
        """
        sets = set(self.set_names())
        text = (context or "").strip()
        head, colon, rest = text.partition(":")
        if text and head not in sets and (head in registry() or head == "index"):
            if head == "index":
                if model is not None:
                    raise FieldError("model", f"cannot be combined with the context {context!r} "
                                              "(the index holds its model)")
                if not rest.strip():
                    raise FieldError("context", "'index:' names no index; write index:NAME")
                return None, None, rest
            if model is not None and model != head:
                raise FieldError("model", f"{model!r} contradicts the context {context!r}, which names the "
                                          f"geometry {head!r}; give the geometry once")
            if head in ANCHOR_MODELS and not rest.strip():
                raise FieldError("context", f"{context!r} names no anchors; write {head}:SETS, "
                                            f"e.g. {head}:{self.default_anchors or 'SET'}")
            if head not in ANCHOR_MODELS and colon:
                raise FieldError("context", f"the geometry {head!r} takes no anchors; write {head!r}")
            return head, rest or None, None
        if model is None:
            model = self.default_model if text else self.default_key.model
        if text and model in registry() and model not in ANCHOR_MODELS:
            raise FieldError("context", f"the geometry {model!r} takes no anchors; leave context out, "
                                        f"or name another geometry")
        return model, (text or self.default_anchors) if model in ANCHOR_MODELS else None, None

    def context_key(self, model: str | None = None, context: str | None = None, tau: float | None = None,
                    params: dict | None = None, symmetric: bool = True) -> ContextKey:
        """Validate and canonicalize a context (``context`` as in :meth:`parse_context`, not an index)."""
        model, context, index = self.parse_context(context, model)
        if index is not None:
            raise FieldError("context", f"index:{index} is an index, not a geometry")
        if model not in registry():
            raise FieldError("model", f"unknown geometry {model!r}; choose from {', '.join(registry())}")
        selection = self._selection(context) if model in ANCHOR_MODELS else ()
        t = None
        if model in TAU_MODELS:
            t = tau if tau is not None else self.tau
            if t is None:
                raise FieldError("tau", f"geometry {model!r} needs a temperature and the service knows none")
        clean = schemas.model_params(model, params, self.dim)
        return ContextKey(model, selection, None if t is None else float(t), clean, bool(symmetric))

    def context(self, key: ContextKey) -> Context:
        """The cached context for ``key`` (fitted and featurized once)."""
        return self.contexts.get_or_build(key, lambda: self._build(key))

    def _build(self, key: ContextKey) -> tuple[Context, int]:
        start = time.perf_counter()
        anchors, owners = None, []
        if key.selection:
            sets = [self.anchors.sets[n] for n, _ in key.selection]
            anchors = sets[0] if len(sets) == 1 else AnchorSet.mixture(sets, [p for _, p in key.selection])
            owners = [n for n, _ in key.selection for _ in range(len(self.anchors.sets[n]))]
        params = dict(key.params)
        if key.tau is not None:
            params["tau"] = key.tau
        try:
            model = make_model(key.model, **params).fit(anchors)
        except ValueError as exc:
            raise FieldError("params" if key.params else "model", f"cannot fit {key.name}: {exc}") from None
        index = Index(model, "exact", symmetric=key.symmetric).add(self.G)
        if self.n > 1:  # the index builds its id lookups on a first filtered search: here, once, before it is shared
            index.search(self.G[:1].numpy(), k=1, exclude=np.zeros((1, 1), dtype=np.int64), filter=np.arange(2))
        ctx = Context(key, model, index, anchors, owners, time.perf_counter() - start)
        return ctx, self.context_nbytes(ctx)

    def context_nbytes(self, ctx: Context) -> int:
        """What a context costs the cache: the storages it keeps alive (views count their whole buffer)."""
        return storage_nbytes(ctx, held=self._held) + CONTEXT_OVERHEAD

    # ---------------------------------------------------------------- queries
    def _encoder_for(self, field: str, images: bool = False) -> Any:
        if self.encoder is None:
            raise FieldError(field, "this service has no encoder (start it with --encoder); query by row or id")
        if images and not self.image_queries:
            raise FieldError(field, f"the encoder {getattr(self.encoder, 'name', '')!r} has no image tower; "
                                    "query by text, row or id")
        return self.encoder

    def _checked(self, vec: Any, field: str) -> np.ndarray:
        vec = np.asarray(vec, dtype=np.float32).reshape(-1)
        if vec.shape[0] != self.dim:
            raise FieldError(field, f"the encoder gives dimension {vec.shape[0]} but the collection has {self.dim}")
        return vec

    def embed_text(self, text: str) -> np.ndarray:
        """A text query's embedding (cached)."""
        enc = self._encoder_for("text")

        def build():
            with self._encode_lock:
                vec = self._checked(enc.encode_text([text])[0], "text")
            return vec, vec.nbytes + len(text)

        return self._texts.get_or_build(text, build)

    def embed_image(self, data: bytes) -> np.ndarray:
        """An uploaded image's embedding."""
        enc = self._encoder_for("image", images=True)
        if len(data) > schemas.MAX_IMAGE_BYTES:
            raise FieldError("image", f"is larger than {schemas.MAX_IMAGE_BYTES} bytes", 413)
        from PIL import Image

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(data)) as f:
                    f.load()
                    im = f.convert("RGB")
        except Exception:
            raise FieldError("image", "is not a readable image file") from None
        with self._encode_lock:
            return self._checked(enc.encode_images([im])[0], "image")

    def item_id(self, row: int) -> Any:
        """The id of row ``row``: its ``id`` column value, or the row number without that column."""
        return self._ids[row]

    def find_row(self, value: Any, field: str = "id") -> int:
        """The row of the item whose id is ``value`` (an int or a string; ``"15"`` finds id 15)."""
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise FieldError(field, f"must be an item id (an integer or a string), got {value!r}")
        if self._id_rows is None:
            table: dict[str, list[int]] = {}
            for r, x in enumerate(self._ids):
                table.setdefault(str(x), []).append(r)
            self._id_rows = table
        rows = self._id_rows.get(str(value), [])
        if not rows:
            where = ("the collection's 'id' column" if "id" in self.columns else
                     f"this collection (it has no 'id' column, so ids are row numbers 0..{self.n - 1})")
            raise FieldError(field, f"no item has id {value!r} in {where}; to give a row number, use row", 404)
        if len(rows) > 1:
            raise FieldError(field, f"id {value!r} appears {len(rows)} times in the 'id' column (rows "
                                    f"{rows[:5]}); query one of them by row")
        return rows[0]

    def check_row(self, row: Any, field: str = "row") -> int:
        if isinstance(row, bool) or not isinstance(row, int):
            raise FieldError(field, f"must be an integer row number, got {row!r}")
        if not 0 <= row < self.n:
            raise FieldError(field, f"row {row} is out of range; the collection has {self.n} rows (0..{self.n - 1})",
                             404)
        return row

    def _query(self, req: SearchRequest, image: bytes | None) -> tuple[np.ndarray, dict, int | None]:
        kind = req.kind
        if kind == "text":
            return self.embed_text(req.text), {"kind": "text", "text": req.text}, None
        if kind == "image":
            return self.embed_image(image), {"kind": "image"}, None
        if kind == "embedding":
            return np.asarray(req.embedding, dtype=np.float32), {"kind": "embedding"}, None
        row = self.check_row(req.row) if kind == "row" else self.find_row(req.id)
        info = {"kind": kind, "id": self.item_id(row), "row": row, "text": self.item_text(row),
                "labels": self.labels_of(row)}
        return self.G[row].numpy().copy(), info, row

    # ----------------------------------------------------------------- items
    def item_text(self, row: int) -> str | None:
        if self.item_column is None:
            return None
        value = self._values[self.item_column][row]
        return None if value is None else (os.path.basename(str(value)) if self.item_column == "image_path"
                                           else str(value))

    def labels_of(self, row: int) -> dict:
        return {c: json_scalar(self._values[c][row]) for c in self.label_columns}

    def thumb_url(self, row: int, base: str = "") -> str | None:
        """``BASE/api/thumb/ID`` of an image row (absolute when the request's ``base`` url is known)."""
        return f"{base.rstrip('/')}/api/thumb/{quote(str(self.item_id(row)), safe='')}" if self.has_images else None

    def item(self, row: int, base: str = "") -> dict:
        """What ``GET /api/items/{id}`` returns."""
        return {"id": self.item_id(row), "row": row, "text": self.item_text(row), "labels": self.labels_of(row),
                "metadata": {c: json_scalar(self._values[c][row]) for c in self.columns if c != "image_path"},
                "thumbnail": self.thumb_url(row, base)}

    def _image_file(self, row: int) -> Path | None:
        raw = self._values["image_path"][row]
        if not isinstance(raw, str) or not raw:
            return None
        p = Path(raw)
        if p.is_absolute():
            return p
        return None if self.root is None else self.root / p

    def thumbnail(self, row: int) -> bytes:
        """JPEG thumbnail of row ``row``'s own image file (the only files ever opened)."""
        from ..report.images import Skip, thumbnail

        if not self.has_images:
            raise FieldError("id", "this collection holds no images", 404)
        row = self.check_row(row, "row")
        item = self.item_id(row)

        def build():
            path = self._image_file(row)
            if path is None:
                raise FieldError("id", f"item {item!r} has no image file", 404)
            try:
                im = thumbnail(os.fspath(path), THUMB_PX)
            except Skip as exc:
                raise FieldError("id", f"the image of item {item!r} cannot be shown ({exc.reason})", 404) from None
            buf = io.BytesIO()
            im.save(buf, format="JPEG", quality=85)
            return buf.getvalue(), len(buf.getvalue())

        return self._thumbs.get_or_build(row, build)

    # ---------------------------------------------------------------- search
    def _filter_rows(self, spec: dict[str, list]) -> np.ndarray | None:
        if not spec:
            return None

        def build():
            mask = np.ones(self.n, dtype=bool)
            for col, values in spec.items():
                mask &= self.meta[col].isin(values).to_numpy()
            rows = np.flatnonzero(mask)
            return rows, rows.nbytes + 64

        key = tuple((c, tuple(map(repr, vals))) for c, vals in sorted(spec.items()))
        return self._filters.get_or_build(key, build)

    def _knn(self, ctx: Context, q: np.ndarray, k: int, own: int | None,
             rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows of the collection (or of the sorted ``rows``) for one query, ``own`` left out."""
        left = self.n if rows is None else len(rows)
        if own is not None:
            pos = own if rows is None else int(np.searchsorted(rows, own))
            left -= rows is None or (pos < len(rows) and rows[pos] == own)
        k = min(k, left)
        if k <= 0:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        d, i = ctx.index.search(q[None], k=k, exclude=None if own is None else np.array([[own]]), filter=rows)
        return np.asarray(d[0]), i[0]

    def _index_search(self, name: str, q: np.ndarray, k: int, own: int | None,
                      rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        idx = self.indexes[name]
        if rows is not None:  # a filter: exact search of the matching rows with the index's model
            keep = rows if own is None else rows[rows != own]
            k = min(k, len(keep))
            if k <= 0:
                return np.zeros(0), np.zeros(0, dtype=np.int64)
            d, i = idx.model.search(q[None], self.G[torch.from_numpy(keep)].numpy(), k=k, symmetric=idx.symmetric)
            return np.asarray(d[0]), keep[np.asarray(i[0])]
        k = min(k, len(idx) - (own is not None))
        d, ids = idx.search(q[None], k=k, exclude=None if own is None else np.array([[own]]))
        keep = ids[0] >= 0
        return np.asarray(d[0])[keep], ids[0][keep]

    def why(self, ctx: Context, q: np.ndarray, top: int = 3) -> list[dict]:
        """The anchors the query puts the most mass on: p(i | q) ∝ wᵢ exp(qᵀγᵢ / τ)."""
        A = ctx.anchors
        if A is None or not A.texts:
            return []
        found = explain(A, q, ctx.key.tau or self.tau or 1.0, top=top)
        return [{"anchor": A.texts[i], "set": ctx.anchor_sets[i] if ctx.anchor_sets else None, "mass": float(m)}
                for i, m in zip(found.top_indices[0].tolist(), found.top_probabilities[0].tolist())]

    def hit(self, rank: int, row: int, dist: float, kind: str, base: str = "") -> dict:
        """One result: ``similarity`` from ``dist`` as :func:`similarity` defines it for ``kind``."""
        out = self.item(row, base)
        return {"rank": rank, "id": out.pop("id"), "row": out.pop("row"), "distance": float(dist),
                "similarity": similarity(kind, float(dist)), **out}

    def request(self, model: type, data: Any, **context: Any) -> Any:
        """``data`` validated as the request ``model`` against this collection (its dimension and columns)."""
        return validated(model, data, dim=self.dim, columns=self.columns, **context)

    def _target(self, req: SearchRequest) -> tuple[ContextKey | None, str | None]:
        """The context key of a search, or the name of the saved index it searches."""
        index, context = req.index, req.context
        if index is not None:
            for f in ("model", "context", "tau", "params"):
                if getattr(req, f) is not None:
                    raise FieldError(f, "cannot be combined with index (the index holds its model)")
        else:
            model, context, index = self.parse_context(context, req.model)
            if index is not None:
                for f in ("tau", "params"):
                    if getattr(req, f) is not None:
                        raise FieldError(f, f"cannot be combined with the context index:{index} "
                                            "(the index holds its model)")
        field = "index" if req.index is not None else "context"
        if index is not None:
            if index not in self.indexes:
                raise FieldError(field, f"unknown index {index!r}; indexes: {', '.join(self.indexes) or '(none)'}")
            return None, index
        return self.context_key(model, context, req.tau, req.params, req.symmetric), None

    def search(self, data: Any, image: bytes | None = None, base: str = "") -> dict:
        """``POST /api/search``: the neighbours of a :class:`SearchRequest` (or its dict), urls under ``base``."""
        start = time.perf_counter()
        req = self.request(SearchRequest, data, image=image is not None)
        key, index = self._target(req)
        q, qinfo, own = self._query(req, image)
        own = None if req.include_self else own
        rows = self._filter_rows(req.filter)
        if index is not None:
            d, i = self._index_search(index, q, req.k, own, rows)
            ctx_info = {"name": f"index:{index}", "index": index, "backend": self.indexes[index].backend}
            kind = similarity_kind(self.indexes[index].model)
            why: list = []
        else:
            ctx = self.context(key)
            d, i = self._knn(ctx, q, req.k, own, rows)
            ctx_info = {"name": key.name, "model": key.model, "anchors": key.anchors, "tau": key.tau,
                        "params": dict(key.params), "symmetric": key.symmetric,
                        "n_anchors": 0 if ctx.anchors is None else len(ctx.anchors)}
            kind = similarity_kind(ctx.model)
            why = self.why(ctx, q)
        ctx_info["similarity"] = SIMILARITY[kind]
        results = [self.hit(r + 1, int(row), dist, kind, base)
                   for r, (dist, row) in enumerate(zip(d.tolist(), i.tolist()))]
        return {"query": qinfo, "context": ctx_info, "k": req.k, "filter": req.filter or None, "results": results,
                "why": why, "took_ms": round(1000 * (time.perf_counter() - start), 3)}

    # ------------------------------------------------------ clip-retrieval
    def knn_service(self, data: Any, base: str = "") -> list[dict]:
        """``POST /knn-service`` in clip-retrieval's shape: a list of ``{id, similarity, **metadata}``.

        ``indice_name`` is a context name from ``/indices-list`` (default: the default context).
        """
        req = self.request(KnnRequest, data)
        if req.use_mclip:
            raise FieldError("use_mclip", "multilingual CLIP is not available here")
        num = req.num_images
        num_ids = req.num_result_ids if req.num_result_ids is not None else num
        query: dict[str, Any] = {"k": min(max(num, num_ids), schemas.MAX_K),
                                 "context": self.default_key.name if req.indice_name is None else req.indice_name}
        image = None
        if req.text is not None:
            query["text"] = req.text
        elif req.image is not None:
            import base64
            import binascii

            try:
                image = base64.b64decode(req.image, validate=True)
            except (binascii.Error, ValueError):
                raise FieldError("image", "is not valid base64") from None
        elif req.embedding_input is not None:
            query["embedding"] = req.embedding_input
        else:
            raise FieldError("text", "give one of text, image or embedding_input")
        try:
            res = self.search(query, image=image, base=base)
        except FieldError as exc:
            field = {"context": "indice_name", "model": "indice_name", "index": "indice_name",
                     "k": "num_images", "embedding": "embedding_input"}.get(exc.field, exc.field)
            raise FieldError(field, exc.message, exc.status) from None
        out, seen = [], set()
        for hit in res["results"]:
            if req.deduplicate:
                digest = self.G[hit["row"]].numpy().tobytes()
                if digest in seen:
                    continue
                seen.add(digest)
            meta = self.clip_metadata(hit["row"], base)
            out.append({**meta, "id": hit["id"], "similarity": hit["similarity"]})
        return out[:num]

    def clip_metadata(self, row: int, base: str = "") -> dict:
        """A row's metadata fields as clip-retrieval returns them (``caption``, ``image_path``, ``url``, labels...)."""
        meta = {c: json_scalar(self._values[c][row]) for c in self.columns}
        if self.item_column in ("text",) and "caption" not in meta:
            meta["caption"] = meta[self.item_column]
        if self.has_images:
            meta["image_path"] = self.item_text(row)  # the file name only, never the server's path
            meta["url"] = self.thumb_url(row, base)
        return meta

    def metadata(self, data: Any, base: str = "") -> list[dict]:
        """``POST /metadata``: ``[{"id": id, "metadata": {...}}]`` for the given item ids."""
        req = self.request(MetadataRequest, data)
        out = []
        for i in req.ids:
            row = self.find_row(i, "ids")
            meta = self.clip_metadata(row, base)
            if self.has_images:
                import base64

                try:
                    meta["image"] = base64.b64encode(self.thumbnail(row)).decode("ascii")
                except FieldError:
                    pass
            out.append({"id": self.item_id(row), "metadata": meta})
        return out
