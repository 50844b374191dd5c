"""The key features of one context over a whole collection, streamed from its shards and searched exactly.

A context (a fitted geometry, ``symmetric``) over a collection of n rows is the n × m matrix of
its key features ψ (Kannan, Park, Veitch 2026, eq. F.1 as an inner product:
d(q, g) = o(q) − φ(q)ᵀψ(g)). For few anchors ψ is small: 2N + 1 numbers for softmax with
N ≤ d (the probability features), r + 1 for a latent Gaussian of rank r. So a new context
costs one pass over the rows, one GEMM per block, and a query one scan of n × m numbers.

* :class:`FeatureStore` (``path = "scan"``): the rows are streamed in ``memory_budget``
  blocks (memory-mapped float16 or float32 shards, :class:`anchordiv.io.MappedRows`), ψ is
  computed in float32 (``key_terms(..., precise=False)``) and stored in float32 (or in float16
  with its rounding residual beside it). A search scans the stored ψ with the exact core
  (:func:`anchordiv.exact.knn_within`, one pass), which keeps every row whose scanned distance
  is within 2ε of the k-th, ε(q) a bound on the scan's error (:meth:`FeatureStore.slack`);
  those rows are re-ranked in float64 (the residual added back), so the result is the exact
  top-k over the float32 features, as the exact index backend's, ties to the lower row.
* :class:`IndexStore` (``path = "index"``): a geometry without a compact form (softmax with
  N > d, a mixture: 2d + 1 features) goes the existing way, an :class:`anchordiv.Index` of
  a registered backend filled block by block.

:func:`context_store` picks the path. Both build with progress, can be cancelled, and are
searched with ``search(Q, k, allow=, exclude=)`` over row positions.
"""

from __future__ import annotations

import math
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._backend import all_finite, positive_int
from ..exact import (
    DEFAULT_MEMORY_BUDGET,
    KEY_SHARE,
    NO_INDEX,
    divergence_slack,
    exclusions,
    knn_within,
    smallest_k,
)
from ..io.mapped import MappedRows, as_rows
from .cluster import DEFAULT_TIMEOUT, PART_ROWS, ClusterParts

#: Rows per block of a build at most: a float32 block of 512-d rows fits in the last-level cache, and
#: a geometry's own row chunks (``Geometry.batch_size``) need no concatenation.
BUILD_ROWS = 4096
#: Searches whose mean shortlist size per query is kept (:attr:`FeatureStore.shortlists`).
SHORTLIST_HISTORY = 1024
#: Largest feature magnitude stored in float16 (its largest finite value is 65504).
FLOAT16_LIMIT = 6.0e4
#: Unit roundoff of float16 storage, and half the least float16 subnormal.
U16, TINY16 = 2.0 ** -11, 2.0 ** -25

Progress = Callable[[int, int], None]


class Cancelled(RuntimeError):
    """A build stopped by its ``cancel`` event."""


def _checked_rows(rows: Any) -> MappedRows:
    rows = as_rows(rows)
    if len(rows) == 0:
        raise ValueError("rows is empty; a context needs at least one collection row.")
    return rows


def _block_rows(dim: int, width: int, memory_budget: int) -> int:
    """Rows per build block: a float32 copy of the rows and the feature transients within the key share."""
    per_row = 4 * dim + 4 * width * 5
    return max(1, min(BUILD_ROWS, int(memory_budget * KEY_SHARE) // per_row))


class _Store:
    """What both paths share: the model, the rows, progress and the build loop's bookkeeping."""

    path: str = ""
    cancelled = Cancelled

    def __init__(self, model: Any, rows: Any, symmetric: bool, memory_budget: int):
        self.model, self.rows, self.symmetric = model, _checked_rows(rows), bool(symmetric)
        self.memory_budget = positive_int(memory_budget, "memory_budget")
        dim = getattr(model, "dim_", self.rows.shape[1])
        if self.rows.shape[1] != dim:
            raise ValueError(f"the rows have dimension {self.rows.shape[1]} but the model was fitted on "
                             f"{dim}; embed the anchors with the collection's encoder.")
        self.done = 0
        self.seconds = 0.0

    @property
    def n(self) -> int:
        return len(self.rows)

    @property
    def progress(self) -> float:
        """Share of the rows whose features are built, in [0, 1]."""
        return self.done / self.n

    @property
    def ready(self) -> bool:
        return self.done == self.n

    def _stream(self, width: int, progress: Progress | None, cancel: threading.Event | None):
        """``(start, float32 rows)`` blocks of the whole collection, with progress and cancellation."""
        start_time = time.perf_counter()
        step = _block_rows(self.rows.shape[1], width, self.memory_budget)
        widened = torch.empty(step, self.rows.shape[1], dtype=torch.float32)
        for start, block in self.rows.blocks(step):
            if cancel is not None and cancel.is_set():
                raise Cancelled("the build was cancelled")
            x = widened[:block.shape[0]]
            with warnings.catch_warnings():  # a read-only map is only read
                warnings.simplefilter("ignore", UserWarning)
                x.copy_(torch.from_numpy(np.asarray(block)))  # torch's widening: vectorised, threaded
            yield start, x
            self._advanced(start + block.shape[0], start_time, progress)

    def _advanced(self, done: int, start_time: float, progress: Progress | None) -> None:
        """``done`` rows are built, ``start_time`` (perf_counter) the build's start: record and report it."""
        self.done = done
        self.seconds = time.perf_counter() - start_time
        if progress is not None:
            progress(self.done, self.n)

    def _check_ready(self) -> None:
        if not self.ready:
            raise RuntimeError(f"the context is still building ({100 * self.progress:.0f}% of {self.n} rows); "
                               "wait for build() to finish before searching.")

    def _queries(self, Q: Any, k: int, exclude: Any, allow: Any):
        """Checked query rows, k, exclusions (n_q, e) and the sorted allowed positions."""
        q, kind = self.model.check_input(Q, "Q")
        k = positive_int(k, "k")
        ex = None if exclude is None else exclusions(exclude, q.shape[0], self.n, torch.device("cpu"))
        al = None
        if allow is not None:
            al = np.unique(np.asarray(allow, dtype=np.int64).reshape(-1))
            if al.size and (al[0] < 0 or al[-1] >= self.n):
                raise ValueError(f"allow holds rows outside [0, {self.n}); pass collection row numbers.")
        pool = self.n if al is None else al.size
        if ex is not None:
            inside = ex if al is None else torch.from_numpy(np.where(np.isin(ex.numpy(), al), ex.numpy(), -1))
            pool -= int(inside.ge(0).sum(1).max())
        if k > pool:
            raise ValueError(f"k={k} exceeds the {pool} rows left to search; pass k <= {pool}.")
        return q, kind, k, ex, al, pool


class FeatureStore(_Store):
    """The compact key features of one context over ``rows``, searched exactly (see the module doc).

    Parameters
    ----------
    model : Geometry
        A fitted geometry.
    rows : MappedRows or array (n, d)
        The collection's embeddings (memory-mapped shards, or an array).
    symmetric : bool
        Rank by ½[d(q‖g) + d(g‖q)] (eq. F.1) when True.
    storage : {"float32", "float16", "auto"}
        How the features are kept (4 bytes per number either way). ``"float32"`` (also ``"auto"``):
        ψ itself, scanned as it is. ``"float16"``: ψ rounded to float16 (``high``), scanned, and the
        rounding residual ψ − high in float16 (``low``), read only for the shortlist, so that the
        re-rank sees ψ to within about 4 float32 roundoffs; a scan reads half the bytes but widens
        them to float32 block by block, which on CPUs without float16 arithmetic costs more than it
        saves (``benchmarks/results/contexts.md``); a feature beyond :data:`FLOAT16_LIMIT` falls back
        to float32.
    memory_budget : int
        Bytes of one build block and of one block of a scan.
    client : distributed.Client, optional
        Keep the features on this Dask cluster (:mod:`anchordiv.contexts.cluster`): each worker
        maps and builds its parts of the shard files, a query's top-k is computed on every part
        and merged here; the results equal one process's. ``rows`` must be memory-mapped shard files.
    part_rows : int
        Rows of one cluster part at most (with ``client``).
    timeout : float
        Seconds a cluster search or build waits with no worker connected before it names the
        parts it is missing (with ``client``).
    """

    path = "scan"

    def __init__(self, model: Any, rows: Any, *, symmetric: bool = True, storage: str = "auto",
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, client: Any = None, part_rows: int = PART_ROWS,
                 timeout: float = DEFAULT_TIMEOUT):
        super().__init__(model, rows, symmetric, memory_budget)
        if storage not in ("auto", "float16", "float32"):
            raise ValueError(f"storage must be 'auto', 'float16' or 'float32', got {storage!r}.")
        self.requested = storage
        self.storage = torch.float16 if storage == "float16" else torch.float32
        self.width = int(model.key_terms(self.rows[:1].astype(np.float32), self.symmetric,
                                         compute_dtype=True, precise=False).shape[1])
        self.high = self.low = torch.empty(0, self.width, dtype=self.storage)
        self.key_norm = 0.0
        self.shortlists: deque[int] = deque(maxlen=SHORTLIST_HISTORY)
        self.cluster = None
        if client is not None:
            block = _block_rows(self.rows.shape[1], self.width, self.memory_budget)
            self.cluster = ClusterParts(self, client, block=block, part_rows=positive_int(part_rows, "part_rows"),
                                        timeout=timeout)

    @property
    def nbytes(self) -> int:
        return self.n * self.width * 4

    @property
    def scanned_bytes(self) -> int:
        """Bytes one scan reads: the float16 or float32 features of every row."""
        return self.n * self.width * self.high.element_size()

    def build(self, progress: Progress | None = None, cancel: threading.Event | None = None) -> "FeatureStore":
        """Compute and store ψ of every row, one block (one GEMM) at a time; returns self."""
        if self.cluster is not None:
            return self._build_on_cluster(progress, cancel)
        high = torch.empty(self.n, self.width, dtype=self.storage)
        low = torch.empty(self.n, self.width, dtype=torch.float16) if self.storage == torch.float16 else None
        norm = 0.0
        for start, x in self._stream(self.width, progress, cancel):
            psi = _key_terms(self.model, x, self.symmetric, start)
            stop = start + psi.shape[0]
            norm = max(norm, float(psi.norm(dim=1).max()))
            if low is not None and float(psi.abs().max()) > FLOAT16_LIMIT:
                warnings.warn(f"key features reach {float(psi.abs().max()):.3g}, beyond float16's range; "
                              "they are kept in float32", RuntimeWarning, stacklevel=2)
                high, low = _widened(high, low, start), None
                self.storage = torch.float32
            high[start:stop] = psi
            if low is not None:  # psi may be the rows themselves (iti): never written to
                low[start:stop] = psi - high[start:stop].float()
        self.high, self.low, self.key_norm = high, low, norm
        return self

    def _build_on_cluster(self, progress: Progress | None, cancel: threading.Event | None) -> "FeatureStore":
        start_time, self.done = time.perf_counter(), 0
        self.cluster.build(lambda rows: self._advanced(self.done + rows, start_time, progress), cancel)
        return self

    def slack(self, offsets: torch.Tensor, phi: torch.Tensor) -> torch.Tensor:
        """ε(q) ≥ |scanned − re-ranked distance| for every stored row, per query (float64): the float32
        rounding bound 4(m + 2)·u·(|o| + ‖φ‖Ψ) of the scan (Ψ the largest ‖ψ‖, m columns), plus, for
        float16 storage, ‖φ‖·(u₁₆Ψ + √m·t₁₆) for the residual that only the re-rank reads (u₁₆ float16's
        unit roundoff, t₁₆ half its least subnormal)."""
        m, psi_norm = self.width, self.key_norm
        phi_norm = phi.norm(dim=1)
        eps = divergence_slack(m, offsets, phi_norm, psi_norm)
        if self.low is not None:
            eps = eps + phi_norm * (U16 * psi_norm + math.sqrt(m) * TINY16)
        return eps * (1 + 1e-6)

    def search(self, Q: Any, k: int = 10, *, allow: Any = None, exclude: Any = None) -> tuple[Any, Any]:
        """Exact top-k rows of each query: ``(distances, rows)``, ascending, ties to the lower row.

        ``allow``: the only rows to search (row numbers); ``exclude``: (|Q|, e) rows each
        query skips (−1: none). Numpy in, numpy out.
        """
        self._check_ready()
        q, kind, k, ex, allow, _ = self._queries(Q, k, exclude, allow)
        offsets, phi = self.model.query_terms(q.double(), self.symmetric, compute_dtype=True)
        search = self.search_terms if self.cluster is None else self.cluster.search
        dist, found = search(offsets, phi, k, ex, allow)
        return kind.out(dist), (found.numpy() if kind.is_numpy else found)

    def search_terms(self, offsets: torch.Tensor, phi: torch.Tensor, k: int, exclude: torch.Tensor | None,
                     allow: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact float64 top-k (distances, rows) of queries given by their float64 terms o(q), φ(q),
        at most ``k`` per query (fewer when fewer rows are left: padded with inf and −1)."""
        eps = self.slack(offsets, phi)
        who, rows = knn_within(offsets.float(), phi.float(), [self.high], k, eps, n_keys=self.n, exclude=exclude,
                               allow=allow, memory_budget=self.memory_budget)
        self.shortlists.append(int(rows.numel()) // max(1, offsets.shape[0]))
        return self._rerank(offsets, phi, who, rows, k)

    def stored(self, rows: torch.Tensor) -> torch.Tensor:
        """ψ of stored ``rows`` in float64 (float16 storage: the high part plus its residual)."""
        psi = self.high[rows].double()
        return psi if self.low is None else psi.add_(self.low[rows].double())

    def _rerank(self, offsets: torch.Tensor, phi: torch.Tensor, who: torch.Tensor, rows: torch.Tensor,
                k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-k in float64 of each query's shortlist (query ``who[j]`` keeps row ``rows[j]``)."""
        n_q = offsets.shape[0]
        d = offsets[who] - (phi[who] * self.stored(rows)).sum(1)
        counts = torch.bincount(who, minlength=n_q)
        width = int(counts.max())
        slot = torch.arange(who.numel()) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)
        table = torch.full((n_q, width), math.inf, dtype=torch.float64)
        index = torch.full((n_q, width), NO_INDEX, dtype=torch.int64)
        table[who, slot], index[who, slot] = d, rows
        return smallest_k(table, index, k)


def _key_terms(model: Any, x: torch.Tensor, symmetric: bool, start: int) -> torch.Tensor:
    """float32 ψ of the block of rows from ``start``; a row holding NaN or inf is an error naming it."""
    try:
        return model.key_terms(x, symmetric, compute_dtype=True, precise=False).float()
    except ValueError:
        if all_finite(x):
            raise
        bad = start + int(torch.nonzero(~torch.isfinite(x).all(1))[0])
        raise ValueError(f"collection row {bad} holds NaN or inf; recompute or drop that row") from None


def _widened(high: torch.Tensor, low: torch.Tensor, rows: int) -> torch.Tensor:
    """float32 features: the first ``rows`` of float16 ``high`` + ``low``, room for the rest."""
    out = torch.empty(high.shape, dtype=torch.float32)
    out[:rows] = high[:rows].float() + low[:rows].float()
    return out


class IndexStore(_Store):
    """A context on the index path: an :class:`anchordiv.Index` of ``backend`` filled block by block
    (ids are row numbers); for geometries without a compact feature form."""

    path = "index"

    def __init__(self, model: Any, rows: Any, *, symmetric: bool = True, backend: str = "exact",
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, **params: Any):
        from ..index import Index

        super().__init__(model, rows, symmetric, memory_budget)
        self.index = Index(model, backend, symmetric=self.symmetric, **params)
        self.width = int(model.key_terms(self.rows[:1].astype(np.float32), self.symmetric).shape[1])

    @property
    def nbytes(self) -> int:
        return self.n * self.width * 4

    def build(self, progress: Progress | None = None, cancel: threading.Event | None = None) -> "IndexStore":
        """Add every row to the index, a block at a time; returns self."""
        for start, x in self._stream(self.width, progress, cancel):
            self.index.add(x, ids=np.arange(start, start + x.shape[0]))
        return self

    def search(self, Q: Any, k: int = 10, *, allow: Any = None, exclude: Any = None) -> tuple[Any, Any]:
        """Top-k rows of each query by :meth:`anchordiv.Index.search` (exact for the exact backend)."""
        self._check_ready()
        q, kind, k, ex, allow, _ = self._queries(Q, k, exclude, allow)
        d, ids = self.index.search(q, k=k, filter=allow, exclude=None if ex is None else ex)
        return kind.out(torch.as_tensor(d)), (ids if kind.is_numpy else torch.from_numpy(np.asarray(ids)))


def compact(model: Any, dim: int, symmetric: bool = True) -> bool:
    """Whether a context's features are no wider than a row of ``dim`` numbers plus one (softmax with
    N ≤ d, latent and Gaussian models, cosine): then :class:`FeatureStore` scans them."""
    row = np.zeros((1, dim), dtype=np.float32)
    row[0, 0] = 1.0
    return int(model.key_terms(row, symmetric, compute_dtype=True, precise=False).shape[1]) <= dim + 1


def context_store(model: Any, rows: Any, *, symmetric: bool = True, backend: str = "exact", storage: str = "auto",
                  memory_budget: int = DEFAULT_MEMORY_BUDGET, client: Any = None,
                  **params: Any) -> FeatureStore | IndexStore:
    """The store of a new context, not yet built: a :class:`FeatureStore` when the geometry's
    features are compact (:func:`compact`), kept on the Dask cluster of ``client`` when one is
    given, else an :class:`IndexStore` of ``backend`` (built in this process)."""
    if compact(model, as_rows(rows).shape[1], symmetric):
        return FeatureStore(model, rows, symmetric=symmetric, storage=storage, memory_budget=memory_budget,
                            client=client)
    return IndexStore(model, rows, symmetric=symmetric, backend=backend, memory_budget=memory_budget, **params)


__all__ = ["FeatureStore", "IndexStore", "Cancelled", "context_store", "compact"]
