"""The ``faiss`` backend: a faiss-cpu L2 index over the vector layout, exact re-ranking."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from .._util import require
from ._common import (DEFAULT_MEMORY_BUDGET, Backend, margin_value, positive_int, query_blocks, rerank,
                      shortlist_size, warn_missing)
from ._layout import VectorLayout

INDEX_TYPES = ("flat", "hnsw", "ivf")


def import_faiss():
    """The ``faiss`` module, or an ``ImportError`` that says what to install."""
    return require("faiss", "faiss-cpu", "The 'faiss' backend")


def default_nlist(n: int) -> int:
    """IVF lists for n training vectors: ⌊4√n⌋, at most n/39 so that k-means has the 39 points
    per centroid faiss asks for (no training warning on collections of a few thousand)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def _index_type(value) -> str:
    name = str(value).lower()
    if name not in INDEX_TYPES:
        raise ValueError(f"Unknown faiss index_type {value!r}; choose one of {', '.join(INDEX_TYPES)}.")
    return name


class FaissBackend(Backend):
    """Keys in a faiss L2 index (see :mod:`anchordiv.index._layout`), shortlist re-ranked exactly.

    Parameters
    ----------
    index_type : {"flat", "hnsw", "ivf"}
        ``IndexFlatL2`` (exhaustive), ``IndexHNSWFlat`` (graph) or ``IndexIVFFlat``
        (inverted lists, trained on the first batch added; spherical k-means for the
        augmented layout, whose keys share one norm).
    M : int
        HNSW graph degree.
    ef_construction, ef_search : int
        HNSW candidate-list sizes when building and searching (the search uses at least
        the shortlist size).
    nlist : int, optional
        IVF lists; default ``default_nlist(n)`` = min(⌊4√n⌋, n/39) for the n vectors of the
        first batch (which must hold at least ``nlist`` vectors).
    nprobe : int
        IVF lists visited per query (at most ``nlist``; ``nprobe = nlist`` is exhaustive).
    shortlist : int, optional
        Candidates fetched per query and re-ranked exactly; default max(4k, 64).
    norm_margin : float
        M of the augmented layout is this factor times the largest key norm seen.
    memory_budget : int
        Bytes allowed for the candidate features re-ranked at once.
    """

    name = "faiss"
    DEFAULTS = {"index_type": "flat", "M": 32, "ef_construction": 200, "ef_search": 128, "nlist": None,
                "nprobe": 16, "shortlist": None, "norm_margin": 1.25, "memory_budget": DEFAULT_MEMORY_BUDGET}
    CHECKS = {
        "index_type": _index_type,
        "M": lambda v: positive_int(v, "M"),
        "ef_construction": lambda v: positive_int(v, "ef_construction"),
        "ef_search": lambda v: positive_int(v, "ef_search"),
        "nlist": lambda v: positive_int(v, "nlist", allow_none=True),
        "nprobe": lambda v: positive_int(v, "nprobe"),
        "shortlist": lambda v: positive_int(v, "shortlist", allow_none=True),
        "norm_margin": margin_value,
        "memory_budget": lambda v: positive_int(v, "memory_budget"),
    }
    RUNTIME = frozenset({"ef_search", "nprobe", "shortlist", "memory_budget"})

    def __init__(self, params: dict, euclidean: bool):
        super().__init__(params, euclidean)
        self.faiss = import_faiss()
        self.index = None
        self.layout: VectorLayout | None = None
        self.nlist: int | None = None
        self._reserved = 0  # rows announced by reserve() before the index exists

    # ------------------------------------------------------------ building
    def _new_index(self, vectors: np.ndarray):
        faiss, p, d = self.faiss, self.params, vectors.shape[1]
        if p["index_type"] == "flat":
            index = faiss.IndexFlatL2(d)
        elif p["index_type"] == "hnsw":
            index = faiss.IndexHNSWFlat(d, p["M"], faiss.METRIC_L2)
            index.hnsw.efConstruction = p["ef_construction"]
        else:
            n = vectors.shape[0]
            nlist = self.nlist or p["nlist"] or default_nlist(n)
            if n < nlist:
                raise ValueError(
                    f"The IVF index needs at least nlist={nlist} vectors to train on, but the first batch has {n}; "
                    "add a larger first batch or pass a smaller nlist."
                )
            index = faiss.index_factory(d, f"IVF{nlist},Flat", faiss.METRIC_L2)
            # augmented keys lie on a sphere of radius M: unit-norm (spherical k-means) centroids
            # make the nearest list the one of largest inner product, for keys and queries alike
            index.cp.spherical = not self.euclidean
            index.train(vectors)
            index.set_direct_map_type(faiss.DirectMap.Array)  # reconstruct() of shortlisted keys
            self.nlist = nlist
        return index

    def reserve(self, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        self._reserved = rows
        if self.index is not None:
            self._reserve_codes()

    def _reserve_codes(self) -> None:
        """Give the flat code array (of IndexFlat, or the storage of IndexHNSWFlat) its final capacity
        at once: faiss grows it by doubling, which would peak at several times the stored vectors."""
        rows, self._reserved = self._reserved, 0
        flat = self.index if self.params["index_type"] == "flat" else (
            self.faiss.downcast_index(self.index.storage) if self.params["index_type"] == "hnsw" else None)
        if flat is None or rows == 0:
            return
        used = flat.ntotal * flat.code_size
        flat.codes.resize(used + rows * flat.code_size)  # std::vector: shrinking keeps the capacity
        flat.codes.resize(used)

    def add(self, psi: torch.Tensor, ids: np.ndarray, stored_ids: np.ndarray, upsert: bool = False) -> None:
        if self.layout is None:
            layout = VectorLayout.for_keys(self.euclidean, psi, self.params["norm_margin"], self.norm_bound)
            vectors = layout.keys(psi)
            index = self._new_index(vectors)
            self.layout, self.index = layout, index
            self._reserve_codes()
            index.add(vectors)
        elif self.layout.fits(psi):
            self.index.add(self.layout.keys(psi))
        else:
            self.layout.check(psi)  # a fixed bound is never raised: such keys are refused
            # a key norm above M: re-augment every stored key with a larger M and rebuild
            old = self.layout.unpack(self.index.reconstruct_n(0, self.index.ntotal))
            layout = VectorLayout.from_state(self.layout.state())
            layout.grow(psi)
            vectors = np.concatenate([layout.keys(old), layout.keys(psi)])
            self.nlist = None
            index = self._new_index(vectors)
            index.add(vectors)
            self.layout, self.index = layout, index

    def delete(self, positions: np.ndarray, ids: np.ndarray, n: int, replaced: bool = False) -> None:
        if self.params["index_type"] == "flat":  # flat codes are compacted in place, order kept
            self.index.remove_ids(self.faiss.IDSelectorBatch(positions.astype(np.int64)))
            return
        # HNSW graphs cannot drop nodes, IVF lists number their rows: rebuild from the remaining keys,
        # a block at a time (IVF keeps its trained centroids)
        keep = np.setdiff1d(np.arange(n), positions)
        old = self.index
        index = self._new_index(np.zeros((0, self.layout.vector_dim), np.float32)) \
            if self.params["index_type"] == "hnsw" else self.faiss.clone_index(old)
        if self.params["index_type"] == "ivf":
            index.reset()
        for s in range(0, keep.size, 1 << 16):
            index.add(old.reconstruct_batch(keep[s:s + (1 << 16)].astype(np.int64)))
        self.index = index

    # ------------------------------------------------------------ searching
    def _search_parameters(self, s: int, allow: np.ndarray | None):
        """faiss search parameters: list sizes, and an ``IDSelectorBatch`` of the allowed positions."""
        faiss, p = self.faiss, self.params
        sel = {} if allow is None else {"sel": faiss.IDSelectorBatch(allow.astype(np.int64))}
        if p["index_type"] == "hnsw":
            return faiss.SearchParametersHNSW(efSearch=max(p["ef_search"], s), **sel)
        if p["index_type"] == "ivf":
            return faiss.SearchParametersIVF(nprobe=min(p["nprobe"], self.nlist), **sel)
        return faiss.SearchParameters(**sel)

    def search(self, offsets: torch.Tensor, phi: torch.Tensor, k: int, n: int,
               positions_of: Callable[[np.ndarray], np.ndarray],
               allow: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Shortlist from faiss (restricted by an ``IDSelectorBatch`` to the ``allow`` positions), re-ranked
        exactly; an allow-list no longer than the shortlist is itself the shortlist (an exact answer)."""
        p, index = self.params, self.index
        s = shortlist_size(p["shortlist"], k, n if allow is None else allow.size)
        params = self._search_parameters(s, allow)
        per_query = s * (self.layout.vector_dim + 2) * (8 + phi.element_size())
        out_d, out_p = [], []
        for sl in query_blocks(phi.shape[0], per_query, p["memory_budget"]):
            y = self.layout.queries(phi[sl])
            if allow is not None and allow.size <= s:
                cand = np.broadcast_to(allow, (y.shape[0], allow.size))
            else:
                # faiss.contrib.torch_utils (imported e.g. by pytorch-metric-learning) replaces search with a
                # version without params=; it keeps faiss' own numpy search as search_numpy
                _, cand = getattr(index, "search_numpy", index.search)(y, s, params=params)
            valid = cand >= 0
            vecs = np.zeros((cand.shape[0], s, self.layout.vector_dim), dtype=np.float32)
            if valid.any():
                vecs[valid] = index.reconstruct_batch(cand[valid].astype(np.int64))
            psi = self.layout.unpack(vecs).to(phi.device)
            pos = torch.from_numpy(cand.astype(np.int64)).to(phi.device)
            d, i = rerank(offsets[sl], phi[sl], psi, pos, k)
            out_d.append(d)
            out_p.append(i)
        d, i = torch.cat(out_d), torch.cat(out_p)
        warn_missing(i, "faiss", "Raise nprobe (ivf) or ef_search (hnsw).")
        return d, i

    def key_blocks(self, stored_ids: np.ndarray, rows: int = 1 << 16):
        for start in range(0, self.index.ntotal, rows):
            yield self.layout.unpack(self.index.reconstruct_n(start, min(rows, self.index.ntotal - start)))

    # ---------------------------------------------------------------- state
    def state(self, n: int) -> dict:
        if self.index is None:
            return {"index": None, "layout": None, "nlist": None}
        raw = self.faiss.serialize_index(self.index)
        return {"index": torch.from_numpy(np.asarray(raw, dtype=np.uint8).copy()), "layout": self.layout.state(),
                "nlist": self.nlist}

    @classmethod
    def restore(cls, params: dict, euclidean: bool, state: dict, n: int, source: str) -> "FaissBackend":
        self = cls(params, euclidean)
        raw, layout = state.get("index"), state.get("layout")
        if raw is None:
            if n:
                raise ValueError(f"{source!r} is corrupt: it lists {n} ids but holds no faiss index.")
            return self
        if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or not isinstance(layout, dict):
            raise ValueError(f"{source!r} is corrupt: the faiss index data is malformed.")
        try:
            index = self.faiss.deserialize_index(raw.numpy())
        except Exception as exc:  # faiss raises RuntimeError with C++ text
            raise ValueError(f"{source!r} is corrupt: faiss could not read its index ({exc}).") from exc
        if index.ntotal != n:
            raise ValueError(f"{source!r} is corrupt: its faiss index holds {index.ntotal} vectors but {n} ids.")
        self.index, self.layout, self.nlist = index, VectorLayout.from_state(layout), state.get("nlist")
        return self
