"""The ``faiss`` backend: a faiss-cpu L2 index over the vector layout, exact re-ranking."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch

from .._util import require
from ..exact import largest_k
from ..models.base import AnchorModel, EuclideanModel
from ._common import (DEFAULT_MEMORY_BUDGET, Backend, BackendTags, best_candidates, margin_value, positive_int, query_blocks, rerank,
                      shortlist_size, warn_missing)
from . import _certify
from ._layout import VectorLayout

INDEX_TYPES = ("flat", "hnsw", "ivf")
#: Where the faiss index finds candidates: by the geometry's features, by the embeddings, or in
#: IVF lists chosen by the embeddings (and, for softmax, by the most probable anchor).
CANDIDATE_SPACES = ("auto", "features", "embedding", "routed")
#: Training vectors per IVF list gathered from a streamed batch before the lists are trained
#: (faiss asks for at least 39; k-means samples at most 256).
TRAIN_PER_LIST = 64
#: nprobe of an IVF index with nprobe="auto" before it is tuned.
UNTUNED_NPROBE = 16
#: certify=True on routed lists: a query's second round scans the anchor lists its bounds leave open
#: only while they hold at most this share of the keys (beyond it, exact search is the cheaper proof).
SECOND_ROUND_SHARE = 1 / 16
#: nprobe="auto": the values tried in turn (capped at nlist) until the sampled recall is reached.
NPROBE_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
#: ef_search of an HNSW index with ef_search="auto" before it is tuned.
UNTUNED_EF_SEARCH = 128
#: ef_search="auto": the values tried in turn until the sampled recall is reached (a search uses at
#: least the shortlist size, so values below it are skipped).
EF_SEARCH_LADDER = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def import_faiss():
    """The ``faiss`` module, or an ``ImportError`` that says what to install."""
    return require("faiss", "faiss-cpu", "The 'faiss' backend")


def default_nlist(n: int) -> int:
    """IVF lists for n training vectors: ⌊4√n⌋, at most n/39 so that k-means has the 39 points
    per centroid faiss asks for (no training warning on collections of a few thousand)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def _as_numpy(x) -> np.ndarray:
    """A faiss result as numpy (``faiss.contrib.torch_utils``, once imported anywhere, makes some
    methods return torch tensors)."""
    return x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _candidate_space(value) -> str:
    if value not in CANDIDATE_SPACES:
        raise ValueError(f"Unknown candidates {value!r}; choose one of {', '.join(CANDIDATE_SPACES)}.")
    return value


def _index_type(value) -> str:
    name = str(value).lower()
    if name not in INDEX_TYPES:
        raise ValueError(f"Unknown faiss index_type {value!r}; choose one of {', '.join(INDEX_TYPES)}.")
    return name


def _distinct(dist: np.ndarray, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row candidates (scores, positions) with the second copy of a repeated position made an
    empty slot (−1, +inf), rows sorted by position (one sort: copies sit side by side)."""
    order = np.argsort(cand, axis=1, kind="stable")
    cand, dist = np.take_along_axis(cand, order, 1), np.take_along_axis(dist, order, 1)
    repeated = np.zeros(cand.shape, bool)
    repeated[:, 1:] = (cand[:, 1:] == cand[:, :-1]) & (cand[:, 1:] >= 0)
    cand[repeated], dist[repeated] = -1, np.inf
    return dist, cand


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
    ef_construction : int
        HNSW candidate-list size when building.
    ef_search : int or "auto"
        HNSW candidate-list size when searching (at least the shortlist size). ``"auto"``
        (default): tuned as ``nprobe``, the smallest value of ``EF_SEARCH_LADDER`` reaching
        ``AUTO_RECALL``; 128 before the first tuning.
    nlist : int, optional
        IVF lists; default ``default_nlist(n)`` = min(⌊4√n⌋, n/39) for the n vectors of the
        first batch (which must hold at least ``nlist`` vectors).
    nprobe : int or "auto"
        IVF lists visited per query (at most ``nlist``; ``nprobe = nlist`` is exhaustive).
        ``"auto"`` (default): after each add that grows the collection by half, the smallest
        nprobe of ``NPROBE_LADDER`` whose recall@10 on a sample of the added keys (as queries,
        each excluding itself) reaches ``AUTO_RECALL`` (see ``Index``); 16 before the first.
    candidates : {"auto", "features", "embedding", "routed"}
        Where faiss looks for candidates. ``"features"``: in the layout of the feature maps
        (:mod:`anchordiv.index._layout`), so the stored vectors are the re-ranking features and
        search can be certified. ``"embedding"``: by L2 (cosine, for unit vectors) on the
        input embeddings, with the key features ψ kept beside the faiss index for re-ranking.
        ``"routed"`` (IVF only): the lists are spherical k-means cells of the *embeddings*
        (which k-means partitions well, while the padded feature layout partitions poorly),
        and, for softmax, a second set of lists, one per anchor, holds each key under its
        most probable anchor (keys whose posteriors agree are near in the divergence even
        when their embeddings are not). A query scans its ``nprobe`` nearest cells and its
        ``nprobe`` most probable anchors' lists with the exact features, computing the
        divergence itself (inner products, or L2 for a Euclidean layout), so nothing is
        re-ranked; softmax keys are stored twice. ``"auto"``:
        ``"routed"`` for IVF indexes of anchor models without a Euclidean embedding
        (softmax, mixture), ``"features"`` otherwise.
    shortlist : int, optional
        Candidates fetched per query and re-ranked exactly (routed: kept from each set of
        lists); default max(4k, 64).
    norm_margin : float
        M of the augmented layout is this factor times the largest key norm seen.
    memory_budget : int
        Bytes allowed for the candidate features re-ranked at once.
    """

    name = "faiss"
    TAGS = BackendTags(wants_queries=True, tunable=True)
    DEFAULTS = {"index_type": "flat", "M": 32, "ef_construction": 200, "ef_search": "auto", "nlist": None,
                "nprobe": "auto", "shortlist": None, "candidates": "auto", "norm_margin": 1.25,
                "memory_budget": DEFAULT_MEMORY_BUDGET}
    CHECKS = {
        "index_type": _index_type,
        "candidates": _candidate_space,
        "M": lambda v: positive_int(v, "M"),
        "ef_construction": lambda v: positive_int(v, "ef_construction"),
        "ef_search": lambda v: v if v == "auto" else positive_int(v, "ef_search"),
        "nlist": lambda v: positive_int(v, "nlist", allow_none=True),
        "nprobe": lambda v: v if v == "auto" else positive_int(v, "nprobe"),
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
        # centroids, (radii, radii of the ψ part), largest key norm; routed: the groups of _routed_groups
        self._bounds: tuple | None = None
        self.feature_bound = None  # the geometry's FeatureBound (routed certificates), from bind()
        self._expected: int | None = None  # rows of the batch being streamed in (from reserve)
        self._pending: list[tuple] = []  # its first blocks, held until the IVF lists are trained
        self.features: torch.Tensor | None = None  # ψ of every key (embedding candidates only)
        self._filled = 0  # rows of ``features`` in use
        self._reserved = 0  # rows announced by reserve() before the index exists
        self.tuned_nprobe: int | None = None  # nprobe="auto": the value tuned on a sample of the keys
        self.tuned_ef_search: int | None = None  # ef_search="auto": likewise
        self.tuned_at = 0  # keys stored when it was tuned
        self.cells: torch.Tensor | None = None  # routed: (nlist, d) k-means centroids of the embeddings
        self.by_anchor = None  # routed softmax: IVF lists of the keys by most probable anchor
        self.routes = np.zeros((0, 2), np.int64)  # routed: per position, (embedding cell, anchor list)
        if self.routed and self.params["index_type"] != "ivf":
            raise ValueError(f"candidates='routed' needs index_type='ivf', got {self.params['index_type']!r}; "
                             "use candidates='features' or 'embedding' for flat and hnsw indexes.")

    @classmethod
    def configure(cls, params: dict, model: Any) -> dict:
        """``candidates="auto"``: ``"routed"`` for IVF indexes of anchor models without a Euclidean
        embedding (their lists come from the embeddings), else ``"features"``."""
        if params.get("candidates", "auto") != "auto":
            return params
        ivf = str(params.get("index_type", "flat")).lower() == "ivf"
        routed = ivf and isinstance(model, AnchorModel) and not isinstance(model, EuclideanModel)
        return {**params, "candidates": "routed" if routed else "features"}

    def bind(self, model: Any, symmetric: bool) -> None:
        """Keep the geometry's :class:`~anchordiv.models.base.FeatureBound` (certificates of routed lists)."""
        self.feature_bound = model.feature_bound(symmetric)

    @property
    def wants_key_embeddings(self) -> bool:
        """Embedding and routed candidates need the keys' embeddings."""
        return self.embedding_candidates or self.routed

    @property
    def embedding_candidates(self) -> bool:
        """Whether candidates come from the embeddings (ψ kept beside the faiss index)."""
        return self.params["candidates"] == "embedding"

    @property
    def nprobe(self) -> int:
        """IVF lists probed per query: the ``nprobe`` parameter, or the tuned value for ``"auto"``."""
        value = self.params["nprobe"]
        return min((self.tuned_nprobe or UNTUNED_NPROBE) if value == "auto" else value, self.nlist or 1)

    @property
    def ef_search(self) -> int:
        """HNSW candidate-list size: the ``ef_search`` parameter, or the tuned value for ``"auto"``."""
        value = self.params["ef_search"]
        return (self.tuned_ef_search or UNTUNED_EF_SEARCH) if value == "auto" else value

    @property
    def _tuned_name(self) -> str | None:
        """The parameter ``"auto"`` tunes for this index type (None: nothing to tune)."""
        name = {"ivf": "nprobe", "hnsw": "ef_search"}.get(self.params["index_type"])
        return name if name and self.params[name] == "auto" else None

    def needs_tuning(self, n: int) -> bool:
        """Whether ``nprobe="auto"`` (IVF) or ``ef_search="auto"`` (HNSW) should be tuned again for ``n``
        stored keys (first tuning, or the collection grew by half since the last)."""
        name = self._tuned_name
        return (name is not None and self.index is not None
                and (getattr(self, f"tuned_{name}") is None or n >= 1.5 * self.tuned_at))

    def tuning_trials(self):
        """``nprobe="auto"``: each value of ``NPROBE_LADDER`` in turn, capped at ``nlist``;
        ``ef_search="auto"``: each value of ``EF_SEARCH_LADDER`` from the default shortlist size on."""
        if self._tuned_name == "ef_search":
            floor = shortlist_size(self.params["shortlist"], 10, self.index.ntotal)
            for ef in EF_SEARCH_LADDER:
                if ef >= floor or ef == EF_SEARCH_LADDER[-1]:
                    self.tuned_ef_search = ef
                    yield
            return
        for nprobe in NPROBE_LADDER:
            self.tuned_nprobe = min(nprobe, self.nlist)
            yield
            if nprobe >= self.nlist:
                return

    def tuned(self, n: int) -> None:
        self.tuned_at = n

    @property
    def routed(self) -> bool:
        """Whether IVF lists are chosen by the embeddings and anchors (see ``candidates``)."""
        return self.params["candidates"] == "routed"

    # ------------------------------------------------------------ building
    def _new_routed_index(self, vectors: np.ndarray, embeddings: np.ndarray, batch_rows: int | None):
        """Empty IVF lists over the key ``vectors``' layout, with cells from spherical k-means of the
        ``embeddings`` (and, for softmax, one list per anchor in ``self.by_anchor``)."""
        faiss, n, d = self.faiss, embeddings.shape[0], embeddings.shape[1]
        nlist = self.nlist or self.params["nlist"] or default_nlist(batch_rows or n)
        if n < nlist:
            raise ValueError(
                f"The IVF index needs at least nlist={nlist} vectors to train on, but the first batch has {n}; "
                "add a larger first batch or pass a smaller nlist.")
        kmeans = faiss.Kmeans(d, nlist, niter=20, spherical=True, seed=1234, max_points_per_centroid=TRAIN_PER_LIST)
        kmeans.train(embeddings)
        self.cells = torch.from_numpy(np.array(kmeans.centroids, dtype=np.float32))
        index = self._lists(vectors.shape[1], nlist)
        index.set_direct_map_type(faiss.DirectMap.Array)  # reconstruct() of stored keys (rebuilds, key_blocks)
        self.nlist = nlist
        if self.anchor_logits is not None:
            anchors = int(self.anchor_logits(torch.from_numpy(embeddings[:1])).shape[1])
            self.by_anchor = self._lists(vectors.shape[1], anchors)
        return index

    def _lists(self, dim: int, count: int):
        """``count`` empty inverted lists of ``dim``-vectors, filled and searched with given list numbers
        (its quantizer is a placeholder: faiss needs one of the vectors' dimension). They are scanned
        with the divergence itself: L2 for the Euclidean layout, the inner product φᵀψ (the pad
        coordinate meets the query's 0) for the augmented one."""
        placeholder = self.faiss.IndexFlatL2(dim)
        placeholder.add(np.zeros((count, dim), np.float32))
        return self.faiss.IndexIVFFlat(placeholder, dim, count, self._scan_metric)

    @property
    def _scan_metric(self) -> int:
        """faiss metric of the routed lists (see :meth:`_lists`)."""
        return self.faiss.METRIC_L2 if self.euclidean else self.faiss.METRIC_INNER_PRODUCT

    @staticmethod
    def _top_lists(embeddings: np.ndarray, top: int, scores: Callable[[torch.Tensor], torch.Tensor]) -> np.ndarray:
        """(n, top) int64: per row, the columns of the ``top`` largest ``scores`` (4,096 rows at a time):
        the nearest cells (inner products with their centroids) or the most probable anchors."""
        out = np.empty((embeddings.shape[0], top), np.int64)
        for s in range(0, embeddings.shape[0], 4096):
            out[s:s + 4096] = largest_k(scores(torch.from_numpy(embeddings[s:s + 4096])), None, top)[1].cpu().numpy()
        return out

    def _nearest_cells(self, embeddings: np.ndarray, top: int) -> np.ndarray:
        """(n, top) int64: each row's ``top`` cells of largest inner product."""
        return self._top_lists(embeddings, top, lambda x: x @ self.cells.T)

    def _add_routed(self, vectors: np.ndarray, embeddings: np.ndarray) -> None:
        """Keys' layout ``vectors`` into the cells of their ``embeddings`` (and their anchors' lists)."""
        start = self.index.ntotal
        cells = self._nearest_cells(embeddings, 1)
        routes = np.stack([cells[:, 0], np.full(len(cells), -1)], axis=1).astype(np.int64)
        if self.by_anchor is not None:
            routes[:, 1] = self._top_lists(embeddings, 1, self.anchor_logits)[:, 0]
        self._fill_routed(self.index, self.by_anchor, vectors, routes, start)
        self.routes = np.concatenate([self.routes, routes])

    def _fill_routed(self, index, by_anchor, vectors: np.ndarray, routes: np.ndarray, start: int) -> None:
        """Add ``vectors`` (positions ``start``…) to the given lists of ``index`` and ``by_anchor``."""
        # faiss.contrib.ivf_tools.add_preassigned drops its reference to the ids array before
        # add_core reads it; every array handed to faiss is held here
        n, ptr = len(vectors), self.faiss.swig_ptr
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        cells = np.ascontiguousarray(routes[:, 0], dtype=np.int64)
        index.add_core(n, ptr(vectors), None, ptr(cells))
        if by_anchor is not None:
            anchors = np.ascontiguousarray(routes[:, 1], dtype=np.int64)
            positions = np.arange(start, start + n, dtype=np.int64)
            by_anchor.add_core(n, ptr(vectors), ptr(positions), ptr(anchors))

    def _rebuild_routed(self, keep: np.ndarray, layout: VectorLayout | None = None) -> None:
        """Re-fill the routed lists with the stored keys at positions ``keep`` (re-augmented for a
        new ``layout``), in their recorded cells and anchor lists."""
        faiss, old = self.faiss, self.index
        index, by_anchor = faiss.clone_index(old), None if self.by_anchor is None else faiss.clone_index(self.by_anchor)
        for ivf in (index, by_anchor):
            if ivf is not None:
                ivf.reset()
        routes = self.routes[keep]
        for s in range(0, keep.size, 1 << 16):
            vectors = _as_numpy(old.reconstruct_batch(keep[s:s + (1 << 16)].astype(np.int64)))
            if layout is not None:
                vectors = layout.keys(self.layout.unpack(vectors))
            self._fill_routed(index, by_anchor, vectors, routes[s:s + (1 << 16)], s)
        self.index, self.by_anchor, self.routes = index, by_anchor, routes
        if layout is not None:
            self.layout = layout

    def _new_index(self, vectors: np.ndarray, batch_rows: int | None = None):
        """A trained, empty faiss index; IVF lists sized for ``batch_rows`` (default: the vectors)."""
        faiss, p, d = self.faiss, self.params, vectors.shape[1]
        if p["index_type"] == "flat":
            index = faiss.IndexFlatL2(d)
        elif p["index_type"] == "hnsw":
            index = faiss.IndexHNSWFlat(d, p["M"], faiss.METRIC_L2)
            index.hnsw.efConstruction = p["ef_construction"]
        else:
            n = vectors.shape[0]
            nlist = self.nlist or p["nlist"] or default_nlist(batch_rows or n)
            if n < nlist:
                raise ValueError(
                    f"The IVF index needs at least nlist={nlist} vectors to train on, but the first batch has {n}; "
                    "add a larger first batch or pass a smaller nlist."
                )
            index = faiss.index_factory(d, f"IVF{nlist},Flat", faiss.METRIC_L2)
            # augmented keys lie on a sphere of radius M: unit-norm (spherical k-means) centroids
            # make the nearest list the one of largest inner product, for keys and queries alike
            index.cp.spherical = not self.euclidean and not self.embedding_candidates
            index.train(vectors)
            index.set_direct_map_type(faiss.DirectMap.Array)  # reconstruct() of shortlisted keys
            self.nlist = nlist
        return index

    def reserve(self, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        if self.index is None:
            self._expected = rows
        self._reserved = rows
        if self.index is not None and not self.embedding_candidates:
            self._reserve_codes()
        if self.embedding_candidates:  # room for the batch's ψ, allocated once
            grown = torch.empty(self._filled + rows, width, dtype=torch.float32)
            if self._filled:
                grown[:self._filled] = self.features[:self._filled]
            self.features = grown

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

    def add(self, psi: torch.Tensor, ids: np.ndarray, stored_ids: np.ndarray, upsert: bool = False,
            raw: torch.Tensor | None = None, metadata: None = None) -> None:
        self._bounds = None
        if (self.embedding_candidates or self.routed) and raw is None:
            raise ValueError(f"candidates={self.params['candidates']!r} needs the embeddings of the keys "
                             "(added through Index.add).")
        if self.index is None and self.params["index_type"] == "ivf" and self._expected:
            # IVF lists are sized for the whole first batch and trained on enough of it, not on
            # its first streamed block: hold blocks until TRAIN_PER_LIST vectors per list arrived
            self._pending.append((psi, raw))
            have = sum(b[0].shape[0] for b in self._pending)
            lists = self.params["nlist"] or default_nlist(self._expected)
            if have < min(self._expected, TRAIN_PER_LIST * lists):
                return
            psi = torch.cat([b[0] for b in self._pending])
            raw = None if raw is None else torch.cat([b[1] for b in self._pending])
            self._pending = []
        if self.embedding_candidates:
            self._add_with_embeddings(psi, raw)
            return
        if self.routed:
            self._add_keys_routed(psi, raw)
            return
        if self.layout is None:
            layout = VectorLayout.for_keys(self.euclidean, psi, self.params["norm_margin"], self.norm_bound)
            vectors = layout.keys(psi)
            index = self._new_index(vectors, self._expected)
            self.layout, self.index = layout, index
            self._reserve_codes()
            index.add(vectors)
        elif self.layout.fits(psi):
            self.index.add(self.layout.keys(psi))
        else:
            self.layout.check(psi)  # a fixed bound is never raised: such keys are refused
            # a key norm above M: re-augment every stored key with a larger M and rebuild
            old = self.layout.unpack(self._stored_rows(0, self.index.ntotal))
            layout = VectorLayout.from_state(self.layout.state())
            layout.grow(psi)
            vectors = np.concatenate([layout.keys(old), layout.keys(psi)])
            self.nlist = None
            index = self._new_index(vectors)
            index.add(vectors)
            self.layout, self.index = layout, index

    def _add_keys_routed(self, psi: torch.Tensor, raw: torch.Tensor) -> None:
        embeddings = np.ascontiguousarray(raw.detach().to(torch.float32).cpu().numpy())
        if self.layout is None:
            layout = VectorLayout.for_keys(self.euclidean, psi, self.params["norm_margin"], self.norm_bound)
            vectors = layout.keys(psi)
            self.index = self._new_routed_index(vectors, embeddings, self._expected)
            self.layout = layout
        elif not self.layout.fits(psi):
            self.layout.check(psi)  # a fixed bound is never raised: such keys are refused
            layout = VectorLayout.from_state(self.layout.state())  # a larger M: re-augment the stored keys
            layout.grow(psi)
            self._rebuild_routed(np.arange(self.index.ntotal), layout)
        self._add_routed(self.layout.keys(psi), embeddings)

    def _add_with_embeddings(self, psi: torch.Tensor, raw: torch.Tensor) -> None:
        """Embeddings into faiss (L2), ψ into ``features`` (re-ranked from there)."""
        vectors = np.ascontiguousarray(raw.detach().to(torch.float32).cpu().numpy())
        if self.index is None:
            self.index = self._new_index(vectors, self._expected)
        self.index.add(vectors)
        n = psi.shape[0]
        if self.features is None or self.features.shape[0] < self._filled + n:
            self.reserve(n, psi.shape[1], psi.dtype, psi.device)
        self.features[self._filled:self._filled + n] = psi.detach().to(torch.float32).cpu()
        self._filled += n

    def _stored_features(self, cand: np.ndarray, buffer: np.ndarray | None = None) -> torch.Tensor:
        """ψ of candidate positions (n, s) as float32 (n, s, D); empty slots (−1) hold the features
        of position 0, which re-ranking masks by their position. Stored vectors are reconstructed
        into ``buffer`` (at least n·s rows of the stored width) when given."""
        flat = np.where(cand >= 0, cand, 0).astype(np.int64).reshape(-1)
        if self.embedding_candidates:
            return self.features[torch.from_numpy(flat)].view(*cand.shape, -1)
        out = None if buffer is None else buffer[:flat.size]
        vecs = _as_numpy(self.index.reconstruct_batch(flat, out) if out is not None else self.index.reconstruct_batch(flat))
        return self.layout.unpack(vecs.reshape(*cand.shape, -1))

    def delete(self, positions: np.ndarray, ids: np.ndarray, n: int, replaced: bool = False) -> None:
        self._bounds = None
        keep = np.setdiff1d(np.arange(n), positions)
        if self.embedding_candidates:  # the key features beside the index move up with it
            self.features = self.features[torch.from_numpy(keep)]
            self._filled = keep.size
        if self.routed:
            self._rebuild_routed(keep)
            return
        if self.params["index_type"] == "flat":  # flat codes are compacted in place, order kept
            self.index.remove_ids(self.faiss.IDSelectorBatch(positions.astype(np.int64)))
            return
        # HNSW graphs cannot drop nodes, IVF lists number their rows: rebuild from the remaining keys,
        # a block at a time (IVF keeps its trained centroids)
        old = self.index
        index = self._new_index(np.zeros((0, old.d), np.float32)) \
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
            return faiss.SearchParametersHNSW(efSearch=max(self.ef_search, s), **sel)
        if p["index_type"] == "ivf":
            return faiss.SearchParametersIVF(nprobe=self.nprobe, **sel)
        return faiss.SearchParameters(**sel)

    def search(self, offsets: torch.Tensor, phi: torch.Tensor, k: int, n: int,
               positions_of: Callable[[np.ndarray], np.ndarray], allow: np.ndarray | None = None,
               certify: bool = False, exclude: None = None, queries: torch.Tensor | None = None):
        """Shortlist from faiss (restricted by an ``IDSelectorBatch`` to the ``allow`` positions), re-ranked
        exactly; an allow-list no longer than the shortlist is itself the shortlist (an exact answer).
        With ``certify`` also, per query, whether the result is provably the exact top-k
        (:mod:`anchordiv.index._certify`; never with embedding candidates, which bound nothing)."""
        p, index = self.params, self.index
        if (self.embedding_candidates or self.routed) and queries is None:
            raise ValueError(f"candidates={self.params['candidates']!r} needs the query embeddings "
                             "(searched through Index.search).")
        s = shortlist_size(p["shortlist"], k, n if allow is None else allow.size)
        params = self._search_parameters(s, allow)
        if p["index_type"] == "ivf":
            index.nprobe = self.nprobe
        # per shortlisted key: its stored vector, faiss' reconstructed copy, the re-ranking copy of ψ
        # and its position and distance
        per_query = s * (phi.shape[1] + 3) * (3 * phi.element_size() + 12)
        out_d, out_p, out_c = [], [], []
        blocks = list(query_blocks(phi.shape[0], per_query, p["memory_budget"]))
        # one buffer for the reconstructed shortlists of every block (written once, not faulted in per block);
        # routed scans re-rank nothing
        buffer = None if self.embedding_candidates or self.routed else np.empty(
            ((blocks[0].stop - blocks[0].start) * s, self.layout.vector_dim), np.float32)
        for sl in blocks:
            embeddings = None if queries is None else np.ascontiguousarray(
                queries[sl].detach().to(torch.float32).cpu().numpy())
            if self.embedding_candidates:
                y = embeddings
            else:
                y = self.layout.queries(phi[sl])
            dist = lists = None
            if allow is not None and allow.size <= s:
                cand = np.broadcast_to(allow, (y.shape[0], allow.size))
            elif self.routed:  # the scan's distances are the divergences: no re-ranking
                dist, cand, probed = self._search_routed(y, embeddings, s, allow)
                d, i = self._routed_best(dist, cand, offsets[sl], k)
                if certify:
                    d, i, ok = self._certify_routed(y, offsets[sl], phi[sl], d, i, probed, s, allow)
                    out_c.append(ok)
                out_d.append(d)
                out_p.append(i)
                continue
            elif p["index_type"] == "ivf" and allow is None:  # the lists probed are known, for the certificate
                list_d, lists = index.quantizer.search(y, index.nprobe)
                # faiss.contrib.torch_utils (imported e.g. by pytorch-metric-learning) replaces search and
                # search_preassigned with torch versions; faiss keeps its own as *_numpy
                dist, cand = getattr(index, "search_preassigned_numpy", index.search_preassigned)(y, s, lists, list_d)
            else:
                dist, cand = getattr(index, "search_numpy", index.search)(y, s, params=params)
            psi = self._stored_features(cand, buffer).to(phi.device)
            pos = torch.from_numpy(cand.astype(np.int64)).to(phi.device)
            d, i = rerank(offsets[sl], phi[sl], psi, pos, k)
            out_d.append(d)
            out_p.append(i)
            if certify:
                out_c.append(self._certify(y, dist, cand, lists, d[:, -1:], offsets[sl], i[:, -1] >= 0))
        d, i = torch.cat(out_d), torch.cat(out_p)
        warn_missing(i, "faiss", "Raise nprobe (ivf) or ef_search (hnsw).")
        return (d, i, np.concatenate(out_c)) if certify else (d, i)

    def _search_routed(self, y: np.ndarray, embeddings: np.ndarray, s: int, allow: np.ndarray | None) -> tuple:
        """(scores, positions) (n, s, or 2s with anchor lists) of the ``s`` nearest keys in each query's
        ``nprobe`` nearest embedding cells and the ``s`` nearest in its ``nprobe`` most probable anchors'
        lists, in no particular order; the scores are the divergence (Euclidean layout) or −φᵀψ
        (augmented), and empty slots and second copies of a key found in both have position −1. Also
        the lists scanned: (cells, anchor lists or None)."""
        nprobe = self.nprobe
        cells = self._nearest_cells(embeddings, nprobe)
        dist, cand = self._scan_lists(self.index, y, s, cells, allow)
        if self.by_anchor is None:
            return dist, cand, (cells, None)
        lists = self._top_lists(embeddings, min(nprobe, self.by_anchor.nlist), self.anchor_logits)
        dist2, cand2 = self._scan_lists(self.by_anchor, y, s, lists, allow)
        dist, cand = _distinct(np.concatenate([dist, dist2], axis=1), np.concatenate([cand, cand2], axis=1))
        return dist, cand, (cells, lists)

    def _routed_best(self, dist: np.ndarray, cand: np.ndarray, offsets: torch.Tensor, k: int) -> tuple:
        """The k best (divergences, positions) of routed scan results (scores of :meth:`_search_routed`)."""
        scores = torch.from_numpy(dist).to(offsets.device, offsets.dtype)
        return best_candidates(scores if self.euclidean else scores + offsets[:, None],
                               torch.from_numpy(cand).to(offsets.device), k)

    def _routed_groups(self) -> tuple:
        """Groups of the stored keys by (embedding cell, anchor list), for routed certificates:
        (cell of each group, anchor list of each group, u-ball centroids, u-ball radii, keys per
        anchor list), u of the geometry's FeatureBound; computed once per set of keys."""
        if self._bounds is None:
            lists = self.by_anchor.nlist
            labels, groups = np.unique(self.routes[:, 0] * lists + self.routes[:, 1], return_inverse=True)
            n, rows = self.index.ntotal, 1 << 16

            def blocks():
                for start in range(0, n, rows):
                    vecs = self._stored_rows(start, min(start + rows, n))
                    yield start, self.feature_bound.keys(self.layout.unpack(vecs)).numpy()

            centroids, radii = _certify.group_balls(blocks, groups.reshape(-1), len(labels))
            self._bounds = (labels // lists, labels % lists, centroids, radii,
                            np.bincount(self.routes[:, 1], minlength=lists))
        return self._bounds

    def _certify_routed(self, y: np.ndarray, offsets: torch.Tensor, phi: torch.Tensor, d: torch.Tensor,
                        i: torch.Tensor, probed: tuple, s: int, allow: np.ndarray | None) -> tuple:
        """(distances, positions, certified) of a routed search proven exact where the geometry's
        :class:`FeatureBound` allows (softmax; :mod:`._certify`). Every key a scan saw competed in the
        scan's own float32 computation of the divergence, which ranked the results (a key it left out
        scores at least the k-th), so the results are an exact search's up to its rounding ties once
        every group of keys not scanned is bounded, by its u-ball, above the k-th by more than that
        rounding. Queries left uncertified scan, once, the anchor lists of the groups bounded below
        their k-th result (when these hold at most ``SECOND_ROUND_SHARE`` of the keys), and are judged
        again."""
        n_q = len(y)
        cells, anchors = probed
        if self.feature_bound is None or anchors is None or self.euclidean:
            return d, i, np.zeros(n_q, dtype=bool)  # no bound on what the scans did not see
        _, group_anchor, centroids, radii, sizes = self._routed_groups()
        fb = self.feature_bound
        o = offsets.detach().to(torch.float64).cpu().numpy()
        bounds = _certify.ball_bounds(fb.queries(phi.detach().to(torch.float64).cpu()).numpy(), centroids, radii,
                                      fb.weight, fb.error)
        slack = _certify.divergence_slack(self.layout.vector_dim, o, phi.detach().to(torch.float64).norm(dim=1).cpu().numpy(),
                                          self.layout.max_norm)
        rows = np.arange(n_q)[:, None]
        seen = np.zeros((n_q, self.nlist), bool), np.zeros((n_q, len(sizes)), bool)  # cells, anchor lists
        seen[0][rows, cells] = seen[1][rows, anchors] = True
        ok, open_groups = self._judge_routed(d, i, seen, bounds, slack)
        wanted = np.zeros_like(seen[1])  # anchor lists of the groups left open by uncertified queries
        q_open, g_open = np.nonzero(open_groups & ~ok[:, None])
        wanted[q_open, group_anchor[g_open]] = True
        redo = np.flatnonzero(~ok & wanted.any(1) & (wanted @ sizes <= SECOND_ROUND_SHARE * self.index.ntotal))
        if not redo.size:
            return d, i, ok
        width = int(wanted[redo].sum(1).max())
        order = np.argsort(~wanted[redo], axis=1, kind="stable")[:, :width]
        lists = np.where(np.take_along_axis(wanted[redo], order, 1), order, -1)  # faiss skips list −1
        dist2, cand2 = self._scan_lists(self.by_anchor, y[redo], s, lists, allow)
        sub = torch.from_numpy(redo).to(d.device)
        found2 = torch.from_numpy(dist2).to(d.device, d.dtype) + offsets[sub, None]
        merged, cand = _distinct(torch.cat([d[sub], found2], 1).cpu().numpy(),
                                 np.concatenate([i[sub].cpu().numpy(), cand2], axis=1))
        d2, i2 = best_candidates(torch.from_numpy(merged).to(d.device), torch.from_numpy(cand).to(d.device), d.shape[1])
        ok[redo] = self._judge_routed(d2, i2, (seen[0][redo], seen[1][redo] | wanted[redo]), bounds[redo],
                                      slack[redo])[0]
        d, i = d.clone(), i.clone()
        d[sub], i[sub] = d2, i2
        return d, i, ok

    def _judge_routed(self, d: torch.Tensor, i: torch.Tensor, seen: tuple, bounds: np.ndarray,
                      slack: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(certified, open groups (n, groups)) of routed results ``d``, ``i`` (n, k), given the lists
        ``seen`` (cells, anchor lists: (n, lists) bool) and the groups' ``bounds`` in the divergence:
        certified when every group not scanned is bounded above the k-th by more than ``slack``;
        open: the groups not scanned whose bound is not."""
        group_cell, group_anchor = self._bounds[:2]
        scanned = seen[0][:, group_cell] | seen[1][:, group_anchor]
        kth = d[:, -1].detach().to(torch.float64).cpu().numpy() + slack
        unseen = np.where(scanned, np.inf, bounds).min(1, initial=np.inf)
        ok = (unseen > kth) & (i[:, -1] >= 0).cpu().numpy()
        return ok, ~scanned & (bounds <= kth[:, None])

    def _scan_lists(self, ivf, y: np.ndarray, s: int, lists: np.ndarray, allow: np.ndarray | None) -> tuple:
        """faiss' scan of the given inverted ``lists`` (n, p) per query, restricted to ``allow``:
        (scores, positions), scores ascending (inner products negated)."""
        faiss = self.faiss
        n, lists = y.shape[0], np.ascontiguousarray(lists, dtype=np.int64)
        sel = {} if allow is None else {"sel": faiss.IDSelectorBatch(allow.astype(np.int64))}
        params = faiss.SearchParametersIVF(nprobe=lists.shape[1], **sel)
        dist, cand = np.empty((n, s), np.float32), np.empty((n, s), np.int64)
        x, zeros = np.ascontiguousarray(y, dtype=np.float32), np.zeros(lists.shape, np.float32)
        ivf.search_preassigned_c(n, faiss.swig_ptr(x), s, faiss.swig_ptr(lists), faiss.swig_ptr(zeros),
                                 faiss.swig_ptr(dist), faiss.swig_ptr(cand), False, params)
        if ivf.metric_type == faiss.METRIC_INNER_PRODUCT:
            np.negative(dist, out=dist)
        return dist, cand

    def _certify(self, y: np.ndarray, dist: np.ndarray | None, cand: np.ndarray, lists: np.ndarray | None,
                 kth: torch.Tensor, offsets: torch.Tensor, found: torch.Tensor) -> np.ndarray:
        """Whether each query's re-ranked shortlist is the exact top-k. ``dist`` None: the shortlist
        was every allowed key; ``lists``: the IVF lists probed (None: not known)."""
        found = found.cpu().numpy()
        if dist is None:
            return found
        index_type = self.params["index_type"]
        if self.embedding_candidates or self.routed or index_type == "hnsw" or (index_type == "ivf" and lists is None):
            # no bound: embedding and routed candidates and graph searches bound nothing they did not visit,
            # and an IVF search with a selector does not tell which lists it probed
            return np.zeros(len(y), dtype=bool)
        centroids, radii, key_norm = self._certificate_bounds()
        bound = _certify.scanned_bound(dist, cand)
        if lists is not None:
            norm = None if self.layout.euclidean else self.layout.max_norm
            bound = np.minimum(bound, _certify.unprobed_bound(y, centroids, radii, lists, norm))
        kth_l2 = self.layout.l2_squared(kth, offsets, y)[:, 0]
        scale = np.sqrt((y.astype(np.float64) ** 2).sum(1)) + key_norm
        ok = _certify.certified(kth_l2, bound, _certify.rounding_slack(self.layout.vector_dim, scale))
        return ok & found

    def _certificate_bounds(self) -> tuple:
        """(IVF centroids, list radii, largest stored key norm), computed once per set of keys."""
        if self._bounds is None:
            if self.params["index_type"] == "ivf":
                centroids = _as_numpy(self.index.quantizer.reconstruct_n(0, self.index.nlist)).astype(np.float64)
                # the ψ part alone for the augmented layout (its queries have no pad coordinate)
                radii = _certify.list_radii(self.index, self.layout.feature_dim)
                key_norm = (float((np.linalg.norm(centroids, axis=1) + radii[0]).max(initial=0.0))
                            if self.layout.euclidean else self.layout.max_norm)
            else:
                centroids, radii = np.zeros((0, self.layout.vector_dim)), (np.zeros(0), np.zeros(0))
                key_norm = self.layout.max_norm  # augmented keys share the norm M
                if self.layout.euclidean:
                    key_norm = max(float(np.linalg.norm(_as_numpy(x).astype(np.float64), axis=1).max())
                                   for x in (self.index.reconstruct_n(s, min(1 << 16, self.index.ntotal - s))
                                             for s in range(0, self.index.ntotal, 1 << 16)))
            self._bounds = (centroids, radii, key_norm)
        return self._bounds

    def key_blocks(self, stored_ids: np.ndarray, rows: int = 1 << 16):
        if self.embedding_candidates:
            yield from (self.features[s:min(s + rows, self._filled)] for s in range(0, self._filled, rows))
            return
        for start in range(0, self.index.ntotal, rows):
            yield self.layout.unpack(self._stored_rows(start, min(start + rows, self.index.ntotal)))

    def _stored_rows(self, start: int, stop: int) -> np.ndarray:
        """The stored vectors at positions start…stop − 1: IVF indexes look each up in their direct
        map (their ``reconstruct_n`` scans every list for each call, ten times slower)."""
        if self.params["index_type"] == "ivf":
            return _as_numpy(self.index.reconstruct_batch(np.arange(start, stop, dtype=np.int64)))
        return _as_numpy(self.index.reconstruct_n(start, stop - start))

    # ---------------------------------------------------------------- state
    def state(self, n: int) -> dict:
        if self.index is None:
            return {"index": None, "layout": None, "nlist": None, "features": None}
        features = self.features[:self._filled].clone() if self.embedding_candidates else None
        out = {"index": self._serialize(self.index),
               "layout": None if self.layout is None else self.layout.state(), "nlist": self.nlist,
               "features": features, "tuned_nprobe": self.tuned_nprobe, "tuned_ef_search": self.tuned_ef_search,
               "tuned_at": self.tuned_at}
        if self.routed:
            out["routes"] = torch.from_numpy(self.routes.copy())
            out["cells"] = self.cells.clone()
            out["anchor_index"] = None if self.by_anchor is None else self._serialize(self.by_anchor)
        return out

    def _serialize(self, index) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.faiss.serialize_index(index), dtype=np.uint8).copy())

    def _deserialize(self, raw, source: str):
        if not isinstance(raw, torch.Tensor) or raw.dtype != torch.uint8 or raw.ndim != 1:
            raise ValueError(f"{source!r} is corrupt: the faiss index data is malformed.")
        try:
            return self.faiss.deserialize_index(raw.numpy())
        except Exception as exc:  # faiss raises RuntimeError with C++ text
            raise ValueError(f"{source!r} is corrupt: faiss could not read its index ({exc}).") from exc

    def _check_lists(self, ivf, n: int, source: str, what: str) -> None:
        """Raise a ``ValueError`` naming ``source`` unless the IVF lists of ``ivf`` hold each of the
        positions 0…n−1 exactly once (a search reads stored rows at these positions)."""
        faiss, lists = self.faiss, self.faiss.extract_index_ivf(ivf).invlists
        found = []
        for i in range(lists.nlist):
            size = lists.list_size(i)
            if not size:
                continue
            ids = np.array(faiss.rev_swig_ptr(lists.get_ids(i), size), dtype=np.int64)
            bad = ids[(ids < 0) | (ids >= n)]
            if bad.size:
                raise ValueError(
                    f"{source!r} is damaged: its {what} name position {int(bad[0])} (list {i}), outside the {n} "
                    "stored vectors. Restore the file from a copy, or rebuild the index from its collection.")
            found.append(ids)
        seen = np.bincount(np.concatenate(found), minlength=n) if found else np.zeros(n, dtype=np.int64)
        if (seen != 1).any():
            pos = int(np.flatnonzero(seen != 1)[0])
            raise ValueError(
                f"{source!r} is damaged: its {what} hold position {pos} {int(seen[pos])} times instead of once. "
                "Restore the file from a copy, or rebuild the index from its collection.")

    @classmethod
    def restore(cls, params: dict, euclidean: bool, state: dict, n: int, source: str) -> "FaissBackend":
        self = cls(params, euclidean)
        raw, layout, features = state.get("index"), state.get("layout"), state.get("features")
        if raw is None:
            if n:
                raise ValueError(f"{source!r} is corrupt: it lists {n} ids but holds no faiss index.")
            return self
        if self.embedding_candidates:
            if not isinstance(features, torch.Tensor) or features.ndim != 2 or features.shape[0] != n:
                raise ValueError(f"{source!r} is corrupt: the key features of its embedding candidates are malformed.")
        elif not isinstance(layout, dict):
            raise ValueError(f"{source!r} is corrupt: the faiss index data is malformed.")
        index = self._deserialize(raw, source)
        if index.ntotal != n:
            raise ValueError(f"{source!r} is corrupt: its faiss index holds {index.ntotal} vectors but {n} ids.")
        if self.params["index_type"] == "ivf":
            self._check_lists(index, n, source, "IVF lists")
        if self.routed:
            routes, by_anchor = state.get("routes"), state.get("anchor_index")
            if not isinstance(routes, torch.Tensor) or routes.dtype != torch.int64 or tuple(routes.shape) != (n, 2):
                raise ValueError(f"{source!r} is corrupt: the list assignments of its routed IVF index are malformed.")
            self.routes = routes.numpy().copy()
            cells = state.get("cells")
            if (not isinstance(cells, torch.Tensor) or cells.dtype != torch.float32 or cells.ndim != 2
                    or cells.shape[0] != state.get("nlist")):
                raise ValueError(f"{source!r} is corrupt: the cell centroids of its routed IVF index are malformed.")
            self.cells = cells
            if by_anchor is not None:
                self.by_anchor = self._deserialize(by_anchor, source)
                if self.by_anchor.ntotal != n:
                    raise ValueError(f"{source!r} is corrupt: its anchor lists hold {self.by_anchor.ntotal} "
                                     f"vectors but {n} ids.")
                self._check_lists(self.by_anchor, n, source, "anchor IVF lists")
            for ivf in (index, self.by_anchor):  # lists written with the L2 metric hold the same vectors
                if ivf is not None:
                    ivf.metric_type = self._scan_metric
        self.index, self.nlist = index, state.get("nlist")
        tuned = state.get("tuned_nprobe"), state.get("tuned_ef_search")
        tuned_at = state.get("tuned_at", 0)
        if not all(t is None or (isinstance(t, int) and t > 0) for t in tuned) or not isinstance(tuned_at, int):
            raise ValueError(f"{source!r} is corrupt: its tuned nprobe or ef_search is malformed.")
        (self.tuned_nprobe, self.tuned_ef_search), self.tuned_at = tuned, tuned_at
        self.layout = None if layout is None else VectorLayout.from_state(layout)
        if self.embedding_candidates:
            self.features, self._filled = features.to(torch.float32), n
        return self
