"""Side-by-side neighbour reports: the same query, its nearest neighbours under several geometries.

:func:`compare` runs an exact top-k search for each named geometry and collects, for each
query, one row per geometry: the neighbours, their distances and, when labels are known,
which neighbours share the query's label for each label column ("factor").
:func:`write_report` turns the result into one plain view (:class:`ReportView`) and renders
it twice: as a self-contained HTML page (``index.html``, from the Jinja2 template
``templates/report.html.j2`` with autoescaping on: inline CSS, images embedded as base64
thumbnails, no external resources) and as a PNG grid (``grid.png``, drawn with matplotlib).
Names and texts are escaped in the page (factor names reach attribute names only as tokens
``f0``, ``f1``, ...; the header lists them) and drawn literally in the PNG (no mathtext). Images are read only from regular files of at most
:data:`MAX_IMAGE_BYTES`; others, and Pillow's decompression bombs, are shown as unavailable
and counted in :attr:`ReportPaths.skipped`.

Each row is labelled with its geometry and the anchors that define it. A row may have a
*primary* factor (for an anchor set naming breeds, ``"breed"``): neighbours that share
the query's value of that factor get a green border, and the row's precision@k on it is
shown first. The factors *marked* on a row get a ✓/✗ chip on every neighbour.

Examples
--------
>>> import numpy as np, anchordiv as ad
>>> from anchordiv.report import ReportGeometry, compare, write_report
>>> X = np.eye(4, dtype=np.float32)
>>> res = compare(X, X, {"cosine": ad.Cosine()}, k=2, items=list("abcd"),
...               labels={"letter": ["x", "x", "y", "y"]})
>>> res.indices["cosine"].shape
(4, 2)
>>> write_report(res, "report")  # doctest: +SKIP
"""

from __future__ import annotations

import re

import base64
import io
import math
import os
import stat
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ._util import positive_int, require

__all__ = ["ReportGeometry", "GeometryRow", "ComparisonResult", "ReportPaths", "compare", "cards", "write_report"]

#: Metadata column holding the items of a collection, by kind.
ITEM_COLUMNS = {"text": ("caption", "text"), "image": ("image_path", "path", "filepath")}

#: Characters of a text shown on a card (the full text is in the tooltip).
CARD_CHARS = 220

#: Longest side, in pixels, of an embedded thumbnail.
THUMBNAIL_PX = 160

#: Most probable anchors shown for each query on an anchor row.
TOP_ANCHORS = 3

#: Anchors listed in full under a row (the rest are counted).
MAX_LISTED_ANCHORS = 200

#: Largest image file, in bytes, that is read for a thumbnail (larger ones are skipped).
MAX_IMAGE_BYTES = 64 * 2**20

#: Why an image was skipped: the keys of :attr:`ReportPaths.skipped`.
SKIP_REASONS = ("missing", "unreadable", "not_a_file", "too_large", "decompression_bomb", "corrupt")

#: A relevance function: ``fn(query_index, gallery_indices) -> bool array``.
RelevanceFn = Callable[[int, np.ndarray], Any]


# ---------------------------------------------------------------------------
# inputs


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
        return _render_html(_view(self, "Neighbours under each geometry", _Thumbs(THUMBNAIL_PX)), fragment=True)

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


@dataclass(frozen=True)
class ReportPaths:
    """Files written by :func:`write_report`; ``os.fspath`` gives the HTML page.

    Attributes
    ----------
    html : pathlib.Path
        The self-contained page, ``index.html``.
    png : pathlib.Path or None
        The grid image, ``grid.png`` (None when not written).
    skipped : dict of str to int
        Images shown as unavailable, counted once each, by reason (see :data:`SKIP_REASONS`):
        ``missing``, ``unreadable`` (no permission, not a path), ``not_a_file`` (FIFO, device,
        folder), ``too_large`` (over :data:`MAX_IMAGE_BYTES`), ``decompression_bomb`` (over
        Pillow's ``Image.MAX_IMAGE_PIXELS``) or ``corrupt``. Reasons with no image are left out.
    """

    html: Path
    png: Path | None
    skipped: dict[str, int] = field(default_factory=dict)

    def __fspath__(self) -> str:
        return os.fspath(self.html)

    def __str__(self) -> str:
        return os.fspath(self.html)


# ---------------------------------------------------------------------------
# helpers


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


def _is_text_query(item: Any) -> bool:
    """A query item given as text rather than as an image: a str that is not a file."""
    return isinstance(item, str) and not os.path.isfile(item)


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


# ---------------------------------------------------------------------------
# compare


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
    if query_rows is None:
        rows_all: list[int | None] = list(range(n)) if same else [None] * m_all
    else:
        rows_all = [None if _is_missing(r) or (isinstance(r, (int, np.integer)) and r < 0) else int(r)
                    for r in query_rows]
        if len(rows_all) != m_all:
            raise ValueError(f"query_rows has {len(rows_all)} entries but there are {m_all} queries.")
        bad = [r for r in rows_all if r is not None and not 0 <= r < n]
        if bad:
            raise ValueError(f"query_rows must be gallery rows in [0, {n}), got {bad[:5]}.")
    own = [rows_all[q] for q in qidx]
    available = n - (1 if exclude_self and any(r is not None for r in own) else 0)
    if k > available:
        raise ValueError(f"k={k} exceeds the {available} gallery items available; pass k <= {available}.")

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
    if query_items is not None:
        query_items = list(query_items)
        if len(query_items) != m_all:
            raise ValueError(f"query_items has {len(query_items)} entries but there are {m_all} queries.")
    shown_items = [
        query_items[q] if query_items is not None
        else (items[r] if items is not None and r is not None else None)
        for q, r in zip(qidx, own)
    ]
    if query_titles is not None:
        query_titles = [str(t) for t in query_titles]
        if len(query_titles) != m_all:
            raise ValueError(f"query_titles has {len(query_titles)} entries but there are {m_all} queries.")
        titles = [query_titles[q] for q in qidx]
    else:
        titles = [f"Query {j + 1}" + (f" · {_item_label(item_ids, r)}" if r is not None else "")
                  for j, r in enumerate(own)]

    factors = _normalize_labels(labels, collection, n, "labels")
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

    Qs = _take_rows(Q, qidx)
    indices, distances, relevant, top_anchors = {}, {}, {}, {}
    for row, spec in zip(rows, geometries.values()):
        geom = spec.geometry if isinstance(spec, ReportGeometry) else spec
        d, i = _search(geom, Qs, G, k, own, exclude_self, symmetric, n, progress)
        distances[row.name], indices[row.name] = d, i
        anchors = spec.anchors if isinstance(spec, ReportGeometry) else None
        if getattr(anchors, "embeddings", None) is not None and getattr(geom, "tau_", None) is not None:
            from .diagnostics import explain

            ex = explain(anchors, _to_numpy(Qs), geom.tau_, top=TOP_ANCHORS)
            top_anchors[row.name] = [[(str(a), p) for a, p in ex.top_anchors(j)] for j in range(len(qidx))]
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
        relevant[row.name] = rel

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


# ---------------------------------------------------------------------------
# rendering helpers


class _Skip(Exception):
    """An image that is not shown, with the reason (one of :data:`SKIP_REASONS`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _read_image_file(path: Any) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_IMAGE_BYTES`; raises :class:`_Skip` otherwise.

    The file is opened non-blocking and checked with ``fstat`` before reading, so a FIFO or
    a device is never read from.
    """
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise _Skip("unreadable")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise _Skip("missing") from None
    except (OSError, ValueError):
        raise _Skip("unreadable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Skip("not_a_file")
        cap = MAX_IMAGE_BYTES
        if st.st_size > cap:
            raise _Skip("too_large")
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:
            raise _Skip("too_large")
        return b"".join(chunks)
    except OSError:
        raise _Skip("unreadable") from None
    finally:
        os.close(fd)


def _thumbnail(item: Any, px: int = THUMBNAIL_PX) -> "Any":
    """An RGB PIL thumbnail of an image path or PIL image; raises :class:`_Skip` if unreadable."""
    from PIL import Image

    from .encoders._base import open_rgb

    if isinstance(item, Image.Image):
        im = item.copy()
    else:
        data = _read_image_file(item)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(data)) as f:
                    im = f.copy()
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise _Skip("decompression_bomb") from None
        except Exception:  # any decoder failure of an untrusted file
            raise _Skip("corrupt") from None
    try:
        im = open_rgb(im)  # transparent pixels on white, as the encoders see them
        im.thumbnail((px, px))
    except Exception:
        raise _Skip("corrupt") from None
    return im


class _Thumbs:
    """Thumbnails of the items of one report, read once each, with the skipped ones counted."""

    def __init__(self, px: int):
        self.px = px
        self._cache: dict[Any, Any] = {}
        self._reasons: dict[Any, str] = {}

    def get(self, key: Any, item: Any) -> "Any | None":
        """The thumbnail of ``item`` (cached under ``key``), or None when it is skipped."""
        if key not in self._cache:
            try:
                self._cache[key] = _thumbnail(item, self.px) if item is not None else None
            except _Skip as e:
                self._cache[key] = None
                self._reasons[key] = e.reason
        return self._cache[key]

    def reason(self, key: Any) -> str | None:
        return self._reasons.get(key)

    def skipped(self) -> dict[str, int]:
        """Per reason, how many images were skipped (reasons with none left out)."""
        counts = {r: 0 for r in SKIP_REASONS}
        for r in self._reasons.values():
            counts[r] += 1
        return {r: c for r, c in counts.items() if c}


def _data_uri(im: Any) -> str:
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _short(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _anchor_preview(texts: list[str], n: int | None, width: int = 90) -> str:
    if not texts:
        return f"{n} anchors" if n else ""
    shown, used = [], 0
    for t in texts:
        t = _short(t, 40)
        if shown and used + len(t) > width:
            break
        shown.append(t)
        used += len(t) + 3
    rest = (n or len(texts)) - len(shown)
    return " · ".join(shown) + (f" … (+{rest})" if rest > 0 else "")


def _fmt_value(v: Any) -> str:
    return "?" if v is None else _short(str(v), 40)


def _fmt_d(d: float) -> str:
    if d == 0 or not np.isfinite(d):
        return f"{d:g}"
    return f"{d:.1e}" if abs(d) < 1e-2 or abs(d) >= 1e4 else f"{d:.3g}"


def _fmt_p(p: float) -> str:
    return "–" if not np.isfinite(p) else f"{p:.2f}"


# ---------------------------------------------------------------------------
# the view: what the page and the grid show


@dataclass
class Content:
    """The body of a card: a thumbnail, an unavailable image or a text.

    ``src`` is the thumbnail as a data URI (``text`` is then its file name); ``reason`` says
    why an image is unavailable (``text`` names it); with neither, ``text`` is the item's text.
    """

    text: str
    src: str | None = None
    reason: str | None = None

    @property
    def is_image(self) -> bool:
        return self.src is not None or self.reason is not None

    @property
    def short(self) -> str:
        return _short(self.text, CARD_CHARS)

    @property
    def long(self) -> bool:
        """Whether the card shows the start only (the full text expands below it)."""
        return len(" ".join(self.text.split())) > CARD_CHARS


@dataclass
class Chip:
    """A ✓/✗ mark of a neighbour: whether its ``value`` of ``factor`` is the query's."""

    factor: str
    value: str
    same: bool


@dataclass
class NeighbourView:
    """One neighbour card; ``row`` is its gallery row, ``id`` its id (the row where there are
    no ids), ``label`` its name (``id ID (row N)``, or ``row N``); ``relevant`` maps factor
    tokens (``f0``, ...) to relevance, known ones only."""

    rank: int
    row: int
    id: str
    distance: float
    distance_text: str
    hit: bool
    relevant: dict[str, bool]
    chips: list[Chip]
    content: Content
    label: str = ""


@dataclass
class RowView:
    """One geometry row of a query: its label, anchors, precisions (factor, text, primary) and neighbours."""

    name: str
    label: str
    factor: str | None
    preview: str
    anchors: list[str]
    more: int
    n_anchors: int | None
    precision: list[tuple[str, str, bool]]
    neighbours: list[NeighbourView]
    top: str = ""


@dataclass
class QueryView:
    """One query: heading, text (text queries only), known factor values, its card and its rows."""

    position: int
    row: int
    title: str
    text: str | None
    values: list[tuple[str, str]]
    head: str
    content: Content
    rows: list[RowView]


@dataclass
class ReportView:
    """Everything the page (``templates/report.html.j2``) and the PNG grid show, as plain data."""

    title: str
    kind: str
    k: int
    n_geometries: int
    info: list[tuple[str, str]]
    factors: list[tuple[str, str]]
    queries: list[QueryView]
    skipped: dict[str, int]


def _view(r: ComparisonResult, title: str, thumbs: _Thumbs) -> ReportView:
    """The :class:`ReportView` of a result: the one walk over it, reading each image once."""
    token = {f: f"f{i}" for i, f in enumerate(r.factors)}
    uris: dict[Any, str | None] = {}

    def content(key: Any, item: Any, fallback: str, query: bool = False) -> Content:
        if r.kind == "text" or (query and _is_text_query(item)):
            return Content(fallback if item is None else str(item))
        if key not in uris:
            im = thumbs.get(key, item)
            uris[key] = None if im is None else _data_uri(im)
        path = isinstance(item, (str, os.PathLike))
        if uris[key] is None:
            return Content(_short(os.fspath(item), 60) if path else fallback, reason=thumbs.reason(key) or "missing")
        return Content(os.path.basename(os.fspath(item)) if path else fallback, src=uris[key])

    queries = []
    for qi in range(r.n_queries):
        own, item = r.query_rows[qi], r.query_items[qi]
        card = content(("g", own) if own is not None else ("q", qi), item, r.query_titles[qi], query=True)
        rows = []
        for grow in r.rows:
            order = sorted(r.factors, key=lambda f: f != grow.factor)  # the primary factor first
            known = [f for f in order if r.known[f][qi]]
            neighbours = []
            for rank in range(r.k):
                g, d = int(r.indices[grow.name][qi, rank]), float(r.distances[grow.name][qi, rank])
                rel = {f: bool(r.relevant[grow.name][f][qi, rank]) for f in known}
                vals = r.gallery_values
                chips = [Chip(f, _fmt_value(vals[f][g]) if vals[f] is not None else f, rel[f])
                         for f in known if f in grow.mark]
                neighbours.append(NeighbourView(
                    rank + 1, g, str(r.item_id(g)), d, _fmt_d(d), rel.get(grow.factor, False),
                    {token[f]: v for f, v in rel.items()},
                    chips, content(("g", g), r.items[g] if r.items is not None else None, r.item_label(g)),
                    r.item_label(g)))
            listed = grow.anchor_texts[:MAX_LISTED_ANCHORS]
            precision = [(f, _fmt_p(float(r.precision_at_k(grow.name, f)[qi])), f == grow.factor)
                         for f in order if f in grow.mark or f == grow.factor]
            top = r.top_anchors.get(grow.name)
            rows.append(RowView(grow.name, grow.label, grow.factor, _anchor_preview(grow.anchor_texts, grow.n_anchors),
                                listed, (grow.n_anchors or len(grow.anchor_texts)) - len(listed), grow.n_anchors,
                                precision, neighbours,
                                " · ".join(f"{_short(a, 40)} {p:.2f}" for a, p in top[qi]) if top else ""))
        text = str(item) if item is not None and (r.kind == "text" or _is_text_query(item)) else None
        values = [(f, _fmt_value(r.query_values[f][qi])) for f in r.factors if r.query_values[f][qi] is not None]
        head = "query" + (f" · {r.item_label(own)}" if own is not None else "")
        queries.append(QueryView(qi, int(r.query_indices[qi]), r.query_titles[qi], text, values, head, card, rows))
    return ReportView(title, r.kind, r.k, len(r.rows), [(str(k), str(v)) for k, v in r.info.items()],
                      [(t, f) for f, t in token.items()], queries, thumbs.skipped())


#: The element that holds a report rendered as a fragment; its styles apply inside it only.
FRAGMENT_CLASS = "anchordiv-report"


def scope_css(css: str, scope: str = "." + FRAGMENT_CLASS) -> str:
    """The rules of ``css`` (one selector list per line start) applied inside ``scope`` only:
    ``body`` becomes the scope itself, every other selector is prefixed with it."""
    def rule(match: re.Match) -> str:
        selectors = [sel.strip() for sel in match.group(1).split(",")]
        return ", ".join(scope if sel == "body" else f"{scope} {sel}" for sel in selectors) + " {"

    return re.sub(r"(?m)^([^\s{}][^{}]*?)\s*\{", rule, css)


def _render_html(view: ReportView, fragment: bool = False) -> str:
    """The page: ``templates/report.html.j2`` rendered with autoescaping on (``fragment``: a
    ``<div>`` whose styles apply inside it only, for a notebook cell)."""
    jinja2 = require("jinja2", "jinja2", "write_report")
    env = jinja2.Environment(loader=jinja2.PackageLoader("anchordiv", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True)
    # the template's own stylesheet (template text, not data): scoped, it stays template text
    env.filters["scope_css"] = lambda text: type(text)(scope_css(str(text)))
    return env.get_template("report.html.j2").render(vars(view), fragment=fragment)


# ---------------------------------------------------------------------------
# PNG


def _draw_grid(view: ReportView, path: Path, dpi: float) -> None:
    """Draw the comparison grid of ``view`` with matplotlib (Agg, no pyplot state) into ``path``.

    Every text is drawn with ``parse_math=False``: user strings with ``$`` stay literal.
    Thumbnails are decoded from the same data URIs the page embeds.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch
    from PIL import Image

    k = view.k
    card_w, gap = 1.5, 0.06
    longest = max([len(row.label) for q in view.queries for row in q.rows] + [1])
    label_w = min(5.0, max(2.3, longest / 3 * 7.5 * 0.55 / 72 + 0.4))  # each label fits in three lines
    card_h = 1.45 if view.kind == "image" else 1.2
    chip_h = 0.16 if any(n.chips for q in view.queries for row in q.rows for n in row.neighbours) else 0.0
    head_h, title_h = 0.55, 0.5
    width = label_w + (k + 1) * (card_w + gap) + 0.2
    height = title_h + len(view.queries) * (head_h + view.n_geometries * (card_h + gap)) + 0.2
    dpi = min(dpi, 12000 / max(width, height))
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")

    def draw_text(*args, **kwargs):
        return ax.text(*args, parse_math=False, **kwargs)

    fs = 6.8
    chars = max(12, int(card_w * 72 / (fs * 0.55)) - 3)
    max_lines = int((card_h - 0.22 - chip_h) / (fs * 1.25 / 72))
    arrays: dict[str, np.ndarray] = {}

    def box(x, y, w, h, edge, face, lw):
        ax.add_patch(FancyBboxPatch((x + 0.02, y + 0.02), w - 0.04, h - 0.04, boxstyle="round,pad=0,rounding_size=0.05",
                                    linewidth=lw, edgecolor=edge, facecolor=face))

    def content(x, y, c: Content):
        top = y + 0.2
        avail = card_h - 0.24 - chip_h
        if c.src is not None:
            if c.src not in arrays:
                with Image.open(io.BytesIO(base64.b64decode(c.src.split(",", 1)[1]))) as im:
                    arrays[c.src] = np.asarray(im.convert("RGB"))
            arr = arrays[c.src]
            h_px, w_px = arr.shape[:2]
            scale = min((card_w - 0.12) / w_px, avail / h_px)
            w_in, h_in = w_px * scale, h_px * scale
            x0, y0 = x + (card_w - w_in) / 2, top + (avail - h_in) / 2
            ax.imshow(arr, extent=(x0, x0 + w_in, y0 + h_in, y0), aspect="auto", interpolation="antialiased",
                      zorder=3)
        elif c.is_image:
            draw_text(x + card_w / 2, top + avail / 2, "image\nunavailable", ha="center", va="center",
                      fontsize=6.5, color="#cf222e")
        else:
            lines = textwrap.wrap(" ".join(c.text.split()), chars, break_long_words=True) or [""]
            if len(lines) > max_lines:
                lines = lines[:max_lines]
                lines[-1] = _short(lines[-1], chars - 1).rstrip("…") + "…"
            draw_text(x + 0.07, top, "\n".join(lines), ha="left", va="top", fontsize=fs, linespacing=1.25,
                      color="#1f2328", zorder=3)

    draw_text(0.12, 0.3, view.title, fontsize=13, fontweight="bold", va="center")
    y = title_h
    for q in view.queries:
        qtext = _short(q.title + (": " + q.text if q.text is not None else ""), int(width * 72 / (9 * 0.62)) - 2)
        draw_text(0.12, y + 0.2, qtext, fontsize=9, fontweight="bold", va="center")
        if q.values:
            draw_text(0.12, y + 0.42, " · ".join(f"{f}: {v}" for f, v in q.values), fontsize=7, color="#57606a",
                      va="center")
        y += head_h
        for row in q.rows:
            box(0.06, y, label_w - 0.06, card_h, "#1a7f37" if row.factor else "#8c959f", "#f6f8fa", 0.8)
            lab = textwrap.wrap(row.label, int(label_w * 72 / (7.5 * 0.55)) - 3, break_long_words=True)
            if len(lab) > 3:
                lab = lab[:2] + [_short(" ".join(lab[2:]), len(lab[2]))]
            draw_text(0.16, y + 0.12, "\n".join(lab), fontsize=7.5, fontweight="bold", va="top")
            prev = _anchor_preview(row.anchors, row.n_anchors, width=70)
            width_chars = int(label_w * 72 / (6 * 0.55)) - 4
            lines = textwrap.wrap(prev, width_chars)[:max(1, 4 - len(lab))] if prev else []
            if row.top:
                lines = lines[:max(0, 3 - len(lab))] + [_short("top: " + row.top, width_chars)]
            draw_text(0.16, y + 0.16 + 0.14 * len(lab), "\n".join(lines), fontsize=6, color="#57606a", va="top")
            shown = row.precision[:4]
            for j, (f, p, primary) in enumerate(shown):
                draw_text(0.16, y + card_h - 0.12 - 0.13 * (len(shown) - 1 - j), f"P@{k} {f}: {p}",
                          fontsize=6.3, va="bottom", color="#1a7f37" if primary else "#57606a",
                          fontweight="bold" if primary else "normal")
            x = label_w + gap
            box(x, y, card_w, card_h, "#0969da", "#f0f6ff", 1.2)
            draw_text(x + 0.07, y + 0.1, q.head, fontsize=5.8, color="#57606a", va="center")
            content(x, y, q.content)
            for n in row.neighbours:
                x = label_w + gap + n.rank * (card_w + gap)
                box(x, y, card_w, card_h, "#1a7f37" if n.hit else "#d0d7de", "#f3fbf4" if n.hit else "white",
                    2.4 if n.hit else 0.8)
                draw_text(x + 0.07, y + 0.1, f"{'✓ ' if n.hit else ''}{n.rank} · #{n.id} · d={n.distance_text}",
                          fontsize=5.8, color="#1a7f37" if n.hit else "#57606a", va="center",
                          fontweight="bold" if n.hit else "normal")
                content(x, y, n.content)
                cx = x + 0.07
                for chip in n.chips:
                    value = _short(chip.value, 12)
                    w = (len(value) + 2.2) * 5.3 * 0.58 / 72
                    if cx + w > x + card_w - 0.03:
                        break
                    draw_text(cx, y + card_h - 0.1, f"{'✓' if chip.same else '✗'} {value}", fontsize=5.3,
                              va="center", color="#116329" if chip.same else "#8c959f", zorder=4)
                    cx += w + 0.05
            y += card_h + gap
    fig.savefig(path, dpi=dpi, facecolor="white")


# ---------------------------------------------------------------------------
# write_report


def write_report(result: ComparisonResult, out_dir: str | os.PathLike, *, title: str = "Neighbours under each geometry",
                 png: bool = True, thumbnail_px: int = THUMBNAIL_PX, dpi: float = 110) -> ReportPaths:
    """Write the comparison as a self-contained HTML page and a PNG grid.

    Parameters
    ----------
    result : ComparisonResult
        From :func:`compare`.
    out_dir : str or os.PathLike
        Folder to write into (created if needed).
    title : str, optional
        Page and figure title.
    png : bool, optional
        Also draw ``grid.png`` (needs matplotlib).
    thumbnail_px : int, optional
        Longest side of the embedded image thumbnails.
    dpi : float, optional
        Resolution of the PNG (lowered for very large grids).

    Returns
    -------
    ReportPaths
        ``html`` (``out_dir/index.html``), ``png`` (``out_dir/grid.png`` or None) and
        ``skipped`` (unreadable images by reason); ``os.fspath`` of it is the HTML path.

    Raises
    ------
    ValueError
        If ``result`` is not a :class:`ComparisonResult`, or ``thumbnail_px`` is not a
        positive integer.
    """
    if not isinstance(result, ComparisonResult):
        raise ValueError(f"result must be a ComparisonResult from compare(), got {type(result).__name__}.")
    view = _view(result, str(title), _Thumbs(positive_int(thumbnail_px, "thumbnail_px")))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html_path = out / "index.html"
    html_path.write_text(_render_html(view), encoding="utf-8")
    png_path = None
    if png:
        png_path = out / "grid.png"
        _draw_grid(view, png_path, float(dpi))
    return ReportPaths(html=html_path, png=png_path, skipped=view.skipped)
