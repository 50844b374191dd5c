"""Certificates that an approximate top-k is exact, for keys in an L2 layout (:mod:`._layout`).

In both layouts the divergence is an increasing affine function of the squared L2 distance
between the query vector y and the stored key vector x (``VectorLayout.l2_squared``), so a
shortlist re-ranked exactly is the exact top-k as soon as every key left out is provably
farther from y than the k-th result. Two bounds cover the keys left out:

* keys an exhaustive scan saw but did not shortlist (a flat index, or the probed lists of an
  IVF index): faiss kept the s nearest, so each of them is at least the s-th distance away;
* keys in an IVF list j that was not probed, with centroid c_j and radius r_j: in the
  ``euclidean`` layout r_j = max_{x ∈ j} ‖x − c_j‖ and the triangle inequality gives
  ‖y − x‖ ≥ ‖y − c_j‖ − r_j (the ball bound of metric trees); in the ``augmented`` layout,
  where y = [φ, 0] and every ‖x‖ = M, r_j is the radius of the ψ part alone and
  Cauchy–Schwarz gives yᵀx ≤ yᵀc_j + ‖y‖ r_j, so ‖y − x‖² ≥ ‖y‖² + M² − 2(yᵀc_j + ‖y‖ r_j)
  (the ball bound for inner products, Ram & Gray 2012), which does not lose the factor
  M/‖φ‖ that the metric bound would on vectors padded to norm M.

A query is certified when the smaller bound exceeds the k-th result's squared distance by
more than the float32 rounding of the distances compared (:func:`rounding_slack`). A graph
index (HNSW) gives no such bound, so its queries are never certified.

Routed IVF lists (cells of the embeddings, lists of the most probable anchor) are scanned with
the divergence itself, and bounded in the divergence by a geometry's :class:`FeatureBound`
d(q, g) ≥ w‖u(q) − u(g)‖² (softmax: co-coercivity of ∇κ, u = ∇κ). The keys of one (cell,
anchor) pair form a group whose u lie in a ball (m, ρ), so an unscanned group is at least
w·(‖u(q) − m‖ − ρ)² away (:func:`ball_bounds`). At small τ the u of a group collapse onto
its anchor, so these balls are tight where the embedding cells are not. A query that the first
scan does not certify scans, in a second round, the anchor lists of every group whose bound is
below its k-th result, after which every group left is bounded above it.
"""

from __future__ import annotations

import numpy as np
import torch

from ..exact import U32, divergence_slack  # noqa: F401 (divergence_slack: the routed certificates' margin)

#: Unit roundoff of float32.
FLOAT32_EPS = U32


def rounding_slack(dim: int, scale: np.ndarray) -> np.ndarray:
    """Bound on the float32 rounding of a squared distance or inner product of ``dim`` terms
    between vectors of norms summing to ``scale``: 4(dim + 2)·u·scale², with the unit roundoff u
    (Higham's γ_n bound, doubled for the two computations compared)."""
    return 4.0 * (dim + 2) * FLOAT32_EPS * np.square(scale)


def list_radii(index, dims: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """r_j = max ‖x − c_j‖ over the vectors stored in each list of a faiss ``IndexIVFFlat``
    (0 for an empty list), over all coordinates and over the first ``dims`` only, in float64,
    rounded up by a relative 1e-6."""
    from faiss.contrib.inspect_tools import get_invlist

    centroids = np.asarray(index.quantizer.reconstruct_n(0, index.nlist)).astype(np.float64)
    radii, part = np.zeros(index.nlist), np.zeros(index.nlist)
    for j in range(index.nlist):
        _, codes = get_invlist(index.invlists, j)
        if len(codes):
            diff2 = (codes.view(np.float32).reshape(len(codes), index.d).astype(np.float64) - centroids[j]) ** 2
            radii[j], part[j] = np.sqrt(diff2.sum(1).max()), np.sqrt(diff2[:, :dims].sum(1).max())
    return radii * (1 + 1e-6), part * (1 + 1e-6)


def unprobed_bound(y: np.ndarray, centroids: np.ndarray, radii: tuple[np.ndarray, np.ndarray],
                   probed: np.ndarray, norm: float | None = None) -> np.ndarray:
    """min over the lists not in ``probed`` (n, nprobe) of the lower bound on ‖y − x‖² of
    their keys, per query (+inf when every list was probed): max(0, ‖y − c_j‖ − r_j)², and
    with the keys' common ``norm`` M (augmented layout) the larger of that and
    ‖y‖² + M² − 2(yᵀc_j + ‖y‖ r'_j), r'_j the radius of the ψ part (``radii`` = (r, r'))."""
    y = y.astype(np.float64)
    y2, yc = (y * y).sum(1)[:, None], y @ centroids.T
    dist = np.sqrt(np.clip(y2 - 2 * yc + (centroids * centroids).sum(1)[None, :], 0, None))
    gap = np.clip(dist - radii[0][None, :], 0, None) ** 2
    if norm is not None:
        gap = np.maximum(gap, y2 + norm ** 2 - 2 * (yc + np.sqrt(y2) * radii[1][None, :]))
    rows = np.arange(len(y))[:, None]
    gap[rows, probed[:, :]] = np.inf
    return gap.min(1) if gap.shape[1] else np.full(len(y), np.inf)


def scanned_bound(shortlist_distances: np.ndarray, shortlist_ids: np.ndarray) -> np.ndarray:
    """Lower bound on the squared distance of the scanned keys not shortlisted: the last
    (s-th) shortlist distance when the shortlist is full, else +inf (nothing was left out)."""
    full = shortlist_ids[:, -1] >= 0
    return np.where(full, shortlist_distances[:, -1].astype(np.float64), np.inf)


def certified(kth_l2: np.ndarray, unseen_bound: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """Queries whose k-th squared distance is below every left-out key's bound by more than ``slack``."""
    return unseen_bound > kth_l2 + slack


def group_balls(blocks, groups: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(centroids m_g (count, dim), radii ρ_g = max ‖u − m_g‖) of key rows u grouped by their group
    number ``groups`` (n,), in float64, radii rounded up by a relative 1e-6 (0 for an empty group).
    ``blocks()`` yields (start, u) blocks of the rows in order; it is called twice."""
    sums, sizes = None, np.bincount(groups, minlength=count).astype(np.float64)
    for start, u in blocks():
        u = np.asarray(u, dtype=np.float64)
        if sums is None:
            sums = np.zeros((count, u.shape[1]))
        np.add.at(sums, groups[start:start + len(u)], u)
    centroids = sums / np.maximum(sizes, 1)[:, None]
    radii = np.zeros(count)
    for start, u in blocks():
        g = groups[start:start + len(u)]
        np.maximum.at(radii, g, np.linalg.norm(np.asarray(u, dtype=np.float64) - centroids[g], axis=1))
    return centroids, radii * (1 + 1e-6)


def ball_bounds(u: np.ndarray, centroids: np.ndarray, radii: np.ndarray, weight: float, error: float) -> np.ndarray:
    """(n, groups) float32 lower bounds w·max(0, ‖u − m_g‖ − ρ_g − 2e)² on d(q, g) for the keys of each
    group, from a :class:`FeatureBound` (``weight`` w, ``error`` e: u of the query and of the key are
    both rounded) and the queries' ``u`` (n, dim). ‖u − m_g‖² = ‖u‖² + ‖m_g‖² − 2uᵀm_g is one float32
    GEMM, lowered by its rounding bound 4(dim + 2)·u₃₂·(‖u‖ + max‖m‖)² before the square root; the
    float32 steps after it round by a few u₃₂ relative, taken off by a factor 1 − 1e-5."""
    u_norm = np.linalg.norm(u.astype(np.float64), axis=1)
    c_norm = np.linalg.norm(centroids, axis=1)
    rounding = 4.0 * (u.shape[1] + 2) * FLOAT32_EPS * (u_norm + c_norm.max(initial=0.0)) ** 2 + 1e-30
    dist2 = torch.addmm(torch.from_numpy((c_norm ** 2).astype(np.float32))[None, :],
                        torch.from_numpy(u.astype(np.float32)), torch.from_numpy(centroids.astype(np.float32)).T,
                        alpha=-2)
    dist2 += torch.from_numpy((u_norm ** 2 - rounding).astype(np.float32))[:, None]
    gap = dist2.clamp_min_(0).sqrt_().sub_(torch.from_numpy((radii + 2 * error).astype(np.float32))[None, :])
    return gap.clamp_min_(0).square_().mul_(weight * (1 - 1e-5)).numpy()
