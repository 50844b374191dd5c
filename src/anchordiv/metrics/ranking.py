r"""Ranking metrics with cutoffs and the metric registry.

Recall@k, precision@k, R-precision, mAP@R, reciprocal rank and nDCG@k, each the
expectation over the orders of tied items; :data:`METRICS` and :func:`get_metric`
give them one per-query signature.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._common import (
    DEFAULT_BLOCK_ELEMENTS,
    as_rows,
    check_distances,
    check_grades,
    check_k,
    check_relevant,
    rowwise,
)
from .ap import average_precision


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
    d = check_distances(distances)
    rel = check_grades(relevance, d.shape) if graded else check_relevant(relevance, d.shape)
    d, rel, one_query = as_rows(d, rel, exclude_self)
    # The ranking kernels keep about twice the temporaries of the AP kernel.
    out = rowwise(kernel, d, rel, exclude_self, batch_size, DEFAULT_BLOCK_ELEMENTS // 2)
    return float(out[0]) if one_query else out


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
        orders (:mod:`anchordiv.metrics`, "Ties").
    A :math:`k` beyond the ranking counts every item.
    """
    k = check_k(k)

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
        orders (:mod:`anchordiv.metrics`, "Ties").
    """
    k = check_k(k)

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
        orders (:mod:`anchordiv.metrics`, "Ties").
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
        orders (:mod:`anchordiv.metrics`, "Ties").

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
        orders (:mod:`anchordiv.metrics`, "Ties").

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
        k = check_k(k)

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
    k = check_k(k)
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
