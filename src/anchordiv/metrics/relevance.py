"""Relevance matrices from single labels or multi-label indicators."""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from ._common import check_binary, to_numpy


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
    q = to_numpy(query_labels, "query_labels")
    k = to_numpy(key_labels, "key_labels")
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
    q = check_binary(query_labels, "query_labels")
    k = check_binary(key_labels, "key_labels")
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
