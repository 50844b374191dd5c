r"""Average precision and mean average precision, tie-aware like scikit-learn.

:math:`\mathrm{AP} = \sum_n (R_n - R_{n-1})\, P_n` over the distinct distance thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ._common import as_rows, check_distances, check_relevant, rowwise


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


def _ap_matrix(
    d: np.ndarray, rel: np.ndarray, exclude_self: bool, batch_size: int | None
) -> np.ndarray:
    return rowwise(_ap_rows, d, rel, exclude_self, batch_size)


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
    d = check_distances(distances)
    rel = check_relevant(relevant, d.shape)
    d, rel, one_query = as_rows(d, rel, exclude_self)
    out = _ap_matrix(d, rel, exclude_self, batch_size)
    return float(out[0]) if one_query else out


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
    d = check_distances(distances)
    rel = check_relevant(relevant, d.shape)
    d, rel, _ = as_rows(d, rel, exclude_self)
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
