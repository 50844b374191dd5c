r"""Retrieval metrics: AP, recall/precision@k, R-precision, mAP@R, MRR, nDCG, bootstrap intervals.

Conventions
-----------
Every function here ranks by **distance**: the item with the *lowest* distance
comes first.  ``distances`` is either one query's row, shape ``(G,)``, or a
matrix of shape ``(Q, G)`` (``Q`` queries against ``G`` gallery / key items).
``relevant`` has the same shape and says which items count as hits; it is
boolean or holds only 0 and 1.

Inputs may be NumPy arrays, anything :func:`numpy.asarray` accepts, or torch
tensors (these are detached and copied to the CPU; torch itself is never
imported by this module).

Average precision
-----------------
For one query, let the distinct distance values, sorted increasingly, be the
thresholds :math:`t_1 < t_2 < \dots < t_N`.  With :math:`P` the number of
relevant items, define at threshold :math:`n`

.. math::

    \mathrm{TP}_n = \#\{g : d_g \le t_n,\ g \text{ relevant}\}, \qquad
    R_n = \frac{\mathrm{TP}_n}{P}, \qquad
    P_n = \frac{\mathrm{TP}_n}{\#\{g : d_g \le t_n\}},

and :math:`R_0 = 0`.  Then

.. math::

    \mathrm{AP} = \sum_{n=1}^{N} (R_n - R_{n-1})\, P_n .

Items with equal distance form one threshold: the precision of a block of tied
items is computed after the *whole* block, so the result does not depend on
how ties are ordered.  This is exactly the definition used by
``sklearn.metrics.average_precision_score(relevant, -distances)``.  An
equivalent form, used for computation, sums over the relevant items
:math:`g`: :math:`\mathrm{AP} = \frac{1}{P}\sum_{g \text{ relevant}}
P_{n(g)}`, where :math:`n(g)` is the threshold of :math:`g`'s tie block.

Mean average precision averages AP over queries that have at least one
relevant item; queries without one are skipped and counted.

Ranking metrics
---------------
:func:`recall_at_k`, :func:`precision_at_k`, :func:`r_precision`,
:func:`map_at_r`, :func:`reciprocal_rank` (its mean is MRR) and
:func:`ndcg_at_k` (binary or graded relevance) take the same inputs as
:func:`average_precision` (``exclude_self``, ``batch_size``) and return one
value per query, NaN for a query without a relevant item.  With
:math:`\mathrm{rel}_i` the relevance at rank :math:`i` and :math:`R` the number
of relevant items:

.. math::

    \mathrm{R@}k = \tfrac{1}{R}\textstyle\sum_{i\le k} \mathrm{rel}_i, \quad
    \mathrm{P@}k = \tfrac{1}{k}\textstyle\sum_{i\le k} \mathrm{rel}_i, \quad
    \mathrm{RP} = \mathrm{P@}R, \quad
    \mathrm{AP@}R = \tfrac{1}{R}\textstyle\sum_{i\le R} P(i)\,\mathrm{rel}_i, \quad
    \mathrm{RR} = 1 / \min\{i : \mathrm{rel}_i = 1\}.

:data:`METRICS` maps names (``"auprc"``, ``"recall@10"``, ``"ndcg@10"``, ...)
to these functions with one signature, ``f(distances, relevant, *,
exclude_self=False, batch_size=None)``; :func:`get_metric` builds any cutoff.
They agree with ``ranx`` (tests/test_metrics_ir.py).

Ties
----
Like AP, every ranking metric is independent of the order of tied items.  A
metric with a cutoff cannot take a tied block "as a whole" when the block
straddles the cutoff, so these metrics take the *expected value over the
uniformly random orders of each tied block* (McSherry & Najork 2008,
"Computing information retrieval performance measures efficiently in the
presence of tied scores", ECIR).  For recall, precision, R-precision and DCG,
which are linear in the :math:`\mathrm{rel}_i`, this replaces the relevance at
each position of a block by the block's mean relevance; mAP@R and RR use the
closed forms given in their docstrings.  Without ties every metric is the
usual one.  (AP keeps the threshold convention above, that of scikit-learn;
the two differ only for tied blocks that mix hits and misses.)

Runs
----
:func:`to_trec` writes a ranking as ``qid Q0 docid rank score tag`` lines and
:func:`to_run_dict` as ``{qid: {docid: score}}``, both with ``score =
-distance`` (higher is better), for ``trec_eval``, ``ranx``, ``pytrec_eval``
or ``ir_measures``; :func:`to_qrels_dict` writes the relevance.

Bootstrap intervals
-------------------
:func:`bootstrap_ci` and :func:`paired_difference` give a mean over queries
with a percentile bootstrap interval.  Values coming from repeated random
draws (for example several anchor sets) may be passed as a matrix
``(n_draws, Q)``; draws and queries are then both resampled.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._util import positive_int

__all__ = [
    "MAPResult",
    "BootstrapCI",
    "METRICS",
    "average_precision",
    "mean_average_precision",
    "recall_at_k",
    "precision_at_k",
    "r_precision",
    "map_at_r",
    "reciprocal_rank",
    "ndcg_at_k",
    "get_metric",
    "to_trec",
    "to_run_dict",
    "to_qrels_dict",
    "relevance_from_labels",
    "relevance_from_multilabels",
    "bootstrap_ci",
    "paired_difference",
]

# Number of matrix elements processed at once by the vectorised AP kernel.
# The kernel keeps roughly ten temporaries of this size (about 80 bytes per
# element in total), so the default uses a few hundred MiB at most.  The
# ranking kernels (recall@k, ..., nDCG) keep about twice as many and use half.
_DEFAULT_BLOCK_ELEMENTS = 1 << 22


# --------------------------------------------------------------------------- #
# Input handling
# --------------------------------------------------------------------------- #
def _to_numpy(x: Any, name: str) -> np.ndarray:
    """Convert ``x`` to a NumPy array; torch tensors go through the CPU."""
    if hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy"):
        t = x.detach().cpu()
        # NumPy has no bfloat16; widen reduced-precision floats (exactly).
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()
        x = t.numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise ValueError(f"`{name}` could not be converted to an array: {exc}") from exc


def _check_distances(distances: Any) -> np.ndarray:
    d = _to_numpy(distances, "distances")
    if d.ndim not in (1, 2):
        raise ValueError(
            f"`distances` must be 1-D (G,) or 2-D (Q, G); got shape {d.shape}"
        )
    if d.size == 0:
        raise ValueError(f"`distances` is empty (shape {d.shape})")
    if d.dtype == bool or not (
        np.issubdtype(d.dtype, np.integer) or np.issubdtype(d.dtype, np.floating)
    ):
        raise ValueError(
            f"`distances` must hold real numbers (integer or float); got dtype {d.dtype}"
        )
    if np.issubdtype(d.dtype, np.floating) and np.isnan(d).any():
        raise ValueError(
            f"`distances` contains {int(np.isnan(d).sum())} NaN value(s)"
        )
    return d


def _check_binary(x: Any, name: str) -> np.ndarray:
    """Return a boolean copy/view of a boolean or 0/1 array."""
    a = _to_numpy(x, name)
    if a.dtype == bool:
        return a
    if not (
        np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
    ):
        raise ValueError(f"`{name}` must be boolean or 0/1 numeric; got dtype {a.dtype}")
    ok = (a == 0) | (a == 1)
    if not ok.all():
        bad = a[~ok].ravel()[:5]
        raise ValueError(
            f"`{name}` must be boolean or contain only 0 and 1; found e.g. {bad.tolist()}"
        )
    return a == 1


def _check_relevant(relevant: Any, shape: tuple[int, ...]) -> np.ndarray:
    r = _check_binary(relevant, "relevant")
    if r.shape != shape:
        raise ValueError(
            f"`relevant` must have the same shape as `distances` {shape}; got {r.shape}"
        )
    return r


def _check_batch_size(batch_size: int | None, n_cols: int,
                      block_elements: int = _DEFAULT_BLOCK_ELEMENTS) -> int:
    batch_size = positive_int(batch_size, "`batch_size`", allow_none=True)
    return max(1, block_elements // max(n_cols, 1)) if batch_size is None else batch_size


# --------------------------------------------------------------------------- #
# Average precision
# --------------------------------------------------------------------------- #
def _ap_rows(d: np.ndarray, rel: np.ndarray) -> np.ndarray:
    """Tie-aware AP of every row of ``d`` (n, G) with relevance ``rel`` (n, G).

    Rows without a relevant item give NaN.
    """
    n, g = d.shape
    order = np.argsort(d, axis=1, kind="stable")
    ds = np.take_along_axis(d, order, axis=1)
    rs = np.take_along_axis(rel, order, axis=1)
    del order
    tp = np.cumsum(rs, axis=1, dtype=np.int64)  # TP after each position
    # Position j closes a tie block if it is last or the next value differs.
    is_end = np.ones((n, g), dtype=bool)
    np.not_equal(ds[:, 1:], ds[:, :-1], out=is_end[:, :-1])
    del ds
    # For every position, the index of the end of its tie block: a running
    # minimum from the right over the indices of block ends.
    cols = np.arange(g, dtype=np.int64)
    end = np.where(is_end, cols, g - 1)
    del is_end
    end = np.minimum.accumulate(end[:, ::-1], axis=1)[:, ::-1]
    # Precision at the threshold of each position's block.
    prec = np.take_along_axis(tp, end, axis=1) / (end + 1.0)
    n_pos = tp[:, -1]
    total = np.where(rs, prec, 0.0).sum(axis=1)
    out = np.full(n, np.nan)
    has = n_pos > 0
    out[has] = total[has] / n_pos[has]
    return out


def _drop_diagonal(block: np.ndarray, row_start: int) -> np.ndarray:
    """Remove entry (i, row_start + i) from each row of ``block`` (n, G)."""
    n, g = block.shape
    keep = np.ones((n, g), dtype=bool)
    keep[np.arange(n), np.arange(row_start, row_start + n)] = False
    return block[keep].reshape(n, g - 1)


def _check_square(shape: tuple[int, ...]) -> None:
    if shape[0] != shape[1]:
        raise ValueError(
            f"`exclude_self=True` needs a square `distances` (Q == G); got shape {shape}"
        )
    if shape[1] < 2:
        raise ValueError(
            f"`exclude_self=True` needs at least 2 items; `distances` has shape {shape}"
        )


def _rowwise(
    kernel: Any, d: np.ndarray, rel: np.ndarray, exclude_self: bool, batch_size: int | None,
    block_elements: int = _DEFAULT_BLOCK_ELEMENTS,
) -> np.ndarray:
    """Apply ``kernel(d_rows, rel_rows) -> (n,)`` to blocks of rows of ``d`` (Q, G).

    With ``exclude_self`` the diagonal pair is removed from each row first.  Without a
    ``batch_size``, a block holds about ``block_elements`` matrix elements.
    """
    q, g = d.shape
    if exclude_self:
        _check_square(d.shape)
    rows = _check_batch_size(batch_size, g, block_elements)
    out = np.empty(q, dtype=np.float64)
    for start in range(0, q, rows):
        stop = min(start + rows, q)
        dc, rc = d[start:stop], rel[start:stop]
        if exclude_self:
            dc, rc = _drop_diagonal(dc, start), _drop_diagonal(rc, start)
        out[start:stop] = kernel(dc, rc)
    return out


def _ap_matrix(
    d: np.ndarray, rel: np.ndarray, exclude_self: bool, batch_size: int | None
) -> np.ndarray:
    return _rowwise(_ap_rows, d, rel, exclude_self, batch_size)


def average_precision(
    distances: Any,
    relevant: Any,
    *,
    exclude_self: bool = False,
    batch_size: int | None = None,
) -> float | np.ndarray:
    r"""Per-query average precision, ranking by increasing distance.

    .. math::

        \mathrm{AP} = \sum_{n} (R_n - R_{n-1})\, P_n ,

    where :math:`n` runs over the distinct distance values in increasing
    order, and :math:`R_n` and :math:`P_n` are the recall and precision of the
    set of items whose distance is at most the :math:`n`-th value
    (:math:`R_0 = 0`).  Tied items form one threshold, so ties are
    handled exactly as in
    ``sklearn.metrics.average_precision_score(relevant, -distances)``.

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (G,) or (Q, G)
        Distances from the query (or each of ``Q`` queries) to ``G`` items.
        Lower means more similar.  Any real values are allowed, including
        negative ones and ``±inf``; NaN is rejected.
    relevant : array_like or torch.Tensor, same shape as `distances`
        Boolean, or numeric holding only 0 and 1: which items are hits.
    exclude_self : bool, default False
        For retrieval within one set (``Q == G``): drop item ``i`` from the
        ranking *and* from the relevance of query ``i`` before computing AP.
        Requires 2-D square input.
    batch_size : int or None, default None
        Number of queries processed at once (memory bound only; the result
        does not depend on it).  ``None`` picks a size from ``G``.

    Returns
    -------
    float or numpy.ndarray
        A float for 1-D input, a float64 array of length ``Q`` for 2-D input.
        A query with no relevant item gives NaN.

    Raises
    ------
    ValueError
        On empty or wrongly shaped inputs, NaN distances, or relevance that
        is neither boolean nor 0/1.

    Notes
    -----
    The computation is vectorised over queries.  Equivalently,
    :math:`\mathrm{AP} = \frac{1}{P}\sum_{g\ \mathrm{relevant}} P_{n(g)}`
    with :math:`P` the number of relevant items and :math:`n(g)` the tie
    block of item :math:`g`.

    Examples
    --------
    >>> average_precision([0.1, 0.5, 0.3], [True, False, True])
    1.0
    >>> average_precision([0.2, 0.2], [True, False])  # one tied block
    0.5
    """
    d = _check_distances(distances)
    rel = _check_relevant(relevant, d.shape)
    if d.ndim == 1:
        if exclude_self:
            raise ValueError(
                "`exclude_self=True` needs a square 2-D `distances`; got a 1-D array"
            )
        return float(_ap_matrix(d[None, :], rel[None, :], False, batch_size)[0])
    return _ap_matrix(d, rel, exclude_self, batch_size)


@dataclass(frozen=True)
class MAPResult:
    """Mean average precision over queries.

    Attributes
    ----------
    mean : float
        Mean AP over the queries that have at least one relevant item
        (NaN when every query is skipped).
    per_query : numpy.ndarray, shape (Q,)
        AP of every query; NaN where the query was skipped.
    n_queries : int
        Number of queries given, skipped ones included.
    n_skipped : int
        Number of queries without any relevant item (left out of `mean`).

    ``float(result)`` returns `mean`.
    """

    mean: float
    per_query: np.ndarray
    n_queries: int
    n_skipped: int

    @property
    def n_evaluated(self) -> int:
        """Number of queries averaged into `mean` (``n_queries - n_skipped``)."""
        return self.n_queries - self.n_skipped

    def __float__(self) -> float:
        return float(self.mean)


def mean_average_precision(
    distances: Any,
    relevant: Any,
    *,
    exclude_self: bool = False,
    batch_size: int | None = None,
) -> MAPResult:
    r"""Mean average precision over queries, skipping queries with no hit.

    .. math::

        \mathrm{mAP} = \frac{1}{|\mathcal{Q}^+|}
        \sum_{q \in \mathcal{Q}^+} \mathrm{AP}_q ,

    where :math:`\mathcal{Q}^+` is the set of queries with at least one
    relevant item and :math:`\mathrm{AP}_q` is given by
    :func:`average_precision`.

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (Q, G) or (G,)
        Query-to-item distances, lower is more similar.  A 1-D array is one
        query.
    relevant : array_like or torch.Tensor, same shape as `distances`
        Boolean or 0/1 relevance.  Build it with
        :func:`relevance_from_labels` or :func:`relevance_from_multilabels`,
        or pass any boolean matrix.
    exclude_self : bool, default False
        Retrieval within one set (``Q == G``): remove the diagonal pair
        (query ``i``, item ``i``) from both the ranking and the relevance.
    batch_size : int or None, default None
        Queries processed at once; see :func:`average_precision`.

    Returns
    -------
    MAPResult
        ``mean``, ``per_query`` (NaN for skipped queries), ``n_queries`` and
        ``n_skipped``.  ``float(result)`` is the mean.

    Raises
    ------
    ValueError
        As for :func:`average_precision`.

    Examples
    --------
    >>> res = mean_average_precision([[0.1, 0.9], [0.5, 0.2]],
    ...                              [[True, False], [False, False]])
    >>> res.mean, res.n_queries, res.n_skipped
    (1.0, 2, 1)
    """
    d = _check_distances(distances)
    rel = _check_relevant(relevant, d.shape)
    if d.ndim == 1:
        if exclude_self:
            raise ValueError(
                "`exclude_self=True` needs a square 2-D `distances`; got a 1-D array"
            )
        d, rel = d[None, :], rel[None, :]
    per_query = _ap_matrix(d, rel, exclude_self, batch_size)
    valid = ~np.isnan(per_query)
    n_valid = int(valid.sum())
    mean = float(per_query[valid].mean()) if n_valid else float("nan")
    return MAPResult(
        mean=mean,
        per_query=per_query,
        n_queries=int(per_query.size),
        n_skipped=int(per_query.size - n_valid),
    )


# --------------------------------------------------------------------------- #
# Ranking metrics (cutoffs, R-precision, mAP@R, MRR, nDCG)
# --------------------------------------------------------------------------- #
def _check_grades(relevance: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Graded relevance as float64: boolean or real, finite and >= 0."""
    a = _to_numpy(relevance, "relevance")
    if a.dtype != bool and not (
        np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
    ):
        raise ValueError(f"`relevance` must be boolean or real-valued; got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(
            f"`relevance` must have the same shape as `distances` {shape}; got {a.shape}"
        )
    a = a.astype(np.float64)
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        raise ValueError(
            "`relevance` must hold finite grades >= 0; found e.g. "
            f"{a[bad].ravel()[:5].tolist()}"
        )
    return a


def _check_k(k: Any, name: str = "`k`") -> int:
    return positive_int(k, name)


class _Ranked:
    """One block of queries ranked by distance, with the tie blocks of each position.

    For position ``i`` (0-based) of a row sorted by increasing distance:
    ``start[i]`` is the first position of its tie block, ``size[i]`` the block's
    length ``b``, ``before[i]`` the sum of the relevance ranked before the block
    (:math:`T_0`), ``block[i]`` the block's sum of relevance (:math:`h`), and
    ``expected[i] = h / b``, the expected relevance at position ``i`` when the
    block's items are put in a uniformly random order.  ``total`` is the sum of
    each row's relevance (:math:`R` for binary relevance).
    """

    def __init__(self, d: np.ndarray, rel: np.ndarray) -> None:
        n, g = d.shape
        order = np.argsort(d, axis=1, kind="stable")
        ds = np.take_along_axis(d, order, axis=1)
        rs = np.take_along_axis(rel, order, axis=1).astype(np.float64)
        del order
        cols = np.arange(g, dtype=np.int64)
        is_start = np.ones((n, g), dtype=bool)
        np.not_equal(ds[:, 1:], ds[:, :-1], out=is_start[:, 1:])
        del ds
        is_end = np.ones((n, g), dtype=bool)
        is_end[:, :-1] = is_start[:, 1:]
        start = np.maximum.accumulate(np.where(is_start, cols, 0), axis=1)
        end = np.minimum.accumulate(np.where(is_end, cols, g - 1)[:, ::-1], axis=1)[:, ::-1]
        del is_start, is_end
        cum = np.cumsum(rs, axis=1)
        self.before = np.where(
            start > 0, np.take_along_axis(cum, np.maximum(start - 1, 0), axis=1), 0.0
        )
        self.block = np.take_along_axis(cum, end, axis=1) - self.before
        self.start = start
        self.size = (end - start + 1).astype(np.float64)
        self.expected = self.block / self.size
        self.total = cum[:, -1]
        self.cols = cols

    def hits_at(self, k: np.ndarray) -> np.ndarray:
        """Expected number of relevant items in the top ``k`` (one ``k`` per row or one for all)."""
        k = np.broadcast_to(np.asarray(k), (self.expected.shape[0],))
        mask = self.cols[None, :] < k[:, None]
        return np.where(mask, self.expected, 0.0).sum(axis=1)


def _nan_where_no_hit(values: np.ndarray, total: np.ndarray) -> np.ndarray:
    out = np.full(values.shape, np.nan)
    has = total > 0
    out[has] = values[has]
    return out


def _ranking_metric(
    kernel: Any,
    distances: Any,
    relevance: Any,
    exclude_self: bool,
    batch_size: int | None,
    graded: bool = False,
) -> float | np.ndarray:
    """Validate the inputs and apply a per-row kernel; a float for 1-D input."""
    d = _check_distances(distances)
    rel = _check_grades(relevance, d.shape) if graded else _check_relevant(relevance, d.shape)
    distances_1d = d.ndim == 1
    if distances_1d:
        if exclude_self:
            raise ValueError(
                "`exclude_self=True` needs a square 2-D `distances`; got a 1-D array"
            )
        d, rel = d[None, :], rel[None, :]
    # The ranking kernels keep about twice the temporaries of the AP kernel.
    out = _rowwise(kernel, d, rel, exclude_self, batch_size, _DEFAULT_BLOCK_ELEMENTS // 2)
    return float(out[0]) if distances_1d else out


def recall_at_k(
    distances: Any,
    relevant: Any,
    k: int,
    *,
    exclude_self: bool = False,
    batch_size: int | None = None,
) -> float | np.ndarray:
    r"""Recall at cutoff :math:`k`: the fraction of the relevant items in the top :math:`k`.

    .. math::

        \mathrm{R@}k = \frac{1}{R} \sum_{i=1}^{k} \mathrm{rel}_i ,

    with :math:`R` the number of relevant items and :math:`\mathrm{rel}_i` the
    relevance at rank :math:`i` (Manning, Raghavan, Schütze 2008, ch. 8).

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (G,) or (Q, G)
        Distances, lower is closer (as in :func:`average_precision`).
    relevant : array_like or torch.Tensor, same shape as `distances`
        Boolean or 0/1 relevance.
    k : int
        Cutoff; a `k` beyond the ranking counts every item.
    exclude_self : bool, default False
        Retrieval within one set (``Q == G``): drop item ``i`` from the
        ranking and the relevance of query ``i``.
    batch_size : int or None, default None
        Queries processed at once (memory bound only).

    Returns
    -------
    float or numpy.ndarray
        A float for 1-D input, else a float64 array of length ``Q``; NaN for a
        query without a relevant item.  Tied items are averaged over their
        orders (module docstring, "Ties").
    A :math:`k` beyond the ranking counts every item.
    """
    k = _check_k(k)

    def kernel(d: np.ndarray, r: np.ndarray) -> np.ndarray:
        rk = _Ranked(d, r)
        with np.errstate(invalid="ignore", divide="ignore"):
            return _nan_where_no_hit(rk.hits_at(k) / rk.total, rk.total)

    return _ranking_metric(kernel, distances, relevant, exclude_self, batch_size)


def precision_at_k(
    distances: Any,
    relevant: Any,
    k: int,
    *,
    exclude_self: bool = False,
    batch_size: int | None = None,
) -> float | np.ndarray:
    r"""Precision at cutoff :math:`k`: the fraction of the top :math:`k` that is relevant.

    .. math::

        \mathrm{P@}k = \frac{1}{k} \sum_{i=1}^{k} \mathrm{rel}_i .

    The denominator is :math:`k` even when fewer than :math:`k` items are ranked
    (as in ``trec_eval`` and ``ranx``).

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (G,) or (Q, G)
        Distances, lower is closer (as in :func:`average_precision`).
    relevant : array_like or torch.Tensor, same shape as `distances`
        Boolean or 0/1 relevance.
    k : int
        Cutoff; a `k` beyond the ranking counts every item.
    exclude_self : bool, default False
        Retrieval within one set (``Q == G``): drop item ``i`` from the
        ranking and the relevance of query ``i``.
    batch_size : int or None, default None
        Queries processed at once (memory bound only).

    Returns
    -------
    float or numpy.ndarray
        A float for 1-D input, else a float64 array of length ``Q``; NaN for a
        query without a relevant item.  Tied items are averaged over their
        orders (module docstring, "Ties").
    """
    k = _check_k(k)

    def kernel(d: np.ndarray, r: np.ndarray) -> np.ndarray:
        rk = _Ranked(d, r)
        return _nan_where_no_hit(rk.hits_at(k) / k, rk.total)

    return _ranking_metric(kernel, distances, relevant, exclude_self, batch_size)


def r_precision(
    distances: Any,
    relevant: Any,
    *,
    exclude_self: bool = False,
    batch_size: int | None = None,
) -> float | np.ndarray:
    r"""R-precision: precision at cutoff :math:`R`, the query's number of relevant items.

    .. math::

        \mathrm{RP} = \frac{1}{R} \sum_{i=1}^{R} \mathrm{rel}_i
                    = \mathrm{P@}R = \mathrm{R@}R .

    (Buckley & Voorhees 2000; Musgrave, Belongie, Lim 2020.)

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (G,) or (Q, G)
        Distances, lower is closer (as in :func:`average_precision`).
    relevant : array_like or torch.Tensor, same shape as `distances`
        Boolean or 0/1 relevance.
    exclude_self : bool, default False
        Retrieval within one set (``Q == G``): drop item ``i`` from the
        ranking and the relevance of query ``i``.
    batch_size : int or None, default None
        Queries processed at once (memory bound only).

    Returns
    -------
    float or numpy.ndarray
        A float for 1-D input, else a float64 array of length ``Q``; NaN for a
        query without a relevant item.  Tied items are averaged over their
        orders (module docstring, "Ties").
    """

    def kernel(d: np.ndarray, r: np.ndarray) -> np.ndarray:
        rk = _Ranked(d, r)
        with np.errstate(invalid="ignore", divide="ignore"):
            return _nan_where_no_hit(rk.hits_at(rk.total) / rk.total, rk.total)

    return _ranking_metric(kernel, distances, relevant, exclude_self, batch_size)


def map_at_r(
    distances: Any,
    relevant: Any,
    *,
    exclude_self: bool = False,
    batch_size: int | None = None,
) -> float | np.ndarray:
    r"""Average precision truncated at rank :math:`R` (the per-query term of mAP@R).

    .. math::

        \mathrm{AP@}R = \frac{1}{R} \sum_{i=1}^{R} P(i)\, \mathrm{rel}_i ,
        \qquad P(i) = \frac{1}{i}\sum_{j \le i} \mathrm{rel}_j ,

    with :math:`R` the query's number of relevant items (Musgrave, Belongie,
    Lim 2020, "A Metric Learning Reality Check", §3.2; the
    ``mean_average_precision_at_r`` of pytorch-metric-learning).  It is 1 only
    when the :math:`R` relevant items are the top :math:`R`.

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (G,) or (Q, G)
        Distances, lower is closer (as in :func:`average_precision`).
    relevant : array_like or torch.Tensor, same shape as `distances`
        Boolean or 0/1 relevance.
    exclude_self : bool, default False
        Retrieval within one set (``Q == G``): drop item ``i`` from the
        ranking and the relevance of query ``i``.
    batch_size : int or None, default None
        Queries processed at once (memory bound only).

    Returns
    -------
    float or numpy.ndarray
        A float for 1-D input, else a float64 array of length ``Q``; NaN for a
        query without a relevant item.  Tied items are averaged over their
        orders (module docstring, "Ties").

    Notes
    -----
    Under ties, position :math:`i` lies in a block of :math:`b` tied items
    (the :math:`m`-th of them) holding :math:`h` relevant ones, after
    :math:`T_0` relevant items; over the orders of the block,

    .. math::

        \mathbb{E}[\mathrm{rel}_i\, i P(i)] = \frac{h}{b}(T_0 + 1)
            + (m - 1)\frac{h (h - 1)}{b (b - 1)} ,

    since two distinct positions of the block are both relevant with
    probability :math:`h(h-1)/(b(b-1))`.
    """

    def kernel(d: np.ndarray, r: np.ndarray) -> np.ndarray:
        rk = _Ranked(d, r)
        b, h = rk.size, rk.block
        m = rk.cols[None, :] - rk.start  # 0-based position in the block (m - 1 above)
        with np.errstate(invalid="ignore", divide="ignore"):
            pair = np.where(b > 1, h * (h - 1) / (b * (b - 1)), 0.0)
            term = (rk.expected * (rk.before + 1.0) + m * pair) / (rk.cols + 1.0)
            term = np.where(rk.cols[None, :] < rk.total[:, None], term, 0.0)
            return _nan_where_no_hit(term.sum(axis=1) / rk.total, rk.total)

    return _ranking_metric(kernel, distances, relevant, exclude_self, batch_size)


def reciprocal_rank(
    distances: Any,
    relevant: Any,
    *,
    k: int | None = None,
    exclude_self: bool = False,
    batch_size: int | None = None,
) -> float | np.ndarray:
    r"""Reciprocal rank of the first relevant item (its mean over queries is MRR).

    .. math::

        \mathrm{RR} = \frac{1}{\min\{i : \mathrm{rel}_i = 1\}} ,

    and 0 when that rank exceeds the cutoff `k` (``None``: no cutoff)
    (Voorhees 1999, TREC-8 QA track).

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (G,) or (Q, G)
        Distances, lower is closer (as in :func:`average_precision`).
    relevant : array_like or torch.Tensor, same shape as `distances`
        Boolean or 0/1 relevance.
    k : int or None, default None
        Cutoff: RR is 0 when the first hit ranks after `k`.
    exclude_self : bool, default False
        Retrieval within one set (``Q == G``): drop item ``i`` from the
        ranking and the relevance of query ``i``.
    batch_size : int or None, default None
        Queries processed at once (memory bound only).

    Returns
    -------
    float or numpy.ndarray
        A float for 1-D input, else a float64 array of length ``Q``; NaN for a
        query without a relevant item.  Tied items are averaged over their
        orders (module docstring, "Ties").

    Notes
    -----
    If the first block containing a relevant item starts after :math:`n_0`
    items, has :math:`b` items and :math:`h` of them relevant, the first hit
    is its :math:`j`-th item with probability
    :math:`\binom{b-j}{h-1} / \binom{b}{h}`, so
    :math:`\mathbb{E}[\mathrm{RR}] = \sum_{j=1}^{b-h+1}
    \binom{b-j}{h-1}\binom{b}{h}^{-1} / (n_0 + j)`.
    """
    if k is not None:
        k = _check_k(k)

    def kernel(d: np.ndarray, r: np.ndarray) -> np.ndarray:
        from scipy.special import gammaln

        rk = _Ranked(d, r)
        b, h = rk.size, rk.block
        j = (rk.cols[None, :] - rk.start + 1).astype(np.float64)  # 1-based position in block
        first = (rk.before == 0) & (h > 0) & (j <= b - h + 1)
        if k is not None:
            first &= rk.cols[None, :] < k
        with np.errstate(invalid="ignore", divide="ignore"):
            # log C(b - j, h - 1) - log C(b, h), evaluated only where `first` holds.
            bj, hh, bb = np.where(first, b - j, 0.0), np.where(first, h, 1.0), np.where(first, b, 1.0)
            logp = (gammaln(bj + 1) - gammaln(hh) - gammaln(bj - hh + 2)
                    - gammaln(bb + 1) + gammaln(hh + 1) + gammaln(bb - hh + 1))
            terms = np.where(first, np.exp(logp) / (rk.cols + 1.0), 0.0)
        return _nan_where_no_hit(terms.sum(axis=1), rk.total)

    return _ranking_metric(kernel, distances, relevant, exclude_self, batch_size)


def ndcg_at_k(
    distances: Any,
    relevance: Any,
    k: int,
    *,
    gain: str = "linear",
    exclude_self: bool = False,
    batch_size: int | None = None,
) -> float | np.ndarray:
    r"""Normalised discounted cumulative gain at cutoff :math:`k`, binary or graded.

    .. math::

        \mathrm{DCG@}k = \sum_{i=1}^{k} \frac{g(\mathrm{rel}_i)}{\log_2(i + 1)} ,
        \qquad
        \mathrm{nDCG@}k = \frac{\mathrm{DCG@}k}{\mathrm{IDCG@}k} ,

    where IDCG@k is the DCG@k of the items sorted by decreasing grade
    (Järvelin & Kekäläinen 2002).  The gain is :math:`g(r) = r` for
    ``gain="linear"`` (``trec_eval``'s ``ndcg_cut``, ``ranx``'s ``ndcg``) or
    :math:`g(r) = 2^r - 1` for ``gain="exponential"`` (Burges et al. 2005;
    ``ranx``'s ``ndcg_burges``); both agree for binary relevance.

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (G,) or (Q, G)
        Distances, lower is closer.
    relevance : array_like or torch.Tensor, same shape as `distances`
        Grades: boolean, or real, finite and >= 0 (0 = not relevant).
    k : int
        Cutoff; a `k` beyond the ranking counts every item.
    gain : {"linear", "exponential"}, default "linear"
    exclude_self, batch_size
        As in :func:`average_precision`.

    Returns
    -------
    float or numpy.ndarray
        NaN for a query whose grades are all 0.  Ties: the gain of a block of
        tied items is its mean gain at each of its positions (the expectation
        over the block's orders, McSherry & Najork 2008).
    """
    k = _check_k(k)
    if gain not in ("linear", "exponential"):
        raise ValueError(f"`gain` must be 'linear' or 'exponential'; got {gain!r}")

    def kernel(d: np.ndarray, r: np.ndarray) -> np.ndarray:
        g = r if gain == "linear" else np.expm1(r * np.log(2.0))
        rk = _Ranked(d, g)
        kk = min(k, d.shape[1])
        disc = 1.0 / np.log2(np.arange(2, kk + 2, dtype=np.float64))
        dcg = rk.expected[:, :kk] @ disc
        ideal = -np.sort(-g, axis=1)[:, :kk] @ disc
        with np.errstate(invalid="ignore", divide="ignore"):
            return _nan_where_no_hit(dcg / ideal, ideal)

    return _ranking_metric(kernel, distances, relevance, exclude_self, batch_size, graded=True)


# --------------------------------------------------------------------------- #
# Relevance builders
# --------------------------------------------------------------------------- #
def relevance_from_labels(query_labels: Any, key_labels: Any) -> np.ndarray:
    """Single-label relevance: an item is relevant when it has the query's class.

    Parameters
    ----------
    query_labels : array_like or torch.Tensor, shape (Q,)
        Class of each query (integers, strings, ...).
    key_labels : array_like or torch.Tensor, shape (G,)
        Class of each gallery / key item.

    Returns
    -------
    numpy.ndarray of bool, shape (Q, G)
        ``relevant[i, j] = (query_labels[i] == key_labels[j])``.

    Raises
    ------
    ValueError
        If either input is empty or not 1-D.
    """
    q = _to_numpy(query_labels, "query_labels")
    k = _to_numpy(key_labels, "key_labels")
    for name, a in (("query_labels", q), ("key_labels", k)):
        if a.ndim != 1:
            raise ValueError(f"`{name}` must be 1-D; got shape {a.shape}")
        if a.size == 0:
            raise ValueError(f"`{name}` is empty")
    return np.asarray(q[:, None] == k[None, :], dtype=bool)


def relevance_from_multilabels(
    query_labels: Any, key_labels: Any, label: int | None = None
) -> np.ndarray:
    r"""Multi-label relevance from 0/1 label matrices.

    Parameters
    ----------
    query_labels : array_like or torch.Tensor, shape (Q, C)
        Boolean or 0/1: which of ``C`` labels each query has.
    key_labels : array_like or torch.Tensor, shape (G, C)
        Boolean or 0/1: which labels each gallery / key item has.
    label : int or None, default None
        ``None``: item ``j`` is relevant to query ``i`` when they share at
        least one positive label,
        :math:`r_{ij} = [\sum_c y^q_{ic} y^k_{jc} > 0]`.
        An index ``c`` in ``[0, C)``: per-label relevance,
        :math:`r_{ij} = y^q_{ic}\, y^k_{jc}` -- item ``j`` is relevant when
        it has label ``c``, for queries that have ``c``.  Queries without
        ``c`` get no relevant item, so :func:`mean_average_precision` skips
        them.

    Returns
    -------
    numpy.ndarray of bool, shape (Q, G)

    Raises
    ------
    ValueError
        If the inputs are empty, not 2-D, disagree on ``C``, are not 0/1, or
        `label` is not an integer in ``[0, C)``.
    """
    q = _check_binary(query_labels, "query_labels")
    k = _check_binary(key_labels, "key_labels")
    for name, a in (("query_labels", q), ("key_labels", k)):
        if a.ndim != 2:
            raise ValueError(f"`{name}` must be 2-D (n, C); got shape {a.shape}")
        if a.size == 0:
            raise ValueError(f"`{name}` is empty (shape {a.shape})")
    if q.shape[1] != k.shape[1]:
        raise ValueError(
            "`query_labels` and `key_labels` must have the same number of labels C; "
            f"got {q.shape[1]} and {k.shape[1]}"
        )
    n_labels = q.shape[1]
    if label is None:
        # Integer matmul counts the shared positive labels.
        shared = q.astype(np.int64) @ k.astype(np.int64).T
        return shared > 0
    if isinstance(label, bool) or not isinstance(label, numbers.Integral):
        raise ValueError(f"`label` must be an integer index or None; got {label!r}")
    if not 0 <= int(label) < n_labels:
        raise ValueError(f"`label` must be in [0, {n_labels}); got {label}")
    c = int(label)
    return q[:, c][:, None] & k[:, c][None, :]


# --------------------------------------------------------------------------- #
# Bootstrap
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class BootstrapCI:
    """A mean with a percentile bootstrap interval.

    Attributes
    ----------
    mean : float
        Mean of the non-NaN values.
    low, high : float
        Percentile bootstrap interval at confidence `level`.
    n : int
        Number of queries used (queries that are NaN everywhere are dropped).
    n_draws : int
        Number of draws used (1 for 1-D input).
    level : float
        Confidence level of the interval.
    """

    mean: float
    low: float
    high: float
    n: int
    n_draws: int
    level: float


def _check_boot_args(n_boot: Any, level: Any) -> None:
    positive_int(n_boot, "`n_boot`")
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        raise ValueError(f"`level` must be a number in (0, 1); got {level!r}")


def _as_draw_matrix(values: Any, name: str) -> tuple[np.ndarray, int]:
    """Validate per-query values; return them as (n_draws, Q) float64 and the input ndim."""
    v = _to_numpy(values, name)
    if v.ndim not in (1, 2):
        raise ValueError(f"`{name}` must be 1-D (Q,) or 2-D (n_draws, Q); got shape {v.shape}")
    if v.size == 0:
        raise ValueError(f"`{name}` is empty (shape {v.shape})")
    if v.dtype == bool or not (
        np.issubdtype(v.dtype, np.integer) or np.issubdtype(v.dtype, np.floating)
    ):
        raise ValueError(f"`{name}` must be real-valued; got dtype {v.dtype}")
    ndim = v.ndim
    v = v.astype(np.float64)
    return (v[None, :] if ndim == 1 else v), ndim


def _resample_counts(rng: np.random.Generator, n: int, size: int) -> np.ndarray:
    """Multiplicities of ``n`` items in ``size`` resamples with replacement, shape (size, n)."""
    idx = rng.integers(0, n, size=(size, n))
    idx += (np.arange(size) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=size * n).reshape(size, n)


def _bootstrap(
    v: np.ndarray,
    n_boot: int,
    level: float,
    seed: Any,
    groups: Any,
    name: str,
) -> BootstrapCI:
    """Bootstrap the mean of the (n_draws, Q) matrix ``v`` (NaN = missing)."""
    _check_boot_args(n_boot, level)
    n_q_all = v.shape[1]
    g = None
    if groups is not None:
        g = _to_numpy(groups, "groups")
        if g.shape != (n_q_all,):
            raise ValueError(
                f"`groups` must be 1-D with one entry per query ({n_q_all}); got shape {g.shape}"
            )
    present = ~np.isnan(v)
    keep_q = present.any(axis=0)
    keep_d = present.any(axis=1)
    if not keep_q.any():
        raise ValueError(f"`{name}` has no non-NaN value")
    v = v[np.ix_(keep_d, keep_q)]
    present = present[np.ix_(keep_d, keep_q)]
    n_draws, n_q = v.shape
    values = np.where(present, v, 0.0)
    weights = present.astype(np.float64)
    mean = float(values.sum() / weights.sum())

    # Resampling units: the queries, or the clusters of queries given by
    # `groups`.  A unit contributes the sums of its queries' values and
    # non-NaN counts, so a cluster is resampled as a whole.
    if g is None:
        unit_values, unit_weights = values, weights
    else:
        _, codes = np.unique(g[keep_q], return_inverse=True)
        codes = codes.reshape(-1)
        n_units = int(codes.max()) + 1
        unit_values = np.zeros((n_draws, n_units))
        unit_weights = np.zeros((n_draws, n_units))
        np.add.at(unit_values.T, codes, values.T)
        np.add.at(unit_weights.T, codes, weights.T)
    n_units = unit_values.shape[1]

    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot, dtype=np.float64)
    # Replicates are generated in blocks to bound memory for large Q.
    block = max(1, _DEFAULT_BLOCK_ELEMENTS // n_units)
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        # Multiplicities of the draws (outer level), shape (b, n_draws).
        if n_draws > 1:
            w_draw = _resample_counts(rng, n_draws, b).astype(np.float64)
        else:
            w_draw = np.ones((b, 1))
        # Multiplicities of the units (inner level), shape (b, n_units).
        w_unit = _resample_counts(rng, n_units, b).astype(np.float64)
        num = np.einsum("bu,bu->b", w_draw @ unit_values, w_unit)
        den = np.einsum("bu,bu->b", w_draw @ unit_weights, w_unit)
        with np.errstate(invalid="ignore", divide="ignore"):
            stats[start : start + b] = num / den
    alpha = (1.0 - float(level)) / 2.0
    low, high = np.nanquantile(stats, [alpha, 1.0 - alpha])
    low, high = float(low), float(high)
    if np.ptp(v[present]) == 0:
        # Constant values: every replicate equals the mean; avoid rounding noise.
        low = high = mean
    return BootstrapCI(
        mean=mean, low=low, high=high, n=int(n_q), n_draws=int(n_draws), level=float(level)
    )


def bootstrap_ci(
    per_query_values: Any,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: Any = 0,
    groups: Any = None,
) -> BootstrapCI:
    r"""Mean over queries with a percentile bootstrap interval.

    Parameters
    ----------
    per_query_values : array_like or torch.Tensor, shape (Q,) or (n_draws, Q)
        One value per query (for example ``MAPResult.per_query``).  NaNs are
        ignored (skipped queries).  A 2-D array holds the values of repeated
        random draws (for example several anchor sets), one row per draw.
    n_boot : int, default 1000
        Number of bootstrap replicates.
    level : float, default 0.95
        Confidence level; the interval is the
        :math:`[\tfrac{1-\text{level}}{2}, \tfrac{1+\text{level}}{2}]`
        quantiles of the bootstrap means.
    seed : int, numpy.random.Generator or None, default 0
        Seed for :func:`numpy.random.default_rng`; equal seeds give equal
        intervals.
    groups : array_like, shape (Q,), optional
        Cluster label of each query (for example a patient id).  If given,
        whole clusters are resampled instead of single queries (cluster
        bootstrap), for queries that are not independent.

    Returns
    -------
    BootstrapCI
        ``mean``, ``low``, ``high``, ``n`` (queries used), ``n_draws``,
        ``level``.

    Notes
    -----
    The point estimate is the mean of all non-NaN entries,
    :math:`\bar v = \sum_{d,q} m_{dq} v_{dq} / \sum_{d,q} m_{dq}` with
    :math:`m_{dq}` the non-NaN indicator (for a NaN pattern shared by all
    draws this is the mean over draws of the per-draw means).  Each bootstrap
    replicate draws multiplicities :math:`a_d` for the draws (only when
    ``n_draws > 1``) and :math:`b_q` for the queries (through their clusters
    when `groups` is given: :math:`b_q` is the multiplicity of :math:`q`'s
    cluster), each the counts of a resample with replacement, and
    evaluates

    .. math::

        \bar v^* = \frac{\sum_{d,q} a_d b_q m_{dq} v_{dq}}
                        {\sum_{d,q} a_d b_q m_{dq}} .

    Resampling both levels lets the interval reflect the variability from
    the random draws as well as from the finite query set.

    Raises
    ------
    ValueError
        On empty, all-NaN or wrongly shaped input, or invalid `n_boot`,
        `level` or `groups`.
    """
    v, _ = _as_draw_matrix(per_query_values, "per_query_values")
    return _bootstrap(v, n_boot, level, seed, groups, "per_query_values")


def paired_difference(
    a: Any,
    b: Any,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: Any = 0,
    groups: Any = None,
) -> BootstrapCI:
    r"""Mean paired difference ``a - b`` over queries with a bootstrap interval.

    Used for comparisons such as "Softmax − Cosine": both methods are scored
    on the same queries and the per-query differences
    :math:`\delta_q = a_q - b_q` are bootstrapped with :func:`bootstrap_ci`,
    which keeps the pairing (the same queries are drawn for both methods).

    Parameters
    ----------
    a, b : array_like or torch.Tensor, shape (Q,) or (n_draws, Q)
        Per-query values of the two methods, in the same query order.  They
        must have the same shape, except that one may be 1-D (Q,) while the
        other is (n_draws, Q) -- e.g. a method without random draws compared
        with one evaluated over several anchor draws; the 1-D one is then
        repeated across draws.  A difference is NaN where either value is
        NaN, and is ignored.
    n_boot, level, seed, groups
        As in :func:`bootstrap_ci`.

    Returns
    -------
    BootstrapCI
        For the differences ``a - b``.

    Raises
    ------
    ValueError
        If the shapes do not match, or as in :func:`bootstrap_ci`.
    """
    va, nda = _as_draw_matrix(a, "a")
    vb, ndb = _as_draw_matrix(b, "b")
    if va.shape[1] != vb.shape[1] or (nda == ndb == 2 and va.shape[0] != vb.shape[0]):
        shape_a = va.shape[1:] if nda == 1 else va.shape
        shape_b = vb.shape[1:] if ndb == 1 else vb.shape
        raise ValueError(
            "`a` and `b` must have the same shape (or one 1-D (Q,) and the other "
            f"(n_draws, Q)); got {shape_a} and {shape_b}"
        )
    diff = va - vb  # broadcasts a single row across draws
    return _bootstrap(diff, n_boot, level, seed, groups, "a - b")


# --------------------------------------------------------------------------- #
# Registry: one per-query signature for every metric
# --------------------------------------------------------------------------- #
def _fixed(fn: Any, name: str, **bound: Any) -> Any:
    """``fn`` with some arguments bound, as ``metric(distances, relevant, *, exclude_self, batch_size)``."""

    def metric(
        distances: Any, relevant: Any, *, exclude_self: bool = False, batch_size: int | None = None
    ) -> float | np.ndarray:
        return fn(distances, relevant, exclude_self=exclude_self, batch_size=batch_size, **bound)

    metric.__name__ = metric.__qualname__ = name.replace("@", "_at_")
    metric.__doc__ = f"``{name}``: :func:`{fn.__name__}` with {bound or 'its defaults'}, per query."
    return metric


_PARAMETRIC = {
    "recall": (recall_at_k, {}),
    "precision": (precision_at_k, {}),
    "ndcg": (ndcg_at_k, {"gain": "linear"}),
    "ndcg_exp": (ndcg_at_k, {"gain": "exponential"}),
    "mrr": (reciprocal_rank, {}),
}


def get_metric(name: str) -> Any:
    """The per-query function of a metric name, e.g. ``"auprc"``, ``"recall@10"``, ``"ndcg@5"``.

    Names: ``auprc`` (:func:`average_precision`), ``r_precision``, ``map@r``,
    ``mrr`` and ``mrr@K`` (:func:`reciprocal_rank`), ``recall@K``,
    ``precision@K``, ``ndcg@K`` (linear gain) and ``ndcg_exp@K`` (gain
    :math:`2^r - 1`), for any positive integer ``K``.  Case and surrounding
    spaces are ignored.

    Returns
    -------
    callable
        ``metric(distances, relevant, *, exclude_self=False, batch_size=None)``
        returning one value per query (NaN where the query has no relevant
        item); average with ``np.nanmean`` or :func:`bootstrap_ci`.

    Raises
    ------
    ValueError
        For an unknown name or a malformed cutoff.
    """
    if not isinstance(name, str):
        raise ValueError(f"metric name must be a string; got {name!r}")
    key = name.strip().lower()
    if key in METRICS:
        return METRICS[key]
    base, sep, cutoff = key.partition("@")
    if sep and base in _PARAMETRIC and cutoff.isdigit() and int(cutoff) >= 1:
        fn, bound = _PARAMETRIC[base]
        return _fixed(fn, key, k=int(cutoff), **bound)
    raise ValueError(
        f"unknown metric {name!r}; use one of {', '.join(METRICS)}, or recall@K, precision@K, "
        "ndcg@K, ndcg_exp@K, mrr@K for a positive integer K"
    )


#: Metric name -> per-query function ``f(distances, relevant, *, exclude_self=False,
#: batch_size=None)``, returning a float for one query (1-D input) or a float64 array
#: of length Q, NaN where a query has no relevant item.  Lower distance is closer.
#: :func:`get_metric` also builds any cutoff, e.g. ``get_metric("recall@20")``.
METRICS: dict[str, Any] = {
    "auprc": average_precision,
    "r_precision": r_precision,
    "map@r": map_at_r,
    "mrr": reciprocal_rank,
    **{f"{base}@{k}": _fixed(_PARAMETRIC[base][0], f"{base}@{k}", k=k, **_PARAMETRIC[base][1])
       for base in ("recall", "precision") for k in (1, 5, 10)},
    "ndcg@10": _fixed(ndcg_at_k, "ndcg@10", k=10),
}


# --------------------------------------------------------------------------- #
# Runs and qrels for trec_eval, ranx, ir-measures
# --------------------------------------------------------------------------- #
def _ids(ids: Any, n: int, name: str) -> list[str]:
    if ids is None:
        return [str(i) for i in range(n)]
    out = [str(x) for x in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    if len(out) != n:
        raise ValueError(f"`{name}` must have {n} entries; got {len(out)}")
    if len(set(out)) != n:
        raise ValueError(f"`{name}` must be unique")
    bad = [x for x in out if not x or any(c.isspace() for c in x)]
    if bad:
        raise ValueError(f"`{name}` must be non-empty and without whitespace (TREC format); got {bad[0]!r}")
    return out


def _ranked_lists(
    distances: Any, indices: Any, k: int | None, exclude_self: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """Per query, item indices in rank order and their distances (-1 index = none)."""
    d = _check_distances(distances)
    if d.ndim == 1:
        d = d[None, :]
    if k is not None:
        k = _check_k(k)
    if indices is not None:
        if exclude_self:
            raise ValueError("`exclude_self` applies to a full distance matrix, not to `indices`")
        idx = _to_numpy(indices, "indices")
        idx = idx[None, :] if idx.ndim == 1 else idx
        if idx.shape != d.shape or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(
                f"`indices` must be integers of the same shape as `distances` {d.shape}; "
                f"got {idx.shape} {idx.dtype}"
            )
        order = np.argsort(d, axis=1, kind="stable")
        idx = np.take_along_axis(idx, order, axis=1)
        d = np.take_along_axis(d, order, axis=1)
        n_items = int(idx.max()) + 1 if idx.size else 0
        return (idx[:, :k], d[:, :k], n_items) if k is not None else (idx, d, n_items)
    n_q, n_items = d.shape
    order = np.argsort(d, axis=1, kind="stable")
    if exclude_self:
        _check_square(d.shape)
        order = order[order != np.arange(n_q)[:, None]].reshape(n_q, n_items - 1)
    if k is not None:
        order = order[:, :k]
    return order, np.take_along_axis(d, order, axis=1), n_items


def to_run_dict(
    distances: Any,
    *,
    indices: Any = None,
    query_ids: Any = None,
    doc_ids: Any = None,
    k: int | None = None,
    exclude_self: bool = False,
) -> dict[str, dict[str, float]]:
    """A run as ``{query_id: {doc_id: score}}`` with score ``-distance`` (higher is better).

    This is the run format of ``ranx.Run``, ``pytrec_eval`` and ``ir_measures``.

    Parameters
    ----------
    distances : array_like or torch.Tensor, shape (Q, G) or (Q, k)
        A full distance matrix, or with `indices` the top-k distances of
        ``model.search``.  Lower is closer.
    indices : array_like, shape (Q, k), optional
        Gallery indices of `distances` (``model.search`` output); ``-1`` entries
        (no neighbour) are skipped.
    query_ids, doc_ids : sequence, optional
        Names of the queries and of the gallery items (default: row numbers as
        strings).  Unique, without whitespace.
    k : int, optional
        Keep each query's top `k` (default: every item).
    exclude_self : bool, default False
        Leave out item ``i`` from query ``i``'s ranking (square matrix only).

    Returns
    -------
    dict
        Items in rank order (ties by lower index, like ``model.search``).
    """
    order, dist, n_items = _ranked_lists(distances, indices, k, exclude_self)
    qids = _ids(query_ids, order.shape[0], "query_ids")
    dids = _ids(doc_ids, n_items if doc_ids is None else len(doc_ids), "doc_ids")
    if order.size and int(order.max()) >= len(dids):
        raise ValueError(f"`indices` refer to item {int(order.max())} but `doc_ids` has {len(dids)}")
    return {
        qid: {dids[j]: -float(x) for j, x in zip(row.tolist(), drow.tolist()) if j >= 0}
        for qid, row, drow in zip(qids, order, dist)
    }


def to_trec(
    distances: Any,
    path: str | Any | None = None,
    *,
    indices: Any = None,
    query_ids: Any = None,
    doc_ids: Any = None,
    k: int | None = None,
    exclude_self: bool = False,
    tag: str = "anchordiv",
) -> str:
    """A run in TREC format, one line ``qid Q0 docid rank score tag`` per retrieved item.

    ``rank`` starts at 1 and ``score = -distance``, so higher is better, as
    ``trec_eval`` expects.  Arguments as in :func:`to_run_dict`.

    Parameters
    ----------
    path : str or os.PathLike, optional
        Also write the text to this file.
    tag : str, default "anchordiv"
        Run name (last column); no whitespace.

    Returns
    -------
    str
        The run, newline-terminated.
    """
    if not isinstance(tag, str) or not tag or any(c.isspace() for c in tag):
        raise ValueError(f"`tag` must be a non-empty string without whitespace; got {tag!r}")
    run = to_run_dict(distances, indices=indices, query_ids=query_ids, doc_ids=doc_ids,
                      k=k, exclude_self=exclude_self)
    lines = [
        f"{qid} Q0 {doc} {rank} {score!r} {tag}"
        for qid, docs in run.items()
        for rank, (doc, score) in enumerate(docs.items(), start=1)
    ]
    text = "".join(line + "\n" for line in lines)
    if path is not None:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    return text


def to_qrels_dict(
    relevance: Any,
    *,
    query_ids: Any = None,
    doc_ids: Any = None,
    exclude_self: bool = False,
) -> dict[str, dict[str, int | float]]:
    """Relevance judgements as ``{query_id: {doc_id: grade}}`` (grades > 0 only).

    The qrels format of ``ranx.Qrels``, ``pytrec_eval`` and ``ir_measures``.
    Integer-valued grades are written as ``int``.

    Parameters
    ----------
    relevance : array_like or torch.Tensor, shape (Q, G)
        Boolean or graded (real, >= 0) relevance.
    query_ids, doc_ids, exclude_self
        As in :func:`to_run_dict`.
    """
    r = _to_numpy(relevance, "relevance")
    r = r[None, :] if r.ndim == 1 else r
    r = _check_grades(r, r.shape)
    if exclude_self:
        _check_square(r.shape)
        r = r.copy()
        r[np.diag_indices(r.shape[0])] = 0.0
    qids = _ids(query_ids, r.shape[0], "query_ids")
    dids = _ids(doc_ids, r.shape[1], "doc_ids")
    out: dict[str, dict[str, int | float]] = {}
    for qid, row in zip(qids, r):
        (nz,) = np.nonzero(row)
        out[qid] = {dids[j]: (int(v) if float(v).is_integer() else float(v))
                    for j, v in zip(nz.tolist(), row[nz].tolist())}
    return out
