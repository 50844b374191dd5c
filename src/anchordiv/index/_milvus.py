"""The ``milvus`` backend: keys in a Milvus collection (server, cluster or milvus-lite).

Connection and collection layout are described in :mod:`anchordiv.index`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from typing import Any, Callable

import numpy as np
import torch

from .._util import require
from ..models.base import EuclideanModel
from ..exact import key_feature_blocks
from ._common import (DEFAULT_MEMORY_BUDGET, Backend, BackendTags, margin_value, positive_int,
                      shortlist_size, warn_missing)
from ._layout import VectorLayout
from ._milvus_digest import _short, ids_digest, model_digest
from ._milvus_search import LocalFeatures, search_milvus

INDEX_TYPES = ("FLAT", "HNSW", "IVF_FLAT", "AUTOINDEX")
ID_FIELD, VECTOR_FIELD, EMBEDDING_FIELD = "id", "vec", "embedding"
#: Suffix of the companion collection that holds the raw embeddings where a collection allows one vector field.
COMPANION_SUFFIX = "_embedding"
#: Longest string a VARCHAR metadata field holds.
MAX_VARCHAR = 65535
#: Largest ``limit`` (top-k) a Milvus search accepts.
MAX_LIMIT = 16384
#: Bytes of vectors sent per insert request.
INSERT_BYTES = 16 * 2**20
#: Tries to connect before an unreachable server is reported.
CONNECT_ATTEMPTS = 3
#: Ids per ``get`` request when stored vectors are read back.
GET_BATCH = 2048
#: Collection property that holds the fingerprint of the index stored in it.
FINGERPRINT_KEY = "anchordiv.fingerprint"
#: Fingerprint entries that name what a collection holds: another value means another index.
IDENTITY = ("model", "symmetric", "dim", "layout", "build")
#: Fingerprint entries that change as rows are added (``M`` grows when keys are re-augmented).
CONTENT = ("ids", "M")


def import_pymilvus(lite: bool):
    """The ``pymilvus`` module (and milvus-lite for local files), or an ``ImportError`` saying what to install."""
    pymilvus = require("pymilvus", "pymilvus milvus-lite" if lite else "pymilvus", "The 'milvus' backend")
    if lite:
        require("milvus_lite", "milvus-lite", "A local .db uri (run by milvus-lite)")
    return pymilvus


def is_lite(uri: str) -> bool:
    """Whether ``uri`` names a local milvus-lite file rather than a server."""
    return "://" not in uri


def _lite_locked(path: str) -> bool:
    """Whether another process holds the LOCK of milvus-lite file ``path`` (False when it cannot tell)."""
    try:
        import fcntl
        from milvus_lite.server_manager import server_manager_instance
    except ImportError:
        return False
    served = getattr(server_manager_instance, "_servers", None)
    if served is None or path in served:
        return False  # this process serves it (or the layout is unknown)
    try:
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # also releases a lock taken just now
    return False


def _connect(pymilvus: Any, p: dict) -> Any:
    """A ``MilvusClient`` for ``p``; a milvus-lite file held by another process is a clear ``RuntimeError``."""
    held = (f"The milvus-lite file {p['uri']!r} is held open by another process (milvus-lite serves one process "
            "at a time); close it there, or share the gallery through a Milvus server (uri=\"http://host:19530\").")
    lite = is_lite(p["uri"])
    if lite and _lite_locked(p["uri"]):  # checked first: milvus-lite would log a traceback and fail obscurely
        raise RuntimeError(held)
    for attempt in range(CONNECT_ATTEMPTS):
        try:
            return pymilvus.MilvusClient(uri=p["uri"], token=p["token"] or "", db_name=p["db_name"] or "")
        except Exception as exc:
            if lite and _lite_locked(p["uri"]):  # taken in the meantime
                raise RuntimeError(held) from None
            # gRPC shares a transport between clients of one address; one the server has just closed
            # (an idle connection's GOAWAY "too many pings") fails the first call, and is reopened
            if attempt + 1 == CONNECT_ATTEMPTS or "Fail connecting" not in str(exc):
                raise
            time.sleep(0.5 * (attempt + 1))


def multi_vector(version: str) -> bool:
    """Whether a Milvus of ``version`` (``get_server_version()``) allows several vector fields per collection
    (Milvus 2.4 and later; milvus-lite 3.x)."""
    import re

    if version.startswith("milvus_lite"):
        return True
    m = re.match(r"v?(\d+)\.(\d+)", version)
    return m is not None and (int(m.group(1)), int(m.group(2))) >= (2, 4)


def scalar_fields(metadata: Any) -> dict[str, str]:
    """Milvus scalar type (BOOL, INT64, DOUBLE, VARCHAR) of each column of a metadata table."""
    import pandas as pd

    out = {}
    for col in metadata.columns:
        name, series = str(col), metadata[col]
        if name in (ID_FIELD, VECTOR_FIELD, EMBEDDING_FIELD) or not name.isidentifier():
            raise ValueError(f"metadata column {name!r} cannot be a Milvus field: rename it (a Python identifier "
                             f"other than {ID_FIELD!r}, {VECTOR_FIELD!r} and {EMBEDDING_FIELD!r}).")
        if pd.api.types.is_bool_dtype(series):
            out[name] = "BOOL"
        elif pd.api.types.is_integer_dtype(series):
            out[name] = "INT64"
        elif pd.api.types.is_float_dtype(series):
            out[name] = "DOUBLE"
        elif series.map(lambda v: isinstance(v, str)).all():
            out[name] = "VARCHAR"
        else:
            raise ValueError(f"metadata column {name!r} holds {series.dtype} values; a Milvus scalar field holds "
                             "bools, integers, floats or strings: convert or drop the column.")
    return out


def _uri(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError(
            "The 'milvus' backend needs uri=: a local file such as './gallery.db' (milvus-lite) "
            "or a server address such as 'http://localhost:19530'."
        )
    uri = os.fspath(value)
    if is_lite(uri):
        if not uri.endswith(".db"):
            raise ValueError(f"A local milvus-lite uri must end in '.db', got {uri!r}.")
        uri = os.path.abspath(uri)
    return uri


def _index_type(value: Any) -> str:
    name = str(value).upper()
    if name not in INDEX_TYPES:
        raise ValueError(f"Unknown milvus index_type {value!r}; choose one of {', '.join(INDEX_TYPES)}.")
    return name


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}.")
    return value


class MilvusBackend(Backend):
    """Keys in a Milvus collection (see the module docstring), shortlist re-ranked exactly.

    Parameters
    ----------
    uri : str
        ``"./name.db"`` for an embedded milvus-lite file, ``"http://host:19530"`` (or
        ``https://``) for a server or cluster.
    token : str, optional
        ``"user:password"`` or an API key; never saved with the index.
    db_name : str, optional
        Milvus database (server default when omitted).
    collection_name : str
        Collection holding the keys.
    index_type : {"FLAT", "HNSW", "IVF_FLAT", "AUTOINDEX"}
    M, ef_construction : int
        HNSW build parameters.
    ef_search : int
        HNSW search list size (at least the shortlist size is used).
    nlist, nprobe : int
        IVF_FLAT lists and lists visited per query (at most ``nlist``).
    shortlist : int, optional
        Candidates fetched per query and re-ranked exactly; default max(4k, 64), at most 16384.
    norm_margin : float
        M of the augmented layout is this factor times the largest key norm seen.
    overwrite : bool
        Drop an existing collection of that name instead of refusing to use it.
    consistency_level : str
        Milvus consistency level of searches (counts, and the collection's own default for other
        tools, are "Strong"). The default "Session" sees every write of this client at once and
        waits for no other (a read-mostly collection); "Strong" also waits for the writes of
        other clients, "Bounded" for none.
    memory_budget : int
        Bytes allowed for the candidate features re-ranked at once.
    store_embedding : bool
        Keep the raw embedding beside the key vector (field ``embedding``, or the companion
        collection ``<collection_name>_embedding`` on a Milvus that allows one vector field).
    local_features : bool
        Keep the key features ψ of the keys this client adds (float32, as faiss does), so that
        the re-rank reads the shortlist locally; otherwise (and for an index loaded from a
        file or built by Dask workers) Milvus returns the shortlist's stored vectors.

    Notes
    -----
    The collection carries a fingerprint (property ``anchordiv.fingerprint``): the model
    digest, ``symmetric``, vector dimension, layout and its bound M, a build id and a digest
    of the stored ids, updated by every add and saved in the index file. Loading, adding
    and searching refuse a collection whose fingerprint differs from the index's.
    """

    #: The collection field of the key features (read by the search for the shortlist's vectors).
    vector_field = VECTOR_FIELD

    name = "milvus"
    TAGS = BackendTags(stores_metadata=True, expression_filters=True, remote=True, workers_write=True)
    DEFAULTS = {"uri": None, "token": None, "db_name": None, "collection_name": "anchordiv",
                "index_type": "FLAT", "M": 32, "ef_construction": 200, "ef_search": 128, "nlist": 128,
                "nprobe": 16, "shortlist": None, "norm_margin": 1.25, "overwrite": False,
                "consistency_level": "Session", "memory_budget": DEFAULT_MEMORY_BUDGET, "store_embedding": True,
                "local_features": True}
    CHECKS = {
        "uri": _uri,
        "collection_name": lambda v: _name(v, "collection_name"),
        "index_type": _index_type,
        "M": lambda v: positive_int(v, "M"),
        "ef_construction": lambda v: positive_int(v, "ef_construction"),
        "ef_search": lambda v: positive_int(v, "ef_search"),
        "nlist": lambda v: positive_int(v, "nlist"),
        "nprobe": lambda v: positive_int(v, "nprobe"),
        "shortlist": lambda v: None if v is None else min(positive_int(v, "shortlist"), MAX_LIMIT),
        "norm_margin": margin_value,
        "overwrite": bool,
        "store_embedding": bool,
        "local_features": bool,
        "consistency_level": lambda v: _name(v, "consistency_level"),
        "memory_budget": lambda v: positive_int(v, "memory_budget"),
    }
    RUNTIME = frozenset({"uri", "token", "db_name", "ef_search", "nprobe", "shortlist", "consistency_level",
                         "memory_budget"})
    SECRET = frozenset({"token"})

    def __init__(self, params: dict, euclidean: bool, create: bool = True):
        super().__init__(params, euclidean)
        p = self.params
        self.pymilvus = import_pymilvus(is_lite(p["uri"]))
        self.client = _connect(self.pymilvus, p)
        self.layout: VectorLayout | None = None
        self.created = False
        #: What the collection holds (see :meth:`_new_fingerprint`); kept in it and in the index file.
        self.fingerprint: dict | None = None
        self.model, self.symmetric = None, True
        #: Metadata scalar fields (name → Milvus type) and where the raw embedding is kept
        #: (``"field"``, ``"companion"`` or None); set by the first add.
        self.fields: dict[str, str] = {}
        self.raw: str | None = None
        #: ψ of every stored key, in position order, when this client wrote them all (else None).
        self.local = LocalFeatures() if create and p["local_features"] else None
        self.wrote = False  # whether this client wrote since its last Strong read
        name = p["collection_name"]
        if create and self.client.has_collection(name):
            if not p["overwrite"]:
                raise ValueError(
                    f"Milvus collection {name!r} already exists at {p['uri']}; reopen it with Index.load(<saved file>), "
                    "pick another collection_name, or pass overwrite=True to drop it."
                )
            self.client.drop_collection(name)
            if self.client.has_collection(self.companion):
                self.client.drop_collection(self.companion)

    @property
    def companion(self) -> str:
        """Name of the companion collection of raw embeddings."""
        return self.params["collection_name"] + COMPANION_SUFFIX

    def bind(self, model: Any, symmetric: bool) -> None:
        """The model and ``symmetric`` flag of the owning index (named in the collection's fingerprint)."""
        self.model, self.symmetric = model, bool(symmetric)

    @classmethod
    def file_params(cls, path: str) -> dict:
        """A milvus-lite file beside the index file: ``<path>.milvus.db``."""
        return {"uri": os.fspath(path) + ".milvus.db"}

    @classmethod
    def check_load_params(cls, saved: dict, params: dict, source: str) -> None:
        """A token goes only to a uri named in the same call, never to the uri a file names."""
        if params.get("token") is not None and params.get("uri") is None:
            uri = saved.get("uri") if isinstance(saved, dict) else None
            raise ValueError(
                f"{source!r} names the Milvus uri {uri!r}; a token is sent only to a uri you name. "
                f"Pass uri= explicitly with token= (e.g. Index.load(path, uri={uri!r}, token=...))."
            )

    def allow_ids(self, positions: np.ndarray, ids: np.ndarray) -> str:
        """An ``id in [...]`` expression of the allowed ``ids``."""
        return f"{ID_FIELD} in [{', '.join(str(int(i)) for i in ids)}]"

    # --------------------------------------------------------- fingerprint
    def _new_fingerprint(self, dim: int, bound: float | None) -> dict:
        """Fingerprint of a new collection: model digest, symmetric flag, vector dimension, layout
        (``"euclidean"`` or ``"augmented"`` with its bound ``M``), a random build id and the ids digest.
        """
        return {"model": None if self.model is None else model_digest(self.model), "symmetric": self.symmetric,
                "dim": int(dim), "layout": "euclidean" if self.euclidean else "augmented",
                "M": bound, "build": uuid.uuid4().hex, "ids": ids_digest(np.zeros(0, np.int64))}

    def _stored_fingerprint(self) -> dict | None:
        """The fingerprint the collection holds (None when it has none), or ``ValueError`` when it is gone."""
        name = self.params["collection_name"]
        try:
            props = self.client.describe_collection(name).get("properties") or {}
        except Exception:
            if not self.client.has_collection(name):
                raise ValueError(f"Milvus collection {name!r} at {self.params['uri']} does not exist.") from None
            raise
        raw = props.get(FINGERPRINT_KEY)
        return None if raw is None else json.loads(raw)

    def _set_fingerprint(self, fingerprint: dict) -> None:
        self.client.alter_collection_properties(self.params["collection_name"],
                                                properties={FINGERPRINT_KEY: json.dumps(fingerprint, sort_keys=True)})
        self.fingerprint = fingerprint

    def _replaced(self, stored: dict | None, expected: dict, owner: str) -> ValueError | None:
        """The error for a collection whose identity differs from ``expected`` (None when it matches)."""
        stored = stored or {}
        diff = [k for k in IDENTITY if stored.get(k) != expected.get(k)]
        if not diff:
            return None
        diff += [k for k in CONTENT if stored.get(k) != expected.get(k)]
        what = "; ".join(f"{k}: {_short(expected.get(k))!r} expected, {_short(stored.get(k))!r} found" for k in diff)
        name = self.params["collection_name"]
        return ValueError(
            f"Milvus collection {name!r} at {self.params['uri']} is not the one {owner} was built in ({what}): "
            "it was replaced (dropped and rebuilt, e.g. by another index with overwrite=True). Load the index "
            "file saved with that collection, or rebuild this index in its own collection_name."
        )

    def _check(self) -> None:
        """Refuse to use a collection that no longer holds this index."""
        if self.fingerprint is None:
            return
        stored = self._stored_fingerprint()
        err = self._replaced(stored, self.fingerprint, "this index")
        if err is not None:
            raise err
        if any(stored.get(k) != self.fingerprint.get(k) for k in CONTENT):
            raise ValueError(
                f"Milvus collection {self.params['collection_name']!r} at {self.params['uri']} was changed outside "
                "this index (rows added or re-written by another process); reload it with "
                "Index.load(<saved file>, resync=True)."
            )

    # ------------------------------------------------------------ building
    def _create(self, dim: int, bound: float | None, raw_dim: int | None = None,
                fields: dict[str, str] | None = None) -> None:
        """Create the collection: ``id``, ``vec``, the raw ``embedding`` (of ``raw_dim``; in a companion
        collection where only one vector field is allowed) and the metadata scalar ``fields``."""
        p, DataType = self.params, self.pymilvus.DataType
        self.fields = dict(fields or {})
        if raw_dim is not None and p["store_embedding"]:
            self.raw = "field" if multi_vector(self.client.get_server_version()) else "companion"
        if self.raw == "companion" and self.client.has_collection(self.companion):
            raise ValueError(
                f"Milvus collection {self.companion!r} already exists at {p['uri']}, and this Milvus keeps the raw "
                f"embeddings of {p['collection_name']!r} in a collection of that name; drop or rename it, pick "
                "another collection_name, or pass store_embedding=False."
            )
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(ID_FIELD, DataType.INT64, is_primary=True)
        schema.add_field(VECTOR_FIELD, DataType.FLOAT_VECTOR, dim=dim)
        if self.raw == "field":
            schema.add_field(EMBEDDING_FIELD, DataType.FLOAT_VECTOR, dim=raw_dim)
        for name, kind in self.fields.items():
            schema.add_field(name, getattr(DataType, kind), **({"max_length": MAX_VARCHAR} if kind == "VARCHAR" else {}))
        build = {"HNSW": {"M": p["M"], "efConstruction": p["ef_construction"]},
                 "IVF_FLAT": {"nlist": p["nlist"]}}.get(p["index_type"], {})
        index_params = self.client.prepare_index_params()
        index_params.add_index(field_name=VECTOR_FIELD, index_type=p["index_type"], metric_type=self.metric,
                               params=build)
        if build and is_lite(p["uri"]):
            # milvus-lite reads build parameters from a JSON "params" entry; pymilvus sends them flattened
            index_params[0].get_index_configs()["params"] = dict(build)
        if self.raw == "field":  # a loaded collection needs an index on every vector field
            index_params.add_index(field_name=EMBEDDING_FIELD, index_type="FLAT", metric_type="COSINE")
        name = p["collection_name"]
        fingerprint = self._new_fingerprint(dim, bound)
        # Strong: other tools that read the collection at its default level see every write
        self.client.create_collection(name, schema=schema, consistency_level="Strong",
                                      properties={FINGERPRINT_KEY: json.dumps(fingerprint, sort_keys=True)})
        try:
            # an empty collection: the index is registered at once and built as segments fill
            self.client.create_index(name, index_params, sync=False)
            self.client.load_collection(name)
            if self.raw == "companion":
                self._create_companion(raw_dim)
        except Exception:
            self.client.drop_collection(name)  # leave nothing half-made behind
            if self.client.has_collection(self.companion):
                self.client.drop_collection(self.companion)
            raise
        self.created, self.fingerprint = True, fingerprint

    def _create_companion(self, raw_dim: int) -> None:
        DataType = self.pymilvus.DataType
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(ID_FIELD, DataType.INT64, is_primary=True)
        schema.add_field(EMBEDDING_FIELD, DataType.FLOAT_VECTOR, dim=raw_dim)
        index_params = self.client.prepare_index_params()
        index_params.add_index(field_name=EMBEDDING_FIELD, index_type="FLAT", metric_type="COSINE")
        self.client.create_collection(self.companion, schema=schema, consistency_level="Strong")
        # not loaded: it is written and read by id only, and loading takes seconds on Milvus 2.3
        self.client.create_index(self.companion, index_params, sync=False)

    def _write(self, ids: np.ndarray, vectors: np.ndarray, upsert: bool = False, extra: dict | None = None) -> None:
        """Write rows ``id``, ``vec`` and the ``extra`` columns (raw ``embedding``, metadata) of ``ids``."""
        name, extra = self.params["collection_name"], dict(extra or {})
        raw = extra.pop(EMBEDDING_FIELD, None)
        if self.raw is None:
            raw = None
        step = max(1, INSERT_BYTES // (4 * (vectors.shape[1] + (0 if raw is None else raw.shape[1]))))
        write = self.client.upsert if upsert else self.client.insert
        self.wrote = True
        for s in range(0, len(ids), step):
            rows = [{ID_FIELD: int(i), VECTOR_FIELD: v} for i, v in zip(ids[s:s + step], vectors[s:s + step])]
            for col, values in extra.items():
                for row, v in zip(rows, values[s:s + step]):
                    row[col] = v.item() if isinstance(v, np.generic) else v
            if raw is not None and self.raw == "field":
                for row, v in zip(rows, raw[s:s + step]):
                    row[EMBEDDING_FIELD] = v
            write(name, rows)
            if raw is not None and self.raw == "companion":
                self.client.upsert(self.companion, [{ID_FIELD: int(i), EMBEDDING_FIELD: v}
                                                    for i, v in zip(ids[s:s + step], raw[s:s + step])])

    def _read(self, ids: np.ndarray, rows: bool = False) -> Any:
        """Stored vectors of ``ids``, in that order (``rows``: the whole rows, as dicts)."""
        name, out = self.params["collection_name"], []
        fields = ["*"] if rows else [VECTOR_FIELD]
        for s in range(0, len(ids), GET_BATCH):
            chunk = [int(i) for i in ids[s:s + GET_BATCH]]
            got = self.client.get(name, ids=chunk, output_fields=fields)
            found = {int(r[ID_FIELD]): (dict(r) if rows else r[VECTOR_FIELD]) for r in got}
            missing = [i for i in chunk if i not in found]
            if missing:
                raise RuntimeError(
                    f"Milvus collection {name!r} lacks {len(missing)} stored id(s) (e.g. {missing[:5]}); "
                    "it was changed outside this index."
                )
            out.append([found[i] for i in chunk] if rows else np.asarray([found[i] for i in chunk], dtype=np.float32))
        if rows:
            return [r for part in out for r in part]
        return np.concatenate(out) if out else np.zeros((0, self.layout.vector_dim), np.float32)

    def delete(self, positions: np.ndarray, ids: np.ndarray, n: int, replaced: bool = False) -> None:
        """Delete the rows of ``ids`` (kept when ``replaced``: the upsert that follows overwrites them)."""
        self._check()
        self.wrote = True
        if not replaced:
            for s in range(0, len(ids), GET_BATCH):
                chunk = [int(i) for i in ids[s:s + GET_BATCH]]
                self.client.delete(self.params["collection_name"], ids=chunk)
                if self.raw == "companion":
                    self.client.delete(self.companion, ids=chunk)
        self._set_fingerprint({**self.fingerprint, "ids": ids_digest(ids, self.fingerprint["ids"], removed=True)})
        if self.local is not None:
            self.local.delete(positions)

    def add(self, psi: torch.Tensor, ids: np.ndarray, stored_ids: np.ndarray, upsert: bool = False,
            raw: torch.Tensor | None = None, metadata: Any = None) -> None:
        """``raw`` (the keys' embeddings) and ``metadata`` (a pandas DataFrame of these rows) are stored as
        the ``embedding`` and the scalar fields (see :meth:`_create`)."""
        if self.created:
            self._check()
        layout = self.layout
        if layout is None:
            layout = VectorLayout.for_keys(self.euclidean, psi, self.params["norm_margin"], self.norm_bound)
        elif not layout.fits(psi):
            layout.check(psi)
            # a key norm above M: re-augment every stored key with a larger M, announced first so
            # that a crash part-way leaves a collection the saved file no longer matches
            layout = VectorLayout.from_state(layout.state())
            layout.grow(psi)
            if self.fingerprint is not None:
                self._set_fingerprint({**self.fingerprint, "M": layout.max_norm})
            for s in range(0, len(stored_ids), GET_BATCH * 8):
                rows = self._read(stored_ids[s:s + GET_BATCH * 8], rows=True)  # an upsert rewrites whole rows
                keys = layout.keys(self._stored(np.asarray([r[VECTOR_FIELD] for r in rows], dtype=np.float32)))
                for r, v in zip(rows, keys):
                    r[VECTOR_FIELD] = v
                self.client.upsert(self.params["collection_name"], rows)
            self.layout = layout
        vectors = layout.keys(psi)
        if raw is not None:
            raw = np.asarray(torch.as_tensor(raw).detach().cpu(), np.float32)
        if not self.created:
            self._create(vectors.shape[1], layout.max_norm, None if raw is None else raw.shape[1],
                         None if metadata is None else scalar_fields(metadata))
        columns = [] if metadata is None else [str(c) for c in metadata.columns]
        if sorted(columns) != sorted(self.fields):
            raise ValueError(f"metadata must have the columns of the collection's scalar fields {sorted(self.fields)}, "
                             f"got {columns}.")
        extra = {EMBEDDING_FIELD: raw, **({} if metadata is None else
                                          {str(c): metadata[c].tolist() for c in metadata.columns})}
        try:
            self._write(ids, vectors, upsert=upsert, extra=extra)
            if self.fingerprint is not None:
                self._set_fingerprint({**self.fingerprint, "M": layout.max_norm,
                                       "ids": ids_digest(ids, self.fingerprint["ids"])})
        except Exception:
            try:
                self.client.delete(self.params["collection_name"], ids=[int(i) for i in ids])
                if self.raw == "companion":
                    self.client.delete(self.companion, ids=[int(i) for i in ids])
            except Exception:  # the original error is the one to report
                pass
            raise
        self.layout = layout
        if self.local is not None:
            self.local.append(psi)

    def reserve(self, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        if self.local is not None:
            self.local.reserve(rows, width, dtype)

    def build_on_cluster(self, model: Any, symmetric: bool, client: Any, shards: list, first: torch.Tensor,
                         budget: int, progress: Any) -> np.ndarray:
        """The driver creates the collection with the model's fixed layout; the workers upsert the shards
        (a retried task writes the same rows again)."""
        psi0 = model.key_terms(first, symmetric, compute_dtype=True)
        layout = VectorLayout.for_keys(self.euclidean, psi0, self.params["norm_margin"], self.norm_bound)
        if not (layout.fixed or layout.euclidean):
            raise ValueError(
                "A Milvus build on a Dask cluster needs the geometry's fixed augmentation bound M, so that every "
                "worker writes the same layout; this geometry (or symmetric=False) has none. Build without client=."
            )
        self.layout, self.local = layout, None  # the workers write the keys
        metadata = shards[0].read_metadata()
        self._create(layout.vector_dim, layout.max_norm, int(first.shape[1]),
                     None if metadata is None else scalar_fields(metadata))
        model_f = client.scatter(model, broadcast=True)
        state = {"layout": layout.state(), "fields": self.fields, "raw": self.raw}
        params, tag = dict(self.params, overwrite=False), uuid.uuid4().hex[:8]
        futures = [client.submit(shard_upsert, model_f, symmetric, s, budget, params, state,
                                 key=f"anchordiv-upsert-{tag}-{i}") for i, s in enumerate(shards)]
        from distributed import as_completed

        for future in as_completed(futures):
            future.result()  # a task that failed for good raises here
            progress.update(1)
        ids = np.arange(shards[-1].offset + len(shards[-1]), dtype=np.int64)
        self._set_fingerprint({**self.fingerprint, "ids": ids_digest(ids, self.fingerprint["ids"])})
        self.client.flush(self.params["collection_name"])
        if self.count() != len(ids):
            raise RuntimeError(f"The Milvus collection holds {self.count()} rows after the build, not {len(ids)}.")
        return ids

    # ------------------------------------------------------------ searching
    @property
    def metric(self) -> str:
        """L2 for the euclidean layout; COSINE for the augmented one, whose keys all have norm M.

        On a sphere the cosine order is the L2 order, and Milvus builds COSINE indexes on
        normalised vectors (IVF lists by direction), which suits keys of one norm.
        """
        return "L2" if self.euclidean else "COSINE"

    def key_blocks(self, stored_ids: np.ndarray, rows: int = GET_BATCH * 8):
        self._check()
        if self.local is not None:
            yield from (self.local.rows()[s:s + (1 << 16)] for s in range(0, self.local.n, 1 << 16))
            return
        for start in range(0, len(stored_ids), rows):
            yield self._stored(self._read(stored_ids[start:start + rows]))

    def _stored(self, vectors: np.ndarray) -> torch.Tensor:
        """Key features ψ from vectors read back from Milvus (rescaled to norm M if normalised)."""
        if not self.euclidean:
            norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
            vectors = vectors * np.divide(self.layout.max_norm, norms, out=np.zeros_like(norms), where=norms > 0)
        return self.layout.unpack(vectors)

    def read_level(self) -> str:
        """Consistency level of the next search: "Session" reads Strong once after this client's writes
        (Milvus 2.3 gives deletes no timestamp for pymilvus' own session), then Session."""
        level = self.params["consistency_level"]
        if level == "Session" and self.wrote:
            self.wrote = False
            return "Strong"
        return level

    def _search_params(self, s: int) -> dict:
        p = self.params
        extra = {"HNSW": {"ef": max(p["ef_search"], s)},
                 "IVF_FLAT": {"nprobe": min(p["nprobe"], p["nlist"])}}.get(p["index_type"], {})
        return {"metric_type": self.metric, "params": extra}

    def search(self, offsets: torch.Tensor, phi: torch.Tensor, k: int, n: int,
               positions_of: Callable[[np.ndarray], np.ndarray],
               allow: str | None = None, certify: bool = False, exclude: None = None,
               queries: None = None) -> tuple:
        """Shortlist from Milvus (among the rows the boolean expression ``allow`` selects), re-ranked
        in float64 (:mod:`._milvus_search`); ``certify`` certifies no query (the server reports no bound on the keys it left out)."""
        if k > MAX_LIMIT:
            raise ValueError(f"k={k} exceeds the {MAX_LIMIT} results a Milvus search returns; use a smaller k.")
        self._check()
        s = min(shortlist_size(self.params["shortlist"], k, n), MAX_LIMIT)
        d, i = search_milvus(self, offsets, phi, k, s, positions_of, allow)
        warn_missing(i, "milvus", "Fewer rows match the filter, or raise nprobe (IVF_FLAT) or ef_search (HNSW).")
        return (d, i, np.zeros(len(d), dtype=bool)) if certify else (d, i)

    # ---------------------------------------------------------------- state
    def count(self) -> int:
        """Rows in the collection (0 before the first add)."""
        if not self.client.has_collection(self.params["collection_name"]):
            return 0
        res = self.client.query(self.params["collection_name"], filter="", output_fields=["count(*)"],
                                consistency_level="Strong")
        return int(res[0]["count(*)"])

    def prepare_save(self) -> None:
        if self.created:
            self.client.flush(self.params["collection_name"])
            if self.raw == "companion":
                self.client.flush(self.companion)

    def state(self, n: int) -> dict:
        return {"layout": None if self.layout is None else self.layout.state(), "created": self.created,
                "fingerprint": self.fingerprint, "fields": dict(self.fields), "raw": self.raw}

    @classmethod
    def restore(cls, params: dict, euclidean: bool, state: dict, n: int, source: str) -> "MilvusBackend":
        self = cls(params, euclidean, create=False)
        try:
            self._restore(state, n, source)
        except BaseException:
            self.client.close()
            raise
        return self

    def _restore(self, state: dict, n: int, source: str) -> None:
        """Reopen the collection of a saved index; refuse one that does not hold what the file lists."""
        layout, name, uri = state.get("layout"), self.params["collection_name"], self.params["uri"]
        self.created, self.fingerprint = bool(state.get("created")), state.get("fingerprint")
        self.fields, self.raw = dict(state.get("fields") or {}), state.get("raw")
        if layout is not None:
            self.layout = VectorLayout.from_state(layout)
        if not self.created:
            if n:
                raise ValueError(f"{source!r} is corrupt: it lists {n} ids but no Milvus collection.")
            return
        if not self.client.has_collection(name):
            raise ValueError(f"{source!r} refers to Milvus collection {name!r} at {uri}, which does not exist.")
        stored = self._stored_fingerprint()
        if self.fingerprint is not None:  # files of older versions have none: row count only
            err = self._replaced(stored, self.fingerprint, repr(source))
            if err is not None:
                raise err
        self.client.load_collection(name)
        rows = self.count()
        changed = [k for k in CONTENT if self.fingerprint is not None and stored.get(k) != self.fingerprint.get(k)]
        if rows != n or changed:
            found = (f"{rows} rows" if rows != n else f"{rows} rows with other ids" if "ids" in changed
                     else f"{rows} rows re-augmented with another bound M")
            raise ValueError(
                f"{source!r} lists {n} ids but Milvus collection {name!r} at {uri} holds {found}; the collection "
                "was changed after the index was saved (e.g. rows added and never saved). Pass resync=True to "
                "Index.load to rebuild the id list from the collection."
            )

    def _all_ids(self) -> np.ndarray:
        """Every id in the collection, ascending (primary-key order of a query iterator)."""
        it = self.client.query_iterator(self.params["collection_name"], batch_size=GET_BATCH * 8, filter="",
                                        output_fields=[ID_FIELD])
        out = [np.zeros(0, np.int64)]
        try:
            while rows := it.next():
                out.append(np.asarray([r[ID_FIELD] for r in rows], dtype=np.int64))
        finally:
            it.close()
        return np.unique(np.concatenate(out))

    @classmethod
    def resync(cls, params: dict, model: Any, symmetric: bool, state: dict, ids: np.ndarray,
               source: str) -> tuple[np.ndarray, dict]:
        """The ids and store state of a saved index, rebuilt from its collection (``Index.load(resync=True)``).

        The collection must hold the file's model (digest recomputed from ``model``),
        symmetric flag, dimension, layout and build. Its ids are adopted: the file's ids
        that it holds, in the file's order, then the others ascending (Milvus keeps no
        insertion order); the layout bound M and the ids digest are the collection's.
        """
        fingerprint = state.get("fingerprint")
        if not state.get("created") or fingerprint is None:
            raise ValueError(
                f"{source!r} cannot be resynced: it was saved before its first add or by an older anchordiv, "
                "so it does not record which collection contents belong to it. Rebuild the index."
            )
        self = cls(params, isinstance(model, EuclideanModel), create=False)
        try:
            stored = self._stored_fingerprint()
            expected = {**fingerprint, "model": model_digest(model), "symmetric": bool(symmetric)}
            err = self._replaced(stored, expected, repr(source))
            if err is not None:
                raise err
            self.client.load_collection(self.params["collection_name"])
            present = self._all_ids()
            ids = np.concatenate([ids[np.isin(ids, present)], np.setdiff1d(present, ids)])
            self._set_fingerprint({**stored, "ids": ids_digest(ids)})
        finally:
            self.client.close()
        layout = state.get("layout")
        if layout is not None and layout.get("max_norm") != stored.get("M"):
            bound = stored["M"]
            seen = max(layout["max_seen"] or 0.0, bound / layout["norm_margin"])
            layout = {**layout, "max_norm": bound, "max_seen": seen}
        return ids, {**state, "layout": layout, "fingerprint": self.fingerprint}

    def close(self) -> None:
        self.client.close()


def shard_upsert(model: Any, symmetric: bool, shard: Any, budget: int, params: dict, state: dict) -> int:
    """Upsert one shard's rows into the Milvus collection (a Dask task of a milvus build); its row count."""
    backend = MilvusBackend(params, isinstance(model, EuclideanModel), create=False)
    try:
        backend.layout, backend.created = VectorLayout.from_state(state["layout"]), True
        backend.fields, backend.raw = state["fields"], state["raw"]
        ids, x, metadata = shard.ids, shard.read(), shard.read_metadata()
        for start, psi in key_feature_blocks(model, x, symmetric, budget):
            block = slice(start, start + psi.shape[0])
            backend.layout.check(psi)
            extra = {EMBEDDING_FIELD: x[block].astype(np.float32),
                     **({} if metadata is None else {str(c): metadata[c].iloc[block].tolist() for c in metadata.columns})}
            backend._write(ids[block], backend.layout.keys(psi), upsert=True, extra=extra)
    finally:
        backend.close()
    return len(shard)
