"""Exact, memory-bounded top-k search for every geometry.

Every geometry satisfies ``pairwise(Q, G) = o(Q)[:, None] − φ(Q) ψ(G)ᵀ`` (the feature-map
contract of :class:`anchordiv.Geometry`), so exact search is a blocked matrix product
followed by a running top-k. Memory holds one score block of at most ``memory_budget``
bytes plus the features; |Q|×|G| is never materialised beyond that.
"""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from ._backend import Kind, as_tensor

#: Default byte budget for one block of scores.
DEFAULT_MEMORY_BUDGET = 256 * 2**20
#: Work (multiply-adds) above which a progress bar is shown.
PROGRESS_WORK = 2e10


def _sorted_topk(scores: torch.Tensor, index: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest of each row, ordered by (distance, index).

    ``index`` holds the global index of every column (ascending along a row, or per row).
    Ties at the k-th place are resolved by the lower index, deterministically.
    """
    n = scores.shape[1]
    if k >= n:
        order = torch.argsort(index, dim=1, stable=True) if index.ndim == 2 else None
        if order is not None:
            scores, index = scores.gather(1, order), index.gather(1, order)
        else:
            index = index.expand_as(scores)
        d, o = torch.sort(scores, dim=1, stable=True)
        return d, index.gather(1, o)
    index = index.expand_as(scores) if index.ndim == 1 or index.shape[0] != scores.shape[0] else index
    top_vals, top_pos = torch.topk(scores, k + 1, dim=1, largest=False, sorted=True)
    # rows where the (k+1)-th value ties the k-th: the candidate set may be ambiguous
    tied = top_vals[:, k] == top_vals[:, k - 1]
    vals, pos = top_vals[:, :k], top_pos[:, :k]
    idx = index.gather(1, pos)
    # order candidates by (distance, index): sort by index, then stable sort by distance
    o = torch.argsort(idx, dim=1, stable=True)
    vals, idx = vals.gather(1, o), idx.gather(1, o)
    o = torch.argsort(vals, dim=1, stable=True)
    vals, idx = vals.gather(1, o), idx.gather(1, o)
    if bool(tied.any()):
        rows = torch.nonzero(tied).flatten()
        s, i = scores[rows], index[rows]
        o = torch.argsort(i, dim=1, stable=True)
        s, i = s.gather(1, o), i.gather(1, o)
        d, o = torch.sort(s, dim=1, stable=True)
        vals[rows], idx[rows] = d[:, :k], i.gather(1, o)[:, :k]
    return vals, idx


def search(geometry: Any, Q: Any, G: Any, k: int = 10, symmetric: bool = True, exclude_self: bool = False,
           memory_budget: int = DEFAULT_MEMORY_BUDGET, progress: bool | None = None) -> tuple[Any, Any]:
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
        Retrieval within one set (Q is G): query i never returns gallery item i.
    memory_budget : int
        Bytes allowed for one block of scores.
    progress : bool, optional
        Force the progress bar on or off (default: shown for long searches).

    Returns
    -------
    distances, indices : (|Q|, k)
        Sorted ascending; ties are broken by the lower gallery index.
    """
    q, kind = geometry._input(Q, "Q")
    g, _ = geometry._input(G, "G")
    n_q, n_g = q.shape[0], g.shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}.")
    if exclude_self and n_q != n_g:
        raise ValueError(f"exclude_self=True needs Q and G to be the same set, got {n_q} and {n_g} rows.")
    available = n_g - (1 if exclude_self else 0)
    if k > available:
        raise ValueError(f"k={k} exceeds the {available} gallery items available; pass k <= {available}.")
    if q.dtype != g.dtype:
        dtype = torch.promote_types(q.dtype, g.dtype)
        q, g = q.to(dtype), g.to(dtype)
    offsets, phi = geometry._query_terms(q, symmetric)
    item = phi.element_size()
    g_block = max(k + 1, min(n_g, 1 << 16))
    q_block = max(1, min(n_q, int(memory_budget) // (g_block * item)))
    work = float(n_q) * n_g * phi.shape[1]
    show = progress if progress is not None else work > PROGRESS_WORK
    best_d = best_i = None
    bar = tqdm(total=n_g, desc=f"search ({type(geometry).__name__})", unit="key", disable=not show, leave=False)
    for g0 in range(0, n_g, g_block):
        g1 = min(n_g, g0 + g_block)
        psi = geometry._key_terms(g[g0:g1], symmetric)
        cols = torch.arange(g0, g1, device=q.device)
        part_d, part_i = [], []
        for q0 in range(0, n_q, q_block):
            q1 = min(n_q, q0 + q_block)
            scores = torch.addmm(offsets[q0:q1, None], phi[q0:q1], psi.T, alpha=-1)
            if exclude_self:
                rows = torch.arange(q0, q1, device=q.device)
                scores[(rows[:, None] == cols[None, :])] = torch.inf
            kk = min(k, g1 - g0)
            d, i = _sorted_topk(scores, cols, kk)
            if best_d is not None:
                d, i = _sorted_topk(torch.cat([best_d[q0:q1], d], 1), torch.cat([best_i[q0:q1], i], 1), min(k, best_d.shape[1] + kk))
            part_d.append(d)
            part_i.append(i)
        best_d, best_i = torch.cat(part_d), torch.cat(part_i)
        bar.update(g1 - g0)
    bar.close()
    return kind.out(best_d), (best_i.cpu().numpy() if kind.is_numpy else best_i)
