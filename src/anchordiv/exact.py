"""Exact, memory-bounded top-k: the one search primitive of anchordiv (``ad.search`` is :func:`search`).

Every geometry satisfies ``pairwise(Q, G) = o(Q)[:, None] − φ(Q) ψ(G)ᵀ`` (the feature-map
contract of :class:`anchordiv.Geometry`), so exact search is a blocked matrix product
followed by a running top-k, in the manner of faiss' ``knn_ground_truth`` / ``ResultHeap``:

* :func:`smallest_k` selects the k smallest of each row, ties broken by the lower index;
* :class:`TopK` keeps the running result while key blocks are pushed in index order;
* :func:`knn` feeds every (query block × key block) score matrix into one :class:`TopK`,
  with optional per-query exclusions; the exact index backend, re-ranking, the report,
  the command line and :func:`search` all go through it;
* :func:`distance_matrix` writes the same score blocks into a full matrix (``pairwise``
  and the AUPRC evaluations).

Block shapes come from ``memory_budget`` (bytes) and the shapes of the problem: one block
of key features, one score block and the running top-k fit in the budget together.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import numpy as np
import torch

from ._backend import Kind, positive_int
from ._progress import progress_bar, progress_scope

#: Default byte budget of one search: key-feature block + score block + running top-k.
DEFAULT_MEMORY_BUDGET = 256 * 2**20
#: Work (multiply-adds) above which a progress bar is shown.
PROGRESS_WORK = 2e10
#: Most key rows in one block (larger blocks no longer speed up the GEMM).
MAX_KEY_BLOCK = 1 << 16
#: Fraction of the budget given to one block of key features computed on the fly (the rest: scores).
KEY_SHARE = 0.25
#: Fraction of the budget given to one block of scores; the rest is headroom for the GEMM's
#: packing buffers and the running top-k.
SCORE_SHARE = 0.5
#: Bytes that computing a row of features takes, per byte of the finished features (η, ∇κ,
#: the centred copies and the concatenation live together for a moment, and softmax's logits
#: for one chunk of anchors).
FEATURE_TRANSIENT = 5
#: Bytes a score block takes while its GEMM runs, per byte of the block (the CPU GEMM works in a
#: buffer of the output's size, measured: +32.6 MiB for a 31.75 MiB block computed in place).
GEMM_TRANSIENT = 2
#: Unit roundoff of float32.
U32 = 2.0 ** -24
#: Index of entries that are no result (an empty slot of a shortlist).
NO_INDEX = torch.iinfo(torch.int64).max
#: Entries of a top-k up to which it is finished in numpy rather than by torch kernels.
SMALL_RESULT = 1 << 12
_NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64}
#: Bytes of the rows whose k-th value is tied that are resolved at once (their scores are copied).
TIE_ROWS_BYTES = 8 * 2**20


# ------------------------------------------------------------------ selection
def smallest_k(scores: torch.Tensor, index: torch.Tensor | None, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest entries of each row of ``scores``, ordered by (value, index).

    ``index`` (one row, or one per row) holds the index of every column; None means the
    column positions. Ties, at the k-th place too, go to the lower index, so the result is
    deterministic.
    """
    return _select(scores, index, k, largest=False)


def largest_k(scores: torch.Tensor, index: torch.Tensor | None, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row, ordered by (−value, index): :func:`smallest_k` of
    −scores without negating them (torch's CPU top-k is faster for the largest)."""
    return _select(scores, index, k, largest=True)


def _select(scores: torch.Tensor, index: torch.Tensor | None, k: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    n = scores.shape[1]
    positions = index is None
    if k >= n:
        if positions:  # columns already in index order
            return torch.sort(scores, dim=1, stable=True, descending=largest)
        index = index.expand_as(scores)
        order = torch.argsort(index, dim=1, stable=True)
        scores, index = scores.gather(1, order), index.gather(1, order)
        d, o = torch.sort(scores, dim=1, stable=True, descending=largest)
        return d, index.gather(1, o)
    shared = None if positions or index.ndim != 1 else index
    index = None if positions else index.expand_as(scores)
    top_vals, top_pos = torch.topk(scores, k + 1, dim=1, largest=largest, sorted=True)
    if positions and _small(scores, top_vals.numel()):
        return _order_small(scores, top_vals.numpy(), top_pos.numpy(), k, largest)
    same = top_vals[:, 1:] == top_vals[:, :-1]  # equal neighbours in the top k + 1
    if not bool(same.any()):  # no tie: top-k's order is the (value, index) order
        return top_vals[:, :k], (top_pos[:, :k] if positions else index.gather(1, top_pos[:, :k]))
    vals, idx = _by_value_then_index(top_vals, top_pos if positions else index.gather(1, top_pos), k, largest)
    tied = same[:, k - 1]  # the k-th value ties the (k+1)-th: which tied entries belong is decided by index
    if bool(tied.any()):
        rows = torch.nonzero(tied).flatten()
        increasing = positions or (shared is not None and (n < 2 or bool((shared[1:] > shared[:-1]).all())))
        # a few tied rows at a time: each row's scores are copied once
        step = max(1, TIE_ROWS_BYTES // max(1, n * (scores.element_size() + 9)))
        for start in range(0, rows.numel(), step):
            r = rows[start:start + step]
            vals[r], idx[r] = _resolve_ties(scores[r], None if positions else index[r], top_vals[r, k - 1], k,
                                            increasing, largest)
    return vals, idx


def _small(scores: torch.Tensor, entries: int) -> bool:
    """Whether a result of ``entries`` values selected from ``scores`` is small enough to be finished
    in numpy, whose per-call cost is a fraction of a torch kernel's."""
    return (entries <= SMALL_RESULT and scores.is_cpu and scores.dtype in _NUMPY_FLOATS
            and not scores.requires_grad)


def _order_small(scores: torch.Tensor, top: np.ndarray, cols: np.ndarray, k: int, largest: bool,
                 offsets: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of each row of ``scores`` from its sorted top-(k + 1) ``top`` at columns ``cols``
    (numpy), ordered by (value, column); with ``offsets`` (the largest scores s), the values are
    o − s. The k-th place goes by score; an entry tied there with the (k+1)-th competes with every
    equal score of its row, lowest column first."""
    d = top if offsets is None else offsets - top
    key = -d if largest and offsets is None else d  # ascending
    if not (key[:, 1:] == key[:, :-1]).any():  # no tie: top-k's order is the (value, column) order
        return torch.from_numpy(d[:, :k]), torch.from_numpy(cols[:, :k])
    cut = top[:, k - 1] == top[:, k]
    cols = cols[:, :k].copy() if cut.any() else cols[:, :k]
    for r in np.flatnonzero(cut).tolist():
        # the strictly better entries come first and are all in the top k; the places left go to
        # the lowest columns holding the k-th score
        kth = top[r, k - 1]
        better = int((top[r, :k] != kth).sum())
        cols[r, better:] = np.flatnonzero(scores[r].numpy() == kth)[:k - better]
    key, d = key[:, :k], d[:, :k]
    order = np.lexsort((cols, key))  # along each row: by value, then by column
    rows = np.arange(cols.shape[0])[:, None]
    return torch.from_numpy(d[rows, order]), torch.from_numpy(cols[rows, order])


def _by_value_then_index(vals: torch.Tensor, idx: torch.Tensor, k: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The first k of rows ordered by (value, index) (value descending when ``largest``)."""
    o = torch.argsort(idx, dim=1, stable=True)
    vals, idx = vals.gather(1, o), idx.gather(1, o)
    o = torch.argsort(vals, dim=1, stable=True, descending=largest)[:, :k]
    return vals.gather(1, o), idx.gather(1, o)


def _resolve_ties(scores: torch.Tensor, index: torch.Tensor | None, kth: torch.Tensor, k: int,
                  increasing: bool, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows whose k-th value ``kth`` is tied: every entry better than it, then the tied
    entries of lowest index (``index`` None: the column positions). With ``index`` increasing
    along the row (a block of keys) this is one linear pass; otherwise (a short merge of two
    result lists) a full ordered sort."""
    def at(cols: torch.Tensor) -> torch.Tensor:
        return cols if index is None else index.gather(1, cols)

    if not increasing:
        d, i = _select(scores, index, scores.shape[1], largest)
        return d[:, :k], i[:, :k]
    window = min(scores.shape[1], 2 * k + 1)
    if window < scores.shape[1]:  # the ties usually end within 2k + 1 entries
        v, p = torch.topk(scores, window, dim=1, largest=largest, sorted=True)
        if not bool((v[:, -1] == kth).any()):
            return _by_value_then_index(v, at(p), k, largest)
    # the candidates (value at least as good as kth) in row-major order, tied ones by column
    good = scores >= kth[:, None] if largest else scores <= kth[:, None]
    r, c = torch.nonzero(good, as_tuple=True)
    v = scores[r, c]
    tie = v == kth[r]
    better = torch.bincount(r[~tie], minlength=scores.shape[0])
    tie_rank = torch.cumsum(tie.long(), 0) - 1  # running count of ties, made per row below
    first_tie = torch.zeros_like(better)
    first_tie.scatter_reduce_(0, r[tie], tie_rank[tie], reduce="amin", include_self=False)
    keep = ~tie | (tie_rank - first_tie[r] < (k - better)[r])
    cols = c[keep].view(-1, k)  # exactly k per row, in column order
    vals, idx = scores.gather(1, cols), at(cols)
    o = torch.argsort(vals, dim=1, stable=True, descending=largest)  # columns ascend with the index
    return vals.gather(1, o), idx.gather(1, o)


class TopK:
    """The running k smallest distances of ``n`` queries (a result heap).

    Key blocks must be pushed in increasing index order for each query, so that ties keep
    the lower index. Slots not yet filled hold distance +inf and index :data:`NO_INDEX`.
    """

    def __init__(self, n: int, k: int, dtype: torch.dtype, device: torch.device):
        self.k = k
        self.distances = torch.full((n, k), torch.inf, dtype=dtype, device=device)
        self.indices = torch.full((n, k), NO_INDEX, dtype=torch.int64, device=device)
        self.filled = 0

    def push(self, rows: slice, scores: torch.Tensor, index: torch.Tensor) -> None:
        """Merge ``scores`` (rows × m) with column indices ``index`` (m, or rows × m)."""
        self.push_selected(rows, *smallest_k(scores, index, min(self.k, scores.shape[1])))

    def push_selected(self, rows: slice, d: torch.Tensor, i: torch.Tensor) -> None:
        """Merge the k smallest of a block, already selected and ordered (``smallest_k``)."""
        if self.filled:
            d = torch.cat([self.distances[rows, :self.filled], d], 1)
            i = torch.cat([self.indices[rows, :self.filled], i], 1)
            d, i = smallest_k(d, i, min(self.k, d.shape[1]))
        self.distances[rows, :d.shape[1]] = d
        self.indices[rows, :d.shape[1]] = i

    def close_block(self, width: int) -> None:
        """Record that every query has now seen ``width`` more keys."""
        self.filled = min(self.k, self.filled + width)

    def result(self, offsets: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(distances, indices); with ``offsets``, the pushed scores were −φᵀψ and o(q) is added."""
        if offsets is None:
            return self.distances, self.indices
        return with_offsets(offsets, self.distances, self.indices)


def with_offsets(offsets: torch.Tensor, distances: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """o(q) added to ascending rows of −φᵀψ: still ascending (rounding is monotone), but new
    ties in the rounded sums must be ordered by the lower index."""
    d = offsets[:, None] + distances
    if bool(((d[:, 1:] == d[:, :-1]) & (indices[:, 1:] < indices[:, :-1])).any()):
        return smallest_k(d, indices, d.shape[1])
    return d, indices


# --------------------------------------------------------------------- blocks
def block_shape(n_q: int, n_keys: int, feature_dim: int, item: int, k: int, memory_budget: int,
                keys_given: bool = False) -> tuple[int, int]:
    """(query rows, key rows) of one block under ``memory_budget`` bytes.

    A key block computed on the fly, with the temporaries of computing it
    (:data:`FEATURE_TRANSIENT`), takes at most :data:`KEY_SHARE` of the budget (none when the
    key features are already stored, ``keys_given``), one score block with the running top-k
    :data:`SCORE_SHARE`; the rest is headroom for the GEMM's own buffers.
    """
    budget = int(memory_budget)
    per_key = feature_dim * item * FEATURE_TRANSIENT
    key_rows = MAX_KEY_BLOCK if keys_given else max(1, int(budget * KEY_SHARE) // per_key)
    key_rows = max(1, min(n_keys, MAX_KEY_BLOCK, key_rows))
    left = int(budget * SCORE_SHARE)
    # per query: one score row and the GEMM's buffer for it, plus the merge of two k-lists
    # (values + int64 indices)
    per_query = key_rows * item * GEMM_TRANSIENT + 4 * k * (item + 8)
    query_rows = max(1, min(n_q, left // per_query))
    return query_rows, key_rows


def _key_blocks(keys: torch.Tensor | Iterable[torch.Tensor], rows: int) -> Iterator[torch.Tensor]:
    """Blocks of at most ``rows`` key rows, in order, from one tensor or a sequence of them."""
    for block in ([keys] if isinstance(keys, torch.Tensor) else keys):
        for start in range(0, block.shape[0], rows):
            yield block[start:start + rows]


def _scores(offsets: torch.Tensor, phi: torch.Tensor, psi: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """o[:, None] − φ ψᵀ into ``out`` (one GEMM)."""
    out.copy_(offsets[:, None].expand_as(out))
    return out.addmm_(phi, psi.T, alpha=-1)


def _exclude(scores: torch.Tensor, exclude: torch.Tensor | None, rows: slice, k0: int) -> None:
    """Set the excluded (query, key) pairs of this block of φᵀψ to −inf (never among the largest)."""
    if exclude is None:
        return
    ex = exclude[rows] - k0
    hit = (ex >= 0) & (ex < scores.shape[1])
    if bool(hit.any()):
        r, c = torch.nonzero(hit, as_tuple=True)
        scores[r, ex[r, c]] = -torch.inf


def knn(offsets: torch.Tensor, phi: torch.Tensor, keys: torch.Tensor | Iterable[torch.Tensor], k: int, *,
        n_keys: int | None = None, exclude: torch.Tensor | None = None, memory_budget: int = DEFAULT_MEMORY_BUDGET,
        keys_given: bool = True, progress: bool | None = None, desc: str = "search") -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of ``o(q) − φ(q)ᵀψ(g)`` over key features streamed in blocks.

    Parameters
    ----------
    offsets, phi : (n, ), (n, D)
        Query terms.
    keys : tensor (m, D) or iterable of tensors (m_b, D)
        Key features ψ in index order; an iterable is consumed once (features computed
        or read block by block).
    k : int
        Neighbours per query (at most the number of keys left after exclusion).
    n_keys : int, optional
        Number of keys, for block sizing and the progress bar (default: ``len(keys)``).
    exclude : (n, e) int64 tensor, optional
        Key indices each query must not return (−1: none).
    memory_budget : int
        Bytes of one score block plus, unless ``keys_given``, one block of key features.
    keys_given : bool
        The key features already exist (an index); otherwise blocks are produced on demand.

    Returns
    -------
    distances, indices : (n, k)
        Ascending; ties broken by the lower index.
    """
    n_q, D = phi.shape
    if n_keys is None:
        n_keys = keys.shape[0] if isinstance(keys, torch.Tensor) else None
    if exclude is not None and exclude.ndim == 1:
        exclude = exclude[:, None]
    q_rows, g_rows = block_shape(n_q, n_keys or MAX_KEY_BLOCK, D, phi.element_size(), k, memory_budget, keys_given)
    if isinstance(keys, (list, tuple)) and len(keys) == 1:
        keys = keys[0]
    if isinstance(keys, torch.Tensor) and keys.shape[0] <= g_rows and q_rows >= n_q and exclude is None:
        return _knn_one_block(offsets, phi, keys, k)
    heap = TopK(n_q, k, phi.dtype, phi.device)
    show = progress if progress is not None else float(n_q) * (n_keys or 0) * D > PROGRESS_WORK
    bar = progress_bar(total=n_keys, show=show, desc=desc, unit="key")
    for rows, k0, scores in _scored_blocks(phi, keys, exclude, q_rows, g_rows):
        if scores.dtype != heap.distances.dtype:  # keys kept in float64: rank in float64
            heap.distances = heap.distances.to(scores.dtype)
        # a row's top-k does not depend on its offset o(q): rank by the largest φᵀψ (torch's CPU
        # top-k is faster for the largest), give −φᵀψ to the heap and add o(q) to the k results
        m = scores.shape[1]
        s, i = largest_k(scores, None, min(k, m))
        heap.push_selected(rows, s.neg_(), i + k0)
        if rows.stop == n_q:
            heap.close_block(m)
            bar.update(m)
    bar.close()
    return heap.result(offsets.to(heap.distances.dtype))


def _scored_blocks(phi: torch.Tensor, keys: torch.Tensor | Iterable[torch.Tensor], exclude: torch.Tensor | None,
                   q_rows: int, g_rows: int) -> Iterator[tuple[slice, int, torch.Tensor]]:
    """``(query rows, first key, φψᵀ)`` of every (query block × key block), key blocks in order, the
    excluded pairs at −inf; keys kept in a wider dtype than φ (float64) are scored in that dtype."""
    n_q, buffer, widened, k0 = phi.shape[0], None, None, 0
    for psi in _key_blocks(keys, g_rows):
        if torch.promote_types(psi.dtype, phi.dtype) != phi.dtype:
            phi, buffer = phi.to(psi.dtype), None
        if buffer is None:
            buffer = torch.empty(q_rows * g_rows, dtype=phi.dtype, device=phi.device)
        m = psi.shape[0]
        if psi.dtype != phi.dtype:  # narrower keys (float16): widened into one reused buffer
            if widened is None or widened.shape[1] != psi.shape[1]:
                widened = torch.empty(g_rows, psi.shape[1], dtype=phi.dtype, device=phi.device)
            psi = widened[:m].copy_(psi)
        for q0 in range(0, n_q, q_rows):
            rows = slice(q0, min(n_q, q0 + q_rows))
            scores = torch.mm(phi[rows], psi.T, out=buffer[:(rows.stop - q0) * m].view(-1, m))
            _exclude(scores, exclude, rows, k0)
            yield rows, k0, scores
        k0 += m


def divergence_slack(dim: int, offsets: Any, phi_norm: Any, key_norm: float) -> Any:
    """Bound on the float32 rounding of divergences o(q) − φ(q)ᵀψ(g) computed from ``dim``-vectors
    with ‖ψ‖ ≤ ``key_norm``: 4(dim + 2)·u·(|o| + ‖φ‖·M), Higham's γ bound doubled (two computations
    compared). Numpy arrays or torch tensors, per query."""
    return 4.0 * (dim + 2) * U32 * (abs(offsets) + phi_norm * key_norm)


def knn_within(offsets: torch.Tensor, phi: torch.Tensor, keys: torch.Tensor | Iterable[torch.Tensor], k: int,
               slack: torch.Tensor, *, n_keys: int, exclude: torch.Tensor | None = None, allow: np.ndarray | None = None,
               memory_budget: int = DEFAULT_MEMORY_BUDGET) -> tuple[torch.Tensor, torch.Tensor]:
    """Every key whose score o(q) − φ(q)ᵀψ(g) is within 2·``slack``(q) of the query's k-th smallest, in one pass.

    When each score is within ``slack`` of a key's exact distance, these keys hold the exact top-k:
    the shortlist of an exact re-rank (:class:`anchordiv.contexts.FeatureStore`). The k-th is
    tracked block by block with :class:`TopK`; a key is kept while within the window of the k-th
    found so far, which only tightens. ``allow`` (sorted positions) and ``exclude`` (n, e
    positions, −1 none) restrict the keys as in :func:`restricted_knn`.

    Returns
    -------
    queries, positions : 1-D int64 tensors
        The (query, key position) pairs of the shortlists, queries ascending.
    """
    n_q, D = phi.shape
    if allow is not None:
        keys, n_keys = allowed_blocks(keys, allow), allow.size
        exclude = None if exclude is None else _among(exclude, allow)
    if exclude is not None and exclude.ndim == 1:
        exclude = exclude[:, None]
    q_rows, g_rows = block_shape(n_q, n_keys, D, phi.element_size(), k, memory_budget, True)
    heap = TopK(n_q, k, phi.dtype, phi.device)
    reach = (2 * slack).to(phi.dtype)
    found_q, found_p, found_s = [], [], []
    for rows, k0, scores in _scored_blocks(phi, keys, exclude, q_rows, g_rows):
        m = scores.shape[1]
        s, i = largest_k(scores, None, min(k, m))
        heap.push_selected(rows, s.neg(), i + k0)
        if rows.stop == n_q:
            heap.close_block(m)
        # φψ ≥ −(k-th best −φψ) − 2ε; the k-th is +inf until k keys are seen, which keeps every key.
        # A query whose block top-k ends below that floor finds its window keys in the top-k.
        floor = -heap.distances[rows, -1] - reach[rows]
        whole = (s[:, -1] >= floor) if m > k else torch.zeros_like(floor, dtype=torch.bool)
        q, c = torch.nonzero((s >= floor[:, None]) & ~whole[:, None], as_tuple=True)
        found_q.append(q + rows.start)
        found_p.append(i[q, c] + k0)
        found_s.append(s[q, c])
        if bool(whole.any()):
            w = torch.nonzero(whole).flatten()
            q, c = torch.nonzero(scores[w] >= floor[w, None], as_tuple=True)
            found_q.append(w[q] + rows.start)
            found_p.append(c + k0)
            found_s.append(scores[w[q], c])
    q, pos, score = torch.cat(found_q), torch.cat(found_p), torch.cat(found_s)
    keep = score >= (-heap.distances[:, -1] - reach)[q]  # the window of the final k-th
    q, pos = q[keep], pos[keep]
    order = torch.argsort(q, stable=True)
    q, pos = q[order], pos[order]
    if allow is not None:
        pos = torch.from_numpy(allow).to(pos.device)[pos]
    return q, pos


def _among(exclude: torch.Tensor, allow: np.ndarray) -> torch.Tensor:
    """Excluded positions as positions among the sorted ``allow`` (−1 where not allowed)."""
    ex = exclude.cpu().numpy()
    at = np.clip(np.searchsorted(allow, ex), 0, max(0, allow.size - 1))
    return torch.from_numpy(np.where((allow.size > 0) & (allow[at] == ex), at, -1)).to(exclude.device)


def _knn_one_block(offsets: torch.Tensor, phi: torch.Tensor, psi: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`knn` when all keys and queries fit in one block: one GEMM, one selection."""
    if psi.dtype != phi.dtype:
        psi = psi.to(torch.promote_types(psi.dtype, phi.dtype))
        phi = phi.to(psi.dtype)
    if offsets.dtype != phi.dtype:
        offsets = offsets.to(phi.dtype)
    scores = torch.mm(phi, psi.T)
    if k < scores.shape[1] and _small(scores, scores.shape[0] * (k + 1)) and not offsets.requires_grad:
        top, pos = torch.topk(scores, k + 1)  # the largest, sorted
        return _order_small(scores, top.numpy(), pos.numpy(), k, True, offsets.numpy()[:, None])
    s, i = largest_k(scores, None, k)
    return with_offsets(offsets, s.neg_(), i)


def distance_matrix(offsets: torch.Tensor, phi: torch.Tensor, keys: torch.Tensor | Iterable[torch.Tensor], *,
                    n_keys: int, memory_budget: int = DEFAULT_MEMORY_BUDGET, keys_given: bool = True,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """The full (n, n_keys) matrix ``o(q) − φ(q)ᵀψ(g)``, computed with the blocks of :func:`knn`."""
    n_q, D = phi.shape
    out = torch.empty(n_q, n_keys, dtype=phi.dtype, device=phi.device) if out is None else out
    _, g_rows = block_shape(n_q, n_keys, D, phi.element_size(), 1, memory_budget, keys_given)
    k0 = 0
    for psi in _key_blocks(keys, g_rows):
        m = psi.shape[0]
        _scores(offsets, phi, psi.to(phi.dtype), out[:, k0:k0 + m])
        k0 += m
    return out


def allowed_blocks(blocks: Iterable[torch.Tensor], allow: np.ndarray) -> Iterator[torch.Tensor]:
    """The rows at sorted positions ``allow`` of the row blocks ``blocks`` (in position order), block by block."""
    start = 0
    for block in blocks:
        lo, hi = np.searchsorted(allow, [start, start + block.shape[0]])
        if hi > lo:
            yield block[torch.from_numpy(allow[lo:hi] - start).to(block.device)]
        start += block.shape[0]


def restricted_knn(offsets: torch.Tensor, phi: torch.Tensor, blocks: Iterable[torch.Tensor], k: int, n: int, exclude: torch.Tensor | None,
                   allow: np.ndarray | None, memory_budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k positions over the stored key ``blocks`` (``n`` rows), among the sorted positions
    ``allow`` only when given; ``exclude`` (n_q, e) holds positions each query must skip."""
    if allow is not None:
        blocks, n = allowed_blocks(blocks, allow), allow.size
        if exclude is not None:  # positions among the allowed rows
            exclude = _among(exclude, allow)
    d, p = knn(offsets, phi, blocks, k, n_keys=n, exclude=exclude, memory_budget=memory_budget,
               keys_given=True, progress=False)
    if allow is not None:
        p = torch.from_numpy(allow).to(p.device)[p]
    return d, p


# ------------------------------------------------------------------- geometry
def key_feature_blocks(geometry: Any, G: Any, symmetric: bool, memory_budget: int = DEFAULT_MEMORY_BUDGET,
                       width: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, ψ)`` of the rows of ``G`` from row ``start``, in blocks whose features and their
    transients take :data:`KEY_SHARE` of ``memory_budget`` (:func:`block_shape`); ψ in the compute
    dtype (float64 where float32 cannot resolve the geometry). ``width``: the feature width, when
    known (otherwise read off one row)."""
    g, _ = geometry.check_input(G, "G")
    if width is None:
        width = int(geometry.key_terms(g[:1], symmetric, compute_dtype=True).shape[1])
    rows = block_shape(1, g.shape[0], width, g.element_size(), 1, memory_budget)[1]
    for start in range(0, g.shape[0], rows):
        yield start, geometry.key_terms(g[start:start + rows], symmetric, compute_dtype=True)


def prepare(geometry: Any, Q: Any, G: Any) -> tuple[torch.Tensor, torch.Tensor, Kind]:
    """Checked compute tensors of ``Q`` and ``G`` in one dtype, and how to return results."""
    q, kind = geometry.check_input(Q, "Q")
    g, _ = geometry.check_input(G, "G")
    if q.dtype != g.dtype:
        dtype = torch.promote_types(q.dtype, g.dtype)
        q, g = q.to(dtype), g.to(dtype)
    return q, g, kind


def search(geometry: Any, Q: Any, G: Any, k: int = 10, symmetric: bool = True, exclude_self: bool = False,
           memory_budget: int = DEFAULT_MEMORY_BUDGET, progress: bool | None = None,
           exclude: Any = None) -> tuple[Any, Any]:
    """Exact top-k neighbours of each query under ``geometry`` (lower is closer).

    Parameters
    ----------
    geometry : Geometry
        A fitted anchor model or baseline.
    Q, G : array-like (|Q|, d), (|G|, d)
        Queries and gallery (numpy or torch; results come back in the same kind).
    k : int
        Neighbours per query.
    symmetric : bool
        Rank by ½[d(q‖g) + d(g‖q)] (eq. F.1) when True, by d(q‖g) otherwise.
    exclude_self : bool
        Retrieval within one set: query i never returns gallery item i. Q and G must be
        the same data (the same object, or equal arrays); otherwise a ``ValueError``.
    memory_budget : int
        Bytes of one key-feature block and one score block together.
    progress : bool, optional
        Force the progress bar on or off (default: shown for long searches); False also
        silences the bars of the feature maps computed for this search.
    exclude : array-like (|Q|,) or (|Q|, e) of int, optional
        Gallery indices that each query must not return, −1 for none (e.g. the query's
        own row in G when some queries are gallery items).

    Returns
    -------
    distances, indices : (|Q|, k)
        Sorted ascending; ties are broken by the lower gallery index.
    """
    q, g, kind = prepare(geometry, Q, G)
    k = positive_int(k, "k")
    memory_budget = positive_int(memory_budget, "memory_budget")
    if exclude_self:
        if exclude is not None:
            raise ValueError("Pass either exclude_self=True or exclude=..., not both.")
        check_same_set(Q, G, q, g)
        exclude = torch.arange(q.shape[0], device=q.device)[:, None]
    elif exclude is not None:
        exclude = exclusions(exclude, q.shape[0], g.shape[0], q.device)
    available = g.shape[0] - (0 if exclude is None else int(exclude.ge(0).sum(1).max()))
    if k > available:
        raise ValueError(f"k={k} exceeds the {available} gallery items available; pass k <= {available}.")
    with progress_scope(progress):
        offsets, phi = geometry.query_terms(q, symmetric, compute_dtype=True)
        blocks = (psi for _, psi in key_feature_blocks(geometry, g, symmetric, memory_budget, phi.shape[1]))
        d, i = knn(offsets, phi, blocks, k, n_keys=g.shape[0],
                   exclude=exclude, memory_budget=memory_budget, keys_given=False, progress=progress,
                   desc=f"search ({type(geometry).__name__})")
    return kind.out(d), (i.cpu().numpy() if kind.is_numpy else i)


def exclusions(exclude: Any, n_q: int, n_keys: int, device: torch.device) -> torch.Tensor:
    """``exclude`` as an (n_q, e) int64 tensor of key indices in [−1, n_keys), or a ``ValueError``."""
    t = torch.as_tensor(exclude.cpu() if isinstance(exclude, torch.Tensor) else exclude)
    if t.dtype == torch.bool or t.dtype.is_floating_point or t.dtype.is_complex:
        raise ValueError(f"exclude must hold integer gallery indices (−1 for none), got dtype {t.dtype}.")
    t = t.to(torch.int64)
    if t.ndim == 1:
        t = t[:, None]
    if t.ndim != 2 or t.shape[0] != n_q:
        raise ValueError(f"exclude must have one row per query ({n_q}), got shape {tuple(t.shape)}.")
    if t.numel() and (int(t.min()) < -1 or int(t.max()) >= n_keys):
        raise ValueError(f"exclude holds indices outside [-1, {n_keys}); pass gallery row numbers or -1.")
    return t.to(device)


def check_same_set(Q: Any, G: Any, q: torch.Tensor, g: torch.Tensor) -> None:
    """Raise unless ``Q`` and ``G`` are the same data (one object, or equal values)."""
    if Q is G:
        return
    if q.shape == g.shape and bool(torch.equal(q, g.to(q.dtype))):
        return
    raise ValueError(
        "exclude_self=True needs Q and G to be the same data (pass the same array twice); "
        f"got different arrays ({q.shape[0]} and {g.shape[0]} rows). To search another set, drop exclude_self."
    )


__all__ = ["search", "knn", "knn_within", "divergence_slack", "restricted_knn", "allowed_blocks", "distance_matrix", "smallest_k", "largest_k", "TopK", "block_shape", "key_feature_blocks",
           "DEFAULT_MEMORY_BUDGET"]
