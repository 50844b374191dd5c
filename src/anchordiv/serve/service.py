"""The search service behind ``anchordiv serve``, independent of the web framework.

A *context* is (geometry, anchor selection, τ, model parameters, symmetric), with anchors
from the anchors file's sets or written by hand (``POST /api/contexts``;
:mod:`anchordiv.serve.contexts`). Its fitted model and the key features ψ of every
collection row are built once, in the background, by the context engine
(:class:`anchordiv.contexts.ContextRegistry` over the collection's memory-mapped rows) and
kept within a byte bound; a query then costs one feature map φ(q) and an exact scan of ψ
(:meth:`anchordiv.contexts.FeatureStore.search` with ``allow`` and ``exclude``), the same
result as ``model.search``. A search of a context still building waits ``build_wait``
seconds, then answers 503 with the build's progress. Saved indexes (``--index``) are
searched with :meth:`anchordiv.Index.search`. Requests are the Pydantic models of
:mod:`anchordiv.serve.schemas`.

Words of the API:

* ``id``: the item's value in the collection's ``id`` column (the row number when the
  collection has no ``id`` column); ``row``: its 0-based position in the collection.
* a context's *name*: ``MODEL:ANCHORS`` (``softmax:breeds``, ``softmax:breeds:0.7,places:0.3``),
  ``MODEL`` for a geometry without anchors (``cosine``), ``index:NAME`` for a saved index,
  ``typed:DIGEST`` for anchors written by hand.
  ``/indices-list`` lists such names, and ``/api/search`` and ``/knn-service`` accept them.
* ``similarity`` (higher is closer, a monotone function of the distance d):
  ``cos(q, g) = 1 − d`` for ``cosine``; ``−d = γ*ᵀg`` (the cosine to the query's proxy
  anchor) for ``iti``; ``exp(−d)`` in (0, 1] for the anchor divergences (d ≥ 0).
"""

from __future__ import annotations

import io
import logging
import math
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from .. import anchorsfile
from .._util import check_tau, json_scalar
from ..anchors import AnchorSet
from ..contexts import ContextLimit, ContextRegistry, LiveContext
from ..contexts.cluster import ContextLost, PartsMissing, shard_files
from ..diagnostics import explain
from ..io.mapped import as_rows
from ..models import make_model, model_names, model_params, registry
from . import schemas
from .cache import ByteLRU, storage_nbytes, storages
from .contexts import TYPED, TYPED_PREFIX, ContextKey, WrittenContexts, anchors_spec
from .errors import FieldError
from .clip import ClipRetrieval
from .schemas import ContextRequest, SearchRequest, validated

#: Geometries that need anchors / take a temperature.
LOG = logging.getLogger("anchordiv.serve")
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
    """How the geometry's distances read as similarities, as its class declares (``Tags.similarity``)."""
    kind = type(model).tags().similarity
    return kind if kind in SIMILARITY else "divergence"


def similarity(kind: str, distance: float) -> float:
    """Similarity from a distance d: exp(−max(d, 0)) for a divergence, 1 − d for cosine, −d for iti."""
    if kind == "divergence":
        return math.exp(-max(distance, 0.0))
    if kind == "cosine":
        return min(1.0, max(-1.0, 1.0 - distance))
    return min(1.0, max(-1.0, -distance))


#: Bytes counted per context besides its arrays (the Python objects).
CONTEXT_OVERHEAD = 4096
#: Seconds a search waits for its context's build before answering with the progress.
BUILD_WAIT = 5.0


class Service(ClipRetrieval):
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
    max_contexts : int
        Most contexts held at once, and most contexts written by hand kept.
    state : str or Path, optional
        Folder where the contexts written by hand are kept (``contexts.json``), to be known
        again after a restart; None keeps them in memory only.
    build_wait : float
        Seconds a search waits for its context's build before answering 503 with the progress.
    client : distributed.Client, optional
        Build and keep the contexts on this Dask cluster (each worker maps its shards; a query is
        answered by every worker and merged exactly); the collection must be memory-mapped shard files.
    title : str, optional
        Shown on the page.
    root : str or Path, optional
        Folder that relative ``image_path`` values are resolved against (default: the
        collection's folder; never the working directory).
    """

    def __init__(self, collection: Any, anchors: Any = None, encoder: Any = None, *, indexes: dict | None = None,
                 tau: float | None = None, default_model: str = "softmax", default_context: str | None = None,
                 label_columns: list[str] | None = None, cache_bytes: int = 1 << 30, max_contexts: int = 32,
                 state: str | os.PathLike | None = None, build_wait: float = BUILD_WAIT, title: str | None = None,
                 root: str | os.PathLike | None = None, client: Any = None):
        self.collection = collection
        self.anchors = anchors
        self.encoder = encoder
        self.indexes = dict(indexes or {})
        self.n, self.dim = len(collection), collection.dim
        self.rows = as_rows(collection.embeddings)  # memory-mapped shards stay on disk
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
        self._held = storages(self.rows, self.anchors)  # alive for the service's lifetime: not charged to a context
        if client is not None:
            shard_files(self.rows)  # every worker maps the shards itself: they must be files
        self.contexts = ContextRegistry(self.rows, max_bytes=cache_bytes, max_contexts=max_contexts,
                                        size=self.context_nbytes, client=client)
        self.written = WrittenContexts(state, getattr(encoder, "name", None) or collection.encoder, max_contexts)
        self.build_wait = float(build_wait)
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
        names += self.written.names()
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
            "written": [{"context": n, **k.spec()} for n, k in self.written.keys.items()],
            "limits": {"max_k": schemas.MAX_K, "max_text": schemas.MAX_TEXT, "max_context": schemas.MAX_CONTEXT,
                       "max_image_bytes": schemas.MAX_IMAGE_BYTES, "max_anchors": schemas.MAX_ANCHORS,
                       "max_anchor_chars": schemas.MAX_ANCHOR_CHARS, "max_contexts": self.contexts.max_contexts},
            "similarity": dict(SIMILARITY),
        }

    # -------------------------------------------------------------- contexts
    def _selection(self, context: str | None, written: bool = False) -> tuple[tuple[str, float], ...]:
        """The canonical selection: sets with positive proportions, summing to 1; with ``written``, the
        set ``typed`` (the written anchors) may be among them (field ``sets``)."""
        field = "sets" if written else "context"
        if self.anchors is None and not written:
            raise FieldError("model", "this geometry needs anchors, but the service has none (start it with "
                                      "--anchors, or write anchors with POST /api/contexts)")
        sets = [] if self.anchors is None else list(self.anchors.sets)
        mix = {} if self.anchors is None else dict(self.anchors.mix)
        if written:
            sets, mix = sets + [TYPED], {**mix, TYPED: 1.0}
        path = self.anchors.path if self.anchors is not None else "the written anchors"
        try:
            sel = None if context is None or not context.strip() else anchorsfile.parse_selection(context, field)
            names, props = anchorsfile.select_sets(sets, mix, sel, field, path)
        except ValueError as exc:
            raise FieldError(field, str(exc).removeprefix(f"{field}: ")) from None
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

    def context(self, key: ContextKey, wait: float | None = None) -> LiveContext:
        """The built context of ``key``, its build started (in the background) when new; a build that
        has not ended after ``wait`` seconds (default ``build_wait``) is a 503 naming its progress."""
        try:
            ctx = self.contexts.start(key, lambda: self._fit(key), name=key.name)
        except ContextLimit as exc:
            raise FieldError("context", str(exc), 503) from None
        ctx.wait(self.build_wait if wait is None else wait)
        if ctx.status == "failed":
            exc = ctx.exception
            raise exc if isinstance(exc, FieldError) else FieldError("context", f"cannot build {key.name}: {ctx.error}")
        if ctx.status != "ready":
            raise FieldError("context", f"{key.name} is still building ({100 * ctx.progress:.0f}% of {self.n} rows); "
                                        "ask again shortly (GET /api/contexts/NAME gives the progress)", 503,
                             extra=ctx.describe())
        return ctx

    def context_anchors(self, key: ContextKey) -> tuple[AnchorSet | None, list[str]]:
        """The anchor set of ``key`` (a file set, a mixture of sets, written anchors, or a mixture of
        written anchors and sets) and the set each anchor comes from."""
        if not key.selection:
            return None, []
        sets = {name: self.written.anchors(key, self._encoder_for("anchors")) if name == TYPED else
                self.anchors.sets[name] for name, _ in key.selection}
        parts = [sets[n] for n, _ in key.selection]
        anchors = parts[0] if len(parts) == 1 else AnchorSet.mixture(parts, [p for _, p in key.selection])
        return anchors, [n for n, _ in key.selection for _ in range(len(sets[n]))]

    def _fit(self, key: ContextKey) -> tuple[Any, bool, dict]:
        """The fitted geometry of ``key``, its ``symmetric`` and its anchors (run by the context engine's builder)."""
        anchors, owners = self.context_anchors(key)
        params = dict(key.params)
        if key.tau is not None:
            params["tau"] = key.tau
        try:
            model = make_model(key.model, **params).fit(anchors)
        except ValueError as exc:
            raise FieldError("params" if key.params else "model", f"cannot fit {key.name}: {exc}") from None
        return model, key.symmetric, {"anchors": anchors, "owners": owners}

    def context_nbytes(self, ctx: LiveContext) -> int:
        """What a context costs the cache: the storages it keeps alive (views count their whole buffer)."""
        return storage_nbytes(ctx.model, ctx.store, ctx.info, held=self._held) + CONTEXT_OVERHEAD

    # ------------------------------------------------------ written contexts
    def written_key(self, req: ContextRequest) -> ContextKey:
        """The key of a context written by hand (``POST /api/contexts``), validated."""
        if self.encoder is None:
            raise FieldError("anchors", "this service has no encoder to embed written anchors (start it with --encoder)")
        model = req.model or (self.default_model if self.default_model in ANCHOR_MODELS else "softmax")
        if model not in ANCHOR_MODELS:
            raise FieldError("model", f"{model!r} takes no anchors; choose an anchor geometry such as softmax "
                                      f"({', '.join(ANCHOR_MODELS)})")
        selection = self._selection(req.sets or TYPED, written=True)
        if TYPED not in dict(selection):
            raise FieldError("sets", f"gives the written anchors no mass; include {TYPED}, e.g. {TYPED}:0.6,SET:0.4")
        tau = None
        if model in TAU_MODELS:
            tau = req.tau if req.tau is not None else self.tau
            if tau is None:
                raise FieldError("tau", f"geometry {model!r} needs a temperature and the service knows none")
        elif req.tau is not None:
            raise FieldError("tau", f"the geometry {model!r} takes no temperature; leave tau out")
        params = schemas.model_params(model, req.params, self.dim)
        weights = None if req.weights is None else tuple(float(w) for w in req.weights)
        return ContextKey(model, selection, None if tau is None else float(tau), params, req.symmetric,
                          tuple(req.anchors), weights)

    def create_context(self, data: Any) -> tuple[dict, int]:
        """``POST /api/contexts``: a context of anchors written by hand, built in the background; its
        status (``building`` or ``ready``, with progress) and the HTTP status (202 or 200)."""
        req = self.request(ContextRequest, data)
        key = self.written_key(req)
        try:
            anchors = AnchorSet.from_texts(list(key.written), self._encoder_for("anchors"), weights=key.weights)
        except ValueError as exc:
            raise FieldError("anchors", str(exc).removeprefix("texts").lstrip(": ")) from None
        try:
            new = self.written.add(key, anchors)
        except ValueError as exc:
            raise FieldError("anchors", str(exc), 507) from None
        try:
            ctx = self.context(key, wait=min(self.build_wait, 0.5))
        except FieldError as exc:
            if exc.status == 503 and exc.extra:
                return exc.extra, 202
            if new:  # a context that cannot be built is not kept
                self.contexts.delete(key)
                self.written.remove(key.name)
            raise
        return ctx.describe(), 200

    def context_status(self, name: str) -> dict:
        """``GET /api/contexts/NAME``: a context's status and progress (a written context not built since a
        restart is ``stored``)."""
        key = self._named_key(name)
        ctx = self.contexts.get(key)
        if ctx is None:
            return {"context": name, "status": "stored", "progress": 0.0, "path": None}
        return ctx.describe()

    def delete_context(self, name: str) -> dict:
        """``DELETE /api/contexts/NAME``: forget a written context (a build in progress is cancelled)."""
        if not name.startswith(TYPED_PREFIX):
            raise FieldError("name", f"{name!r} is not a written context; only typed:… contexts can be deleted")
        key = self._named_key(name)
        self.contexts.delete(key)
        self.written.remove(name)
        return {"context": name, "status": "deleted"}

    def _named_key(self, name: str) -> ContextKey:
        """The key of a context name: written (``typed:…``) or ``MODEL[:SETS]`` with the service's defaults."""
        if name.startswith(TYPED_PREFIX):
            key = self.written.keys.get(name)
            if key is None:
                raise FieldError("name", f"no written context {name!r}; POST /api/contexts writes one", 404)
            return key
        return self.context_key(context=name)

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
        return self.rows[row].astype(np.float32), info, row

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

    def _knn(self, ctx: LiveContext, q: np.ndarray, k: int, own: int | None,
             rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k rows of the collection (or of the sorted ``rows``) for one query, ``own`` left out."""
        left = self.n if rows is None else len(rows)
        if own is not None:
            pos = own if rows is None else int(np.searchsorted(rows, own))
            left -= rows is None or (pos < len(rows) and rows[pos] == own)
        k = min(k, left)
        if k <= 0:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        try:
            d, i = ctx.store.search(q[None], k=k, exclude=None if own is None else np.array([[own]]), allow=rows)
        except (ContextLost, PartsMissing) as exc:  # the cluster lost its features: built again when asked
            self.contexts.forget(ctx)
            LOG.warning("context %s: %s", ctx.name, exc)  # the files and addresses stay in the server's log
            what = "lost its scheduler" if isinstance(exc, ContextLost) else "cannot answer some of its parts"
            raise FieldError("context", f"{ctx.name}: the Dask cluster {what}; it is built again on the next "
                                        "request", 503) from None
        return np.asarray(d[0]), np.asarray(i[0])

    def _index_search(self, name: str, q: np.ndarray, k: int, own: int | None,
                      rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        idx = self.indexes[name]
        if rows is not None:  # a filter: exact search of the matching rows with the index's model
            keep = rows if own is None else rows[rows != own]
            k = min(k, len(keep))
            if k <= 0:
                return np.zeros(0), np.zeros(0, dtype=np.int64)
            d, i = idx.model.search(q[None], self.rows.take(keep).astype(np.float32), k=k, symmetric=idx.symmetric)
            return np.asarray(d[0]), keep[np.asarray(i[0])]
        k = min(k, len(idx) - (own is not None))
        d, ids = idx.search(q[None], k=k, exclude=None if own is None else np.array([[own]]))
        keep = ids[0] >= 0
        return np.asarray(d[0])[keep], ids[0][keep]

    def why(self, ctx: LiveContext, key: ContextKey, q: np.ndarray, top: int = 3) -> list[dict]:
        """The anchors the query puts the most mass on: p(i | q) ∝ wᵢ exp(qᵀγᵢ / τ)."""
        A, owners = ctx.info.get("anchors"), ctx.info.get("owners")
        if A is None or not A.texts:
            return []
        found = explain(A, q, key.tau or self.tau or 1.0, top=top)
        return [{"anchor": A.texts[i], "set": owners[i] if owners else None, "mass": float(m)}
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
        elif (context or "").strip().startswith(TYPED_PREFIX):
            for f in ("model", "tau", "params"):
                if getattr(req, f) is not None:
                    raise FieldError(f, f"cannot be combined with the written context {context.strip()} "
                                        "(it holds its geometry and parameters)")
            return self._named_key(context.strip()), None
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
            anchors = ctx.info.get("anchors")
            ctx_info = {"name": key.name, "model": key.model, "anchors": key.anchors, "tau": key.tau,
                        "params": dict(key.params), "symmetric": key.symmetric,
                        "n_anchors": 0 if anchors is None else len(anchors), "path": ctx.path}
            if key.written:
                ctx_info["written"] = list(key.written)
            kind = similarity_kind(ctx.model)
            why = self.why(ctx, key, q)
        ctx_info["similarity"] = SIMILARITY[kind]
        results = [self.hit(r + 1, int(row), dist, kind, base)
                   for r, (dist, row) in enumerate(zip(d.tolist(), i.tolist()))]
        return {"query": qinfo, "context": ctx_info, "k": req.k, "filter": req.filter or None, "results": results,
                "why": why, "took_ms": round(1000 * (time.perf_counter() - start), 3)}
