r"""Percentile bootstrap intervals for per-query means and paired differences.

Each replicate is :math:`\bar v^* = \sum a_d b_q m_{dq} v_{dq} / \sum a_d b_q m_{dq}`, with draws
:math:`d` and queries :math:`q` resampled with replacement.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._util import positive_int
from ._common import DEFAULT_BLOCK_ELEMENTS, to_numpy


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
    v = to_numpy(values, name)
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


def _unit_sums(
    values: np.ndarray, weights: np.ndarray, g: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    r"""Sums of values and non-NaN counts per resampling unit: a query, or a cluster of ``g``.

    A cluster contributes :math:`\sum_{q \in c} m_{dq} v_{dq}` and :math:`\sum_{q \in c} m_{dq}`,
    so it is resampled as a whole.
    """
    if g is None:
        return values, weights
    _, codes = np.unique(g, return_inverse=True)
    codes = codes.reshape(-1)
    n_units = int(codes.max()) + 1
    unit_values = np.zeros((values.shape[0], n_units))
    unit_weights = np.zeros((values.shape[0], n_units))
    np.add.at(unit_values.T, codes, values.T)
    np.add.at(unit_weights.T, codes, weights.T)
    return unit_values, unit_weights


def _replicate_means(
    unit_values: np.ndarray, unit_weights: np.ndarray, n_boot: int, seed: Any
) -> np.ndarray:
    r"""``n_boot`` bootstrap means :math:`\sum a_d b_u V_{du} / \sum a_d b_u W_{du}`.

    :math:`a` resamples the draws (only when there are several), :math:`b` the units.
    """
    n_draws, n_units = unit_values.shape
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot, dtype=np.float64)
    # Replicates are generated in blocks to bound memory for large Q.
    block = max(1, DEFAULT_BLOCK_ELEMENTS // n_units)
    for start in range(0, n_boot, block):
        b = min(block, n_boot - start)
        if n_draws > 1:
            w_draw = _resample_counts(rng, n_draws, b).astype(np.float64)
        else:
            w_draw = np.ones((b, 1))
        w_unit = _resample_counts(rng, n_units, b).astype(np.float64)
        num = np.einsum("bu,bu->b", w_draw @ unit_values, w_unit)
        den = np.einsum("bu,bu->b", w_draw @ unit_weights, w_unit)
        with np.errstate(invalid="ignore", divide="ignore"):
            stats[start : start + b] = num / den
    return stats


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
        g = to_numpy(groups, "groups")
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
    unit_values, unit_weights = _unit_sums(values, weights, None if g is None else g[keep_q])
    stats = _replicate_means(unit_values, unit_weights, n_boot, seed)
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
