"""The comparison itself: the same queries' nearest neighbours under several geometries.

:func:`compare` runs an exact top-k search for each named geometry and collects, for each
query, one row per geometry: the neighbours, their distances and, when labels are known,
which neighbours share the query's label for each label column ("factor").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._util import positive_int

__all__ = ["ITEM_COLUMNS", "TOP_ANCHORS", "RelevanceFn", "ReportGeometry", "GeometryRow", "ComparisonResult",
           "compare", "cards"]

#: Metadata column holding the items of a collection, by kind.
ITEM_COLUMNS = {"text": ("caption", "text"), "image": ("image_path", "path", "filepath")}

#: Most probable anchors shown for each query on an anchor row.
TOP_ANCHORS = 3

#: A relevance function: ``fn(query_index, gallery_indices) -> bool array``.
RelevanceFn = Callable[[int, np.ndarray], Any]


@dataclass
class ReportGeometry:
    """A fitted geometry with what the report says about it.

    Parameters
    ----------
    geometry : anchordiv.Geometry
        A fitted geometry (anchor model or baseline) with ``search``.
    label : str, optional
        Human label of the row, e.g. ``"softmax · breeds (6 anchors)"``. Defaults to the
        geometry's name, followed by the number of anchors when ``anchors`` is given.
    anchors : AnchorSet or sequence of str, optional
        The anchors that define the geometry; their texts are previewed under the label.
    factor : str, optional
        The row's primary factor: neighbours sharing the query's value of it get a green
        border, and its precision@k is shown first.
    mark : sequence of str, optional
        Factors marked with a ✓/✗ chip on each neighbour of this row. Defaults to the
        ``mark`` argument of :func:`compare` (all factors when that is None too).
    """

    geometry: Any
    label: str | None = None
    anchors: Any = None
    factor: str | None = None
    mark: Sequence[str] | None = None


@dataclass
class GeometryRow:
    """How one geometry is shown: its name, label, anchors and marked factors.

    Attributes
    ----------
    name : str
        Key of the geometry in the ``geometries`` mapping.
    label : str
        Human label of the row.
    anchor_texts : list of str
        Texts of the anchors that define it (empty when unknown or none).
    n_anchors : int or None
        Number of anchors, when known.
    factor : str or None
        Primary factor (green borders).
    mark : tuple of str
        Factors marked with chips.
    """

    name: str
    label: str
    anchor_texts: list[str]
    n_anchors: int | None
    factor: str | None
    mark: tuple[str, ...]


@dataclass
class ComparisonResult:
    """Neighbours of some queries under several geometries (the output of :func:`compare`).

    Attributes
    ----------
    kind : {"text", "image"}
        What the items are.
    k : int
        Neighbours per query and geometry.
    rows : list of GeometryRow
        The geometries, in row order.
    query_indices : numpy.ndarray of shape (m,)
        Index of each shown query into the ``queries`` passed to :func:`compare`.
    query_rows : list of int or None
        Gallery row of each shown query, when it is a gallery item.
    query_titles : list of str
        Heading of each query.
    query_items : list
        Each query's item (text, image path or PIL image), or None when unknown.
    factors : list of str
        Names of the label columns / relevance functions.
    query_values : dict of str to list
        Per factor, the query's value (None when unknown or for a relevance function).
    gallery_values : dict of str to numpy.ndarray or None
        Per factor, the gallery labels (None for a relevance function).
    indices, distances : dict of str to numpy.ndarray of shape (m, k)
        Per geometry name, the neighbours (gallery rows) and their distances, closest first.
    relevant : dict of str to dict of str to numpy.ndarray of shape (m, k)
        ``relevant[name][factor][i, r]``: neighbour ``r`` of query ``i`` shares the query's
        value of ``factor`` (False where the query's value is unknown).
    known : dict of str to numpy.ndarray of shape (m,)
        Per factor, whether relevance is defined for each query.
    items : sequence or None
        The gallery items (texts, image paths or PIL images).
    info : dict
        Extra facts shown in the report header.
    item_ids : list or None
        Each gallery row's id (its value in the collection's 'id' column); None when the
        collection has no such column, where an item's id is its row number.
    top_anchors : dict of str to list
        Per geometry with an anchor set, each query's most probable anchors
        ``[(text, probability)]`` under the softmax over them
        (:func:`anchordiv.diagnostics.explain`).
    """

    kind: str
    k: int
    rows: list[GeometryRow]
    query_indices: np.ndarray
    query_rows: list[int | None]
    query_titles: list[str]
    query_items: list[Any]
    factors: list[str]
    query_values: dict[str, list[Any]]
    gallery_values: dict[str, np.ndarray | None]
    indices: dict[str, np.ndarray]
    distances: dict[str, np.ndarray]
    relevant: dict[str, dict[str, np.ndarray]]
    known: dict[str, np.ndarray]
    items: Sequence[Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    item_ids: list[Any] | None = None
    top_anchors: dict[str, list[list[tuple[str, float]]]] = field(default_factory=dict)

    def _repr_html_(self) -> str:
        """The card grid inline in a notebook (the page of :func:`write_report`, without images on disk)."""
        from .html import render_html
        from .images import THUMBNAIL_PX, Thumbs
        from .view import build_view

        return render_html(build_view(self, "Neighbours under each geometry", Thumbs(THUMBNAIL_PX)), fragment=True)

    def item_id(self, row: int) -> Any:
        """The id of the item at gallery ``row``: ``item_ids[row]``, else the row number."""
        return row if self.item_ids is None else self.item_ids[row]

    def item_label(self, row: int) -> str:
        """How the report names the item at gallery ``row``: ``id ID (row N)``, or ``row N``."""
        return _item_label(self.item_ids, row)

    @property
    def n_queries(self) -> int:
        """Number of queries shown."""
        return int(len(self.query_indices))

    def row(self, name: str) -> GeometryRow:
        """The :class:`GeometryRow` of geometry ``name``."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no geometry named {name!r}; geometries: {[r.name for r in self.rows]}")

    def precision_at_k(self, name: str, factor: str) -> np.ndarray:
        """Fraction of the k neighbours sharing the query's value of ``factor``, per query.

        Parameters
        ----------
        name : str
            Geometry name.
        factor : str
            Factor name.

        Returns
        -------
        numpy.ndarray of shape (m,)
            NaN for queries whose value of ``factor`` is unknown.
        """
        rel = self.relevant[name][factor]
        out = rel.mean(axis=1).astype(np.float64)
        out[~self.known[factor]] = np.nan
        return out

    def to_frame(self) -> "Any":
        """The neighbours as a long table (needs pandas).

        Returns
        -------
        pandas.DataFrame
            One row per (query, geometry, rank) with columns ``query`` (position),
            ``query_row``, ``geometry``, ``rank`` (1-based), ``row`` (the neighbour's
            gallery row), ``id`` (its id, the row without ``item_ids``), ``distance`` and
            ``relevant_<factor>`` per factor (NA when unknown).
        """
        import pandas as pd

        records = []
        for qi in range(self.n_queries):
            for r in self.rows:
                for rank in range(self.k):
                    row = int(self.indices[r.name][qi, rank])
                    rec = {
                        "query": qi, "query_row": int(self.query_indices[qi]), "geometry": r.name,
                        "rank": rank + 1, "row": row, "id": self.item_id(row),
                        "distance": float(self.distances[r.name][qi, rank]),
                    }
                    for f in self.factors:
                        known = bool(self.known[f][qi])
                        rec[f"relevant_{f}"] = bool(self.relevant[r.name][f][qi, rank]) if known else pd.NA
                    records.append(rec)
        return pd.DataFrame.from_records(records)


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu()
        if x.is_floating_point() and x.element_size() < 4:
            x = x.float()
        x = x.numpy()
    return np.asarray(x)


def _item_label(item_ids: Sequence[Any] | None, row: int) -> str:
    """``id ID (row N)``, or ``row N`` when there are no ids."""
    return f"row {row}" if item_ids is None else f"id {item_ids[row]} (row {row})"


def _take_rows(X: Any, rows: np.ndarray) -> Any:
    """Rows of a numpy array or torch tensor, keeping its kind."""
    if hasattr(X, "detach") and hasattr(X, "index_select"):
        import torch

        return X.index_select(0, torch.as_tensor(rows, dtype=torch.long, device=X.device))
    return np.asarray(X)[rows]


def _embeddings(X: Any) -> Any:
    """The embedding array of a collection (anything with ``.embeddings``), else ``X``."""
    return X.embeddings if hasattr(X, "embeddings") and not hasattr(X, "shape") else X


def _n_rows(X: Any, name: str) -> int:
    shape = getattr(X, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"{name} must be a 2-D (n, d) array of embeddings, got shape {shape}.")
    return int(shape[0])


def _anchor_texts(anchors: Any) -> tuple[list[str], int | None]:
    if anchors is None:
        return [], None
    texts = getattr(anchors, "texts", None)
    if texts is not None or hasattr(anchors, "embeddings"):
        return [str(t) for t in (texts or [])], len(anchors)
    if isinstance(anchors, str):
        return [anchors], 1
    texts = [str(t) for t in anchors]
    return texts, len(texts)


def _is_missing(v: Any) -> bool:
    if v is None:
        return True
    try:
        return bool(isinstance(v, float) and math.isnan(v))
    except TypeError:
        return False


def _column_items(collection: Any, kind: str) -> list[Any] | None:
    meta = getattr(collection, "metadata", None)
    if meta is None:
        return None
    if getattr(collection, "item_column", None):
        return meta[collection.item_column].tolist()
    for col in ITEM_COLUMNS[kind]:
        if col in meta.columns:
            return meta[col].tolist()
    return None


def _normalize_labels(labels: Any, collection: Any, n: int, arg: str) -> dict[str, Any]:
    """Factor name -> label array (length n) or relevance function."""
    if labels is None:
        return {}
    if callable(labels) and not isinstance(labels, Mapping):
        return {"relevant": labels}
    if isinstance(labels, str) or (
        isinstance(labels, Sequence) and labels and all(isinstance(c, str) for c in labels)
        and collection is not None
    ):
        meta = getattr(collection, "metadata", None)
        cols = [labels] if isinstance(labels, str) else list(labels)
        if meta is None:
            raise ValueError(f"{arg} names metadata columns {cols}, but the gallery has no metadata.")
        missing = [c for c in cols if c not in meta.columns]
        if missing:
            raise KeyError(f"{arg}: columns {missing} are not in the metadata; columns: {list(meta.columns)}")
        return {c: meta[c].to_numpy() for c in cols}
    if hasattr(labels, "columns") and hasattr(labels, "__getitem__"):  # a DataFrame
        labels = {str(c): labels[c].to_numpy() for c in labels.columns}
    if not isinstance(labels, Mapping):
        raise ValueError(
            f"{arg} must be a mapping of factor -> labels (or relevance function), a DataFrame, "
            f"a relevance function or metadata column names; got {type(labels).__name__}."
        )
    out: dict[str, Any] = {}
    for name, value in labels.items():
        if callable(value):
            out[str(name)] = value
            continue
        arr = _to_numpy(value) if hasattr(value, "detach") else np.asarray(list(value), dtype=object)
        if arr.ndim != 1 or len(arr) != n:
            raise ValueError(f"{arg}[{name!r}] must hold one label per row ({n}), got shape {arr.shape}.")
        out[str(name)] = arr
    return out


def _search(geometry: Any, Q: Any, G: Any, k: int, own: list[int | None], exclude_self: bool,
            symmetric: bool, n_gallery: int, progress: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k (distances, indices), each query's own gallery row excluded when asked."""
    drop = exclude_self and any(r is not None for r in own)
    extra = {} if progress is None else {"progress": progress}
    if drop:
        extra["exclude"] = np.array([-1 if r is None else int(r) for r in own], dtype=np.int64)
    d, i = geometry.search(Q, G, k=k, symmetric=symmetric, **extra)
    return _to_numpy(d).astype(np.float64), _to_numpy(i).astype(np.int64)


def _query_positions(query_indices: Sequence[int] | None, m_all: int) -> np.ndarray:
    """The positions in ``queries`` of the queries shown, checked."""
    if query_indices is None:
        qidx = np.arange(m_all)
    else:
        qidx = np.asarray(query_indices).reshape(-1)
        if qidx.size == 0:
            raise ValueError("query_indices is empty; pass at least one query.")
        if qidx.dtype.kind not in "iu":
            raise ValueError(f"query_indices must be integers, got {qidx.tolist()[:5]} (dtype {qidx.dtype}).")
        qidx = qidx.astype(np.int64)
    if qidx.min() < 0 or qidx.max() >= m_all:
        raise ValueError(f"query_indices must lie in [0, {m_all}), got {qidx.tolist()}.")
    return qidx


def _query_gallery_rows(query_rows: Sequence[int | None] | None, same: bool, n: int, m_all: int
                        ) -> list[int | None]:
    """The gallery row of every query (None for one that is not a gallery item), checked."""
    if query_rows is None:
        return list(range(n)) if same else [None] * m_all
    rows_all = [None if _is_missing(r) or (isinstance(r, (int, np.integer)) and r < 0) else int(r)
                for r in query_rows]
    if len(rows_all) != m_all:
        raise ValueError(f"query_rows has {len(rows_all)} entries but there are {m_all} queries.")
    bad = [r for r in rows_all if r is not None and not 0 <= r < n]
    if bad:
        raise ValueError(f"query_rows must be gallery rows in [0, {n}), got {bad[:5]}.")
    return rows_all


def _gallery_items(collection: Any, kind: str, n: int, items: Sequence[Any] | None,
                   item_ids: Sequence[Any] | None) -> tuple[list[Any] | None, list[Any] | None]:
    """The gallery's items and ids, from the arguments or the collection, one per row."""
    if items is None and collection is not None:
        items = _column_items(collection, kind)
    if items is not None:
        items = list(items)
        if len(items) != n:
            raise ValueError(f"items has {len(items)} entries but the gallery has {n} rows.")
    if item_ids is None and collection is not None and getattr(collection, "metadata", None) is not None \
            and "id" in collection.metadata.columns:
        item_ids = collection.metadata["id"].tolist()
    if item_ids is not None:
        item_ids = list(item_ids)
        if len(item_ids) != n:
            raise ValueError(f"item_ids has {len(item_ids)} entries but the gallery has {n} rows.")
    return items, item_ids


def _shown_query_items(query_items: Sequence[Any] | None, items: list[Any] | None, qidx: np.ndarray,
                       own: list[int | None], m_all: int) -> list[Any]:
    """The item of each shown query: its own, else its gallery row's, else None."""
    if query_items is not None:
        query_items = list(query_items)
        if len(query_items) != m_all:
            raise ValueError(f"query_items has {len(query_items)} entries but there are {m_all} queries.")
    return [
        query_items[q] if query_items is not None
        else (items[r] if items is not None and r is not None else None)
        for q, r in zip(qidx, own)
    ]


def _query_titles(query_titles: Sequence[str] | None, item_ids: list[Any] | None, qidx: np.ndarray,
                  own: list[int | None], m_all: int) -> list[str]:
    """The heading of each shown query."""
    if query_titles is None:
        return [f"Query {j + 1}" + (f" · {_item_label(item_ids, r)}" if r is not None else "")
                for j, r in enumerate(own)]
    query_titles = [str(t) for t in query_titles]
    if len(query_titles) != m_all:
        raise ValueError(f"query_titles has {len(query_titles)} entries but there are {m_all} queries.")
    return [query_titles[q] for q in qidx]


def _factor_values(factors: dict[str, Any], query_labels: Mapping[str, Sequence[Any]] | None, qidx: np.ndarray,
                   own: list[int | None], m_all: int
                   ) -> tuple[dict[str, list[Any]], dict[str, np.ndarray | None], dict[str, np.ndarray]]:
    """Per factor: each shown query's value, the gallery's labels and where relevance is known."""
    qlabels = {str(f): list(v) for f, v in (query_labels or {}).items()}
    for f, v in qlabels.items():
        if len(v) != m_all:
            raise ValueError(f"query_labels[{f!r}] has {len(v)} entries but there are {m_all} queries.")
    query_values: dict[str, list[Any]] = {}
    gallery_values: dict[str, np.ndarray | None] = {}
    for f, src in factors.items():
        if callable(src):
            query_values[f], gallery_values[f] = [None] * len(qidx), None
            continue
        gallery_values[f] = src
        vals = []
        for q, r in zip(qidx, own):
            if f in qlabels:
                vals.append(qlabels[f][q])
            else:
                vals.append(src[r] if r is not None else None)
        query_values[f] = [None if _is_missing(v) else v for v in vals]
    known = {
        f: np.array([True] * len(qidx) if callable(src) else [v is not None for v in query_values[f]], dtype=bool)
        for f, src in factors.items()
    }
    return query_values, gallery_values, known


def _geometry_rows(geometries: Mapping[str, Any], factors: dict[str, Any], mark: Sequence[str] | None
                   ) -> list[GeometryRow]:
    """How each geometry is shown, its marked factors checked against the factors."""
    default_mark = tuple(factors) if mark is None else tuple(str(f) for f in mark)
    rows: list[GeometryRow] = []
    for name, spec in geometries.items():
        spec = spec if isinstance(spec, ReportGeometry) else ReportGeometry(spec)
        texts, n_anchors = _anchor_texts(spec.anchors)
        label = spec.label or (f"{name} ({n_anchors} anchors)" if n_anchors else str(name))
        row_mark = default_mark if spec.mark is None else tuple(str(f) for f in spec.mark)
        for f in row_mark + ((spec.factor,) if spec.factor else ()):
            if f not in factors:
                raise ValueError(
                    f"geometry {name!r} marks factor {f!r}, but the factors are {list(factors)}; "
                    "pass labels for it or remove it from mark/factor."
                )
        rows.append(GeometryRow(str(name), label, texts, n_anchors, spec.factor, row_mark))
    return rows


def _top_anchors(anchors: Any, Qs: Any, tau: Any, m: int) -> list[list[tuple[str, float]]]:
    """Each query's most probable anchors under the softmax over them."""
    from ..diagnostics import explain

    ex = explain(anchors, _to_numpy(Qs), tau, top=TOP_ANCHORS)
    return [[(str(a), p) for a, p in ex.top_anchors(j)] for j in range(m)]


def _relevance(factors: dict[str, Any], query_values: dict[str, list[Any]], qidx: np.ndarray, i: np.ndarray,
               k: int) -> dict[str, np.ndarray]:
    """Per factor, whether each neighbour in ``i`` is relevant to its query."""
    rel = {}
    for f, src in factors.items():
        if callable(src):
            r = np.stack([np.asarray(src(int(q), i[j].copy()), dtype=bool).reshape(-1) for j, q in enumerate(qidx)])
            if r.shape != i.shape:
                raise ValueError(f"relevance function {f!r} must return {k} booleans per query, got {r.shape[1]}.")
        else:
            qv = query_values[f]
            r = np.array([[qv[j] is not None and src[g] == qv[j] for g in i[j]] for j in range(len(qidx))],
                         dtype=bool).reshape(i.shape)
        rel[f] = r
    return rel


def compare(
    queries: Any,
    gallery: Any,
    geometries: Mapping[str, Any],
    *,
    k: int = 8,
    query_indices: Sequence[int] | None = None,
    query_rows: Sequence[int | None] | None = None,
    exclude_self: bool = True,
    labels: Any = None,
    query_labels: Mapping[str, Sequence[Any]] | None = None,
    items: Sequence[Any] | None = None,
    query_items: Sequence[Any] | None = None,
    query_titles: Sequence[str] | None = None,
    kind: str | None = None,
    mark: Sequence[str] | None = None,
    symmetric: bool = True,
    info: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    item_ids: Sequence[Any] | None = None,
) -> ComparisonResult:
    """Top-k neighbours of the same queries under several geometries.

    Parameters
    ----------
    queries : array-like of shape (m, d)
        Query embeddings (numpy or torch). Pass the gallery object itself to query the
        gallery with its own items; ``query_rows`` then defaults to ``arange(n)``.
    gallery : array-like of shape (n, d) or anchordiv.io.Collection
        Gallery embeddings. A collection also supplies ``kind``, the items (its
        ``caption`` / ``image_path`` metadata column) and named label columns.
    geometries : mapping of str to Geometry or ReportGeometry
        Fitted geometries by name, in row order. A bare geometry is labelled with its
        name.
    k : int, optional
        Neighbours per query and geometry.
    query_indices : sequence of int, optional
        Which queries to show (indices into ``queries``); all by default.
    query_rows : sequence of int or None, optional
        For each query in ``queries``, its gallery row, or None when it is not a gallery
        item. A known row supplies the query's labels, item and title.
    exclude_self : bool, optional
        Leave a query's own gallery row out of its neighbours.
    labels : mapping, DataFrame, callable, str or list of str, optional
        What makes a neighbour relevant, per factor: a mapping ``factor -> gallery
        labels`` (one per gallery row; a neighbour is relevant when its label equals the
        query's) or ``factor -> fn(query_index, gallery_indices) -> bool array``; a
        DataFrame (each column a factor); a single relevance function (factor
        ``"relevant"``); or metadata column name(s) of a collection ``gallery``.
    query_labels : mapping of str to sequence, optional
        Per factor, the label of each query in ``queries``; needed for queries that are
        not gallery rows.
    items : sequence, optional
        Gallery items shown on the cards: texts, or image paths / PIL images.
    query_items : sequence, optional
        The items of ``queries`` (default: the gallery items at ``query_rows``).
    query_titles : sequence of str, optional
        Heading of each query in ``queries`` (default: ``"Query i · id ID (row N)"`` for a
        gallery item, ``"Query i · row N"`` when the items have no ids).
    kind : {"text", "image"}, optional
        What the items are (default: the collection's kind, else ``"text"``).
    mark : sequence of str, optional
        Factors marked with chips on each neighbour (default: all); a row's
        :attr:`ReportGeometry.mark` overrides it.
    symmetric : bool, optional
        Rank by the symmetrized divergence (see :meth:`anchordiv.Geometry.search`).
    info : mapping, optional
        Extra facts shown in the report header (e.g. collection path, temperature).
    progress : bool, optional
        Show (True) or hide (False) the search progress bars; by default they are shown
        for long searches only.
    item_ids : sequence, optional
        Each gallery row's id, as the command line shows it (default: the collection's
        ``id`` metadata column when it has one; without it an item's id is its row number).

    Returns
    -------
    ComparisonResult

    Raises
    ------
    ValueError
        On empty ``geometries``, a bad ``k``, ``kind`` or index, mismatched lengths, or a
        ``mark`` / ``factor`` that names no factor.
    """
    if not geometries:
        raise ValueError("geometries is empty; pass at least one name -> fitted geometry.")
    same = queries is gallery
    G = _embeddings(gallery)
    collection = gallery if G is not gallery else None
    Q = G if same else _embeddings(queries)
    n, m_all = _n_rows(G, "gallery"), _n_rows(Q, "queries")
    if kind is None:
        kind = getattr(collection, "kind", None) or "text"
    if kind not in ITEM_COLUMNS:
        raise ValueError(f"kind must be 'text' or 'image', got {kind!r}.")
    k = positive_int(k, "k")
    if progress is not None:
        progress = bool(progress)

    qidx = _query_positions(query_indices, m_all)
    rows_all = _query_gallery_rows(query_rows, same, n, m_all)
    own = [rows_all[q] for q in qidx]
    available = n - (1 if exclude_self and any(r is not None for r in own) else 0)
    if k > available:
        raise ValueError(f"k={k} exceeds the {available} gallery items available; pass k <= {available}.")

    items, item_ids = _gallery_items(collection, kind, n, items, item_ids)
    shown_items = _shown_query_items(query_items, items, qidx, own, m_all)
    titles = _query_titles(query_titles, item_ids, qidx, own, m_all)
    factors = _normalize_labels(labels, collection, n, "labels")
    query_values, gallery_values, known = _factor_values(factors, query_labels, qidx, own, m_all)
    rows = _geometry_rows(geometries, factors, mark)

    Qs = _take_rows(Q, qidx)
    indices, distances, relevant, top_anchors = {}, {}, {}, {}
    for row, spec in zip(rows, geometries.values()):
        geom = spec.geometry if isinstance(spec, ReportGeometry) else spec
        d, i = _search(geom, Qs, G, k, own, exclude_self, symmetric, n, progress)
        distances[row.name], indices[row.name] = d, i
        anchors = spec.anchors if isinstance(spec, ReportGeometry) else None
        if getattr(anchors, "embeddings", None) is not None and getattr(geom, "tau_", None) is not None:
            top_anchors[row.name] = _top_anchors(anchors, Qs, geom.tau_, len(qidx))
        relevant[row.name] = _relevance(factors, query_values, qidx, i, k)

    return ComparisonResult(
        kind=kind, k=k, rows=rows, query_indices=qidx, query_rows=own, query_titles=titles,
        query_items=shown_items, factors=list(factors), query_values=query_values,
        gallery_values=gallery_values, indices=indices, distances=distances, relevant=relevant,
        known=known, items=items, info=dict(info or {}), item_ids=item_ids, top_anchors=top_anchors,
    )


def cards(queries: Any, gallery: Any, geometry: Any, *, k: int = 8, name: str | None = None, **kwargs: Any
          ) -> ComparisonResult:
    """The neighbours of ``queries`` under one geometry as a card grid: a :class:`ComparisonResult`
    that a notebook shows inline (``_repr_html_``) and :func:`write_report` writes.

    ``geometry`` is a fitted geometry or a :class:`ReportGeometry`; ``kwargs`` are those of
    :func:`compare`. The search itself is :meth:`anchordiv.Geometry.search`, which keeps
    returning ``(distances, indices)``.
    """
    geom = geometry.geometry if isinstance(geometry, ReportGeometry) else geometry
    return compare(queries, gallery, {name or type(geom).__name__.lower(): geometry}, k=k, **kwargs)
