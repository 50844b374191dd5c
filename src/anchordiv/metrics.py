r"""Retrieval metrics: average precision, relevance builders, bootstrap intervals.

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
    "average_precision",
    "mean_average_precision",
    "relevance_from_labels",
    "relevance_from_multilabels",
    "bootstrap_ci",
    "paired_difference",
]

# Number of matrix elements processed at once by the vectorised AP kernel.
# The kernel keeps roughly ten temporaries of this size (about 80 bytes per
# element in total), so the default uses a few hundred MiB at most.
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


def _check_batch_size(batch_size: int | None, n_cols: int) -> int:
    batch_size = positive_int(batch_size, "`batch_size`", allow_none=True)
    return max(1, _DEFAULT_BLOCK_ELEMENTS // max(n_cols, 1)) if batch_size is None else batch_size


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


def _ap_matrix(
    d: np.ndarray, rel: np.ndarray, exclude_self: bool, batch_size: int | None
) -> np.ndarray:
    q, g = d.shape
    if exclude_self:
        if q != g:
            raise ValueError(
                f"`exclude_self=True` needs a square `distances` (Q == G); got shape {d.shape}"
            )
        if g < 2:
            raise ValueError(
                "`exclude_self=True` needs at least 2 items; `distances` has shape "
                f"{d.shape}"
            )
    rows = _check_batch_size(batch_size, g)
    out = np.empty(q, dtype=np.float64)
    for start in range(0, q, rows):
        stop = min(start + rows, q)
        dc, rc = d[start:stop], rel[start:stop]
        if exclude_self:
            dc, rc = _drop_diagonal(dc, start), _drop_diagonal(rc, start)
        out[start:stop] = _ap_rows(dc, rc)
    return out


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
