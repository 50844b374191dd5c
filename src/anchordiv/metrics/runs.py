"""Runs and qrels for ``trec_eval``, ``ranx``, ``pytrec_eval`` and ``ir_measures``.

A run scores each retrieved item with :math:`-d` (higher is better).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._common import check_distances, check_grades, check_k, check_square, to_numpy


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
    d = check_distances(distances)
    if d.ndim == 1:
        d = d[None, :]
    if k is not None:
        k = check_k(k)
    if indices is not None:
        if exclude_self:
            raise ValueError("`exclude_self` applies to a full distance matrix, not to `indices`")
        idx = to_numpy(indices, "indices")
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
        check_square(d.shape)
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
    r = to_numpy(relevance, "relevance")
    r = r[None, :] if r.ndim == 1 else r
    r = check_grades(r, r.shape)
    if exclude_self:
        check_square(r.shape)
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
