"""The ``milvus`` backend: keys in a Milvus collection (server, cluster or milvus-lite).

Connection and collection layout are described in :mod:`anchordiv.index`.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np
import torch

from ._common import (DEFAULT_MEMORY_BUDGET, Backend, margin_value, positive_int, query_blocks, rerank,
                      shortlist_size, warn_missing)
from ._layout import VectorLayout

INDEX_TYPES = ("FLAT", "HNSW", "IVF_FLAT", "AUTOINDEX")
ID_FIELD, VECTOR_FIELD = "id", "vec"
#: Largest ``limit`` (top-k) a Milvus search accepts.
MAX_LIMIT = 16384
#: Bytes of vectors sent per insert request.
INSERT_BYTES = 16 * 2**20
#: Ids per ``get`` request when stored vectors are read back.
GET_BATCH = 2048


def import_pymilvus(lite: bool):
    """The ``pymilvus`` module (and milvus-lite for local files), or an ``ImportError`` saying what to install."""
    try:
        import pymilvus
    except ImportError as exc:
        raise ImportError(
            "The 'milvus' backend needs pymilvus: pip install pymilvus "
            "(and pip install milvus-lite for a local .db file)"
        ) from exc
    if lite:
        try:
            import milvus_lite  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                "A local .db uri runs milvus-lite, which is not installed: pip install milvus-lite "
                "(or pip install 'pymilvus[milvus_lite]')"
            ) from exc
    return pymilvus


def is_lite(uri: str) -> bool:
    """Whether ``uri`` names a local milvus-lite file rather than a server."""
    return "://" not in uri


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
        Milvus consistency level of searches and counts ("Strong" sees every insert).
    memory_budget : int
        Bytes allowed for the candidate features re-ranked at once.
    """

    name = "milvus"
    DEFAULTS = {"uri": None, "token": None, "db_name": None, "collection_name": "anchordiv",
                "index_type": "FLAT", "M": 32, "ef_construction": 200, "ef_search": 128, "nlist": 128,
                "nprobe": 16, "shortlist": None, "norm_margin": 1.25, "overwrite": False,
                "consistency_level": "Strong", "memory_budget": DEFAULT_MEMORY_BUDGET}
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
        self.client = self.pymilvus.MilvusClient(uri=p["uri"], token=p["token"] or "", db_name=p["db_name"] or "")
        self.layout: VectorLayout | None = None
        self.created = False
        name = p["collection_name"]
        if create and self.client.has_collection(name):
            if not p["overwrite"]:
                raise ValueError(
                    f"Milvus collection {name!r} already exists at {p['uri']}; reopen it with Index.load(<saved file>), "
                    "pick another collection_name, or pass overwrite=True to drop it."
                )
            self.client.drop_collection(name)

    # ------------------------------------------------------------ building
    def _create(self, dim: int) -> None:
        p, DataType = self.params, self.pymilvus.DataType
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field(ID_FIELD, DataType.INT64, is_primary=True)
        schema.add_field(VECTOR_FIELD, DataType.FLOAT_VECTOR, dim=dim)
        build = {"HNSW": {"M": p["M"], "efConstruction": p["ef_construction"]},
                 "IVF_FLAT": {"nlist": p["nlist"]}}.get(p["index_type"], {})
        index_params = self.client.prepare_index_params()
        index_params.add_index(field_name=VECTOR_FIELD, index_type=p["index_type"], metric_type=self.metric,
                               params=build)
        if build and is_lite(p["uri"]):
            # milvus-lite reads build parameters from a JSON "params" entry; pymilvus sends them flattened
            index_params[0].get_index_configs()["params"] = dict(build)
        name = p["collection_name"]
        self.client.create_collection(name, schema=schema, consistency_level=p["consistency_level"])
        try:
            # an empty collection: the index is registered at once and built as segments fill
            self.client.create_index(name, index_params, sync=False)
            self.client.load_collection(name)
        except Exception:
            self.client.drop_collection(name)  # leave nothing half-made behind
            raise
        self.created = True

    def _write(self, ids: np.ndarray, vectors: np.ndarray, upsert: bool = False) -> None:
        name = self.params["collection_name"]
        step = max(1, INSERT_BYTES // (4 * vectors.shape[1]))
        write = self.client.upsert if upsert else self.client.insert
        for s in range(0, len(ids), step):
            rows = [{ID_FIELD: int(i), VECTOR_FIELD: v} for i, v in zip(ids[s:s + step], vectors[s:s + step])]
            write(name, rows)

    def _read(self, ids: np.ndarray) -> np.ndarray:
        """Stored vectors of ``ids``, in that order."""
        name, out = self.params["collection_name"], []
        for s in range(0, len(ids), GET_BATCH):
            chunk = [int(i) for i in ids[s:s + GET_BATCH]]
            rows = self.client.get(name, ids=chunk, output_fields=[VECTOR_FIELD])
            found = {int(r[ID_FIELD]): r[VECTOR_FIELD] for r in rows}
            missing = [i for i in chunk if i not in found]
            if missing:
                raise RuntimeError(
                    f"Milvus collection {name!r} lacks {len(missing)} stored id(s) (e.g. {missing[:5]}); "
                    "it was changed outside this index."
                )
            out.append(np.asarray([found[i] for i in chunk], dtype=np.float32))
        return np.concatenate(out) if out else np.zeros((0, self.layout.vector_dim), np.float32)

    def add(self, psi: torch.Tensor, ids: np.ndarray, stored_ids: np.ndarray) -> None:
        layout = self.layout
        if layout is None:
            layout = VectorLayout(self.euclidean, psi.shape[1], self.params["norm_margin"])
            layout.grow(psi)
        elif not layout.fits(psi):
            # a key norm above M: re-augment every stored key with a larger M
            layout = VectorLayout.from_state(layout.state())
            layout.grow(psi)
            for s in range(0, len(stored_ids), GET_BATCH * 8):
                chunk = stored_ids[s:s + GET_BATCH * 8]
                self._write(chunk, layout.keys(self._stored(self._read(chunk))), upsert=True)
            self.layout = layout
        vectors = layout.keys(psi)
        if not self.created:
            self._create(vectors.shape[1])
        try:
            self._write(ids, vectors)
        except Exception:
            try:
                self.client.delete(self.params["collection_name"], ids=[int(i) for i in ids])
            except Exception:  # the original error is the one to report
                pass
            raise
        self.layout = layout

    # ------------------------------------------------------------ searching
    @property
    def metric(self) -> str:
        """L2 for the euclidean layout; COSINE for the augmented one, whose keys all have norm M.

        On a sphere the cosine order is the L2 order, and Milvus builds COSINE indexes on
        normalised vectors (IVF lists by direction), which suits keys of one norm.
        """
        return "L2" if self.euclidean else "COSINE"

    def _stored(self, vectors: np.ndarray) -> torch.Tensor:
        """Key features ψ from vectors read back from Milvus (rescaled to norm M if normalised)."""
        if not self.euclidean:
            norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
            vectors = vectors * np.divide(self.layout.max_norm, norms, out=np.zeros_like(norms), where=norms > 0)
        return self.layout.unpack(vectors)

    def _search_params(self, s: int) -> dict:
        p = self.params
        extra = {"HNSW": {"ef": max(p["ef_search"], s)},
                 "IVF_FLAT": {"nprobe": min(p["nprobe"], p["nlist"])}}.get(p["index_type"], {})
        return {"metric_type": self.metric, "params": extra}

    def search(self, offsets: torch.Tensor, phi: torch.Tensor, k: int, n: int,
               positions_of: Callable[[np.ndarray], np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        if k > MAX_LIMIT:
            raise ValueError(f"k={k} exceeds the {MAX_LIMIT} results a Milvus search returns; use a smaller k.")
        p, layout = self.params, self.layout
        s = min(shortlist_size(p["shortlist"], k, n), MAX_LIMIT)
        per_query = s * (layout.vector_dim + 2) * (8 + phi.element_size())
        budget = min(p["memory_budget"], 64 * 2**20)
        out_d, out_p = [], []
        for sl in query_blocks(phi.shape[0], per_query, budget):
            y = layout.queries(phi[sl])
            hits = self.client.search(p["collection_name"], data=list(y), limit=s, anns_field=VECTOR_FIELD,
                                      search_params=self._search_params(s), output_fields=[VECTOR_FIELD],
                                      consistency_level=p["consistency_level"])
            cand = np.full((len(y), s), -1, dtype=np.int64)
            vecs = np.zeros((len(y), s, layout.vector_dim), dtype=np.float32)
            for r, row in enumerate(hits):
                if len(row):
                    cand[r, :len(row)] = [h[ID_FIELD] for h in row]
                    vecs[r, :len(row)] = np.asarray([h["entity"][VECTOR_FIELD] for h in row], dtype=np.float32)
            valid = cand >= 0
            pos = np.full_like(cand, -1)
            pos[valid] = positions_of(cand[valid])
            psi = self._stored(vecs).to(phi.device)
            d, i = rerank(offsets[sl], phi[sl], psi, torch.from_numpy(pos).to(phi.device), k)
            out_d.append(d)
            out_p.append(i)
        d, i = torch.cat(out_d), torch.cat(out_p)
        warn_missing(i, "milvus", "Raise nprobe (IVF_FLAT) or ef_search (HNSW).")
        return d, i

    # ---------------------------------------------------------------- state
    def count(self) -> int:
        """Rows in the collection (0 before the first add)."""
        if not self.client.has_collection(self.params["collection_name"]):
            return 0
        res = self.client.query(self.params["collection_name"], filter="", output_fields=["count(*)"],
                                consistency_level=self.params["consistency_level"])
        return int(res[0]["count(*)"])

    def prepare_save(self) -> None:
        if self.created:
            self.client.flush(self.params["collection_name"])

    def state(self, n: int) -> dict:
        return {"layout": None if self.layout is None else self.layout.state(), "created": self.created}

    @classmethod
    def restore(cls, params: dict, euclidean: bool, state: dict, n: int, source: str) -> "MilvusBackend":
        self = cls(params, euclidean, create=False)
        layout, name = state.get("layout"), self.params["collection_name"]
        self.created = bool(state.get("created"))
        if layout is not None:
            self.layout = VectorLayout.from_state(layout)
        if self.created:
            if not self.client.has_collection(name):
                raise ValueError(
                    f"{source!r} refers to Milvus collection {name!r} at {self.params['uri']}, which does not exist."
                )
            self.client.load_collection(name)
            rows = self.count()
            if rows != n:
                raise ValueError(
                    f"{source!r} lists {n} ids but Milvus collection {name!r} at {self.params['uri']} holds {rows} rows; "
                    "the collection was changed after the index was saved."
                )
        elif n:
            raise ValueError(f"{source!r} is corrupt: it lists {n} ids but no Milvus collection.")
        return self

    def close(self) -> None:
        self.client.close()
