"""Side-by-side neighbour reports: the same query, its nearest neighbours under several geometries.

:func:`compare` runs an exact top-k search for each named geometry and collects, for each
query, one row per geometry: the neighbours, their distances and, when labels are known,
which neighbours share the query's label for each label column ("factor").
:func:`write_report` renders the result as a self-contained HTML page (``index.html``:
inline CSS, images embedded as base64 thumbnails, no external resources) and as a PNG
grid (``grid.png``, drawn with matplotlib). Names and texts are escaped in the page (factor
names reach attribute names only as tokens ``f0``, ``f1``, ...; the header lists them) and drawn
literally in the PNG (no mathtext). Images are read only from regular files of at most
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

import base64
import html
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

__all__ = ["ReportGeometry", "GeometryRow", "ComparisonResult", "ReportPaths", "compare", "write_report"]

#: Metadata column holding the items of a collection, by kind.
ITEM_COLUMNS = {"text": ("caption", "text"), "image": ("image_path", "path", "filepath")}

#: Characters of a text shown on a card (the full text is in the tooltip).
CARD_CHARS = 220

#: Longest side, in pixels, of an embedded thumbnail.
THUMBNAIL_PX = 160

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
            ``query_index``, ``geometry``, ``rank`` (1-based), ``index`` (gallery row),
            ``distance`` and ``relevant_<factor>`` per factor (NA when unknown).
        """
        import pandas as pd

        records = []
        for qi in range(self.n_queries):
            for r in self.rows:
                for rank in range(self.k):
                    rec = {
                        "query": qi, "query_index": int(self.query_indices[qi]), "geometry": r.name,
                        "rank": rank + 1, "index": int(self.indices[r.name][qi, rank]),
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


def _as_int(value: Any, name: str, minimum: int = 1) -> int:
    """``value`` as an int (numpy integers accepted); ValueError naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


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
        Heading of each query in ``queries`` (default: ``"Query i · #row"``).
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
    k = _as_int(k, "k")
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
        titles = [f"Query {j + 1}" + (f" · #{r}" if r is not None else "") for j, r in enumerate(own)]

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
    indices, distances, relevant = {}, {}, {}
    for row, spec in zip(rows, geometries.values()):
        geom = spec.geometry if isinstance(spec, ReportGeometry) else spec
        d, i = _search(geom, Qs, G, k, own, exclude_self, symmetric, n, progress)
        distances[row.name], indices[row.name] = d, i
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
        known=known, items=items, info=dict(info or {}),
    )


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
        im = im.convert("RGB")
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
# HTML

_CSS = """
* { box-sizing: border-box; }
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 16px 20px;
       color: #1f2328; background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
.meta { color: #57606a; font-size: 13px; margin: 2px 0; }
.legend { font-size: 13px; color: #57606a; margin: 8px 0 4px; }
.legend .swatch { display: inline-block; width: 14px; height: 14px; vertical-align: -2px;
                  border: 3px solid #1a7f37; border-radius: 3px; margin: 0 4px 0 0; }
section.query { margin: 18px 0 26px; border-top: 2px solid #d0d7de; padding-top: 10px;
                overflow-x: auto; }
section.query h2 { font-size: 17px; margin: 0 0 2px; }
.qtext { font-size: 14px; margin: 2px 0; }
.qvalues { font-size: 12px; color: #57606a; margin: 2px 0 8px; }
.qvalues b { color: #1f2328; font-weight: 600; }
.row { display: grid; grid-template-columns: 230px repeat(var(--cols), minmax(100px, 1fr));
       gap: 6px; margin: 0 0 8px; align-items: stretch; min-width: calc(236px + var(--cols) * 106px); }
.rowlabel { font-size: 12px; padding: 4px 6px; background: #f6f8fa; border-radius: 6px;
            border-left: 4px solid #8c959f; }
.rowlabel.primary { border-left-color: #1a7f37; }
.glabel { font-weight: 600; font-size: 13px; }
.anchors summary { color: #57606a; cursor: pointer; margin-top: 2px; }
.anchors ol { margin: 4px 0 0; padding-left: 18px; max-height: 160px; overflow-y: auto; }
.prec { margin-top: 4px; color: #57606a; }
.prec .p-primary { color: #1a7f37; font-weight: 700; }
.card { border: 2px solid #d0d7de; border-radius: 6px; padding: 4px 5px; font-size: 11.5px;
        line-height: 1.3; background: #fff; display: flex; flex-direction: column; min-width: 0; }
.card.query { border-color: #0969da; background: #f0f6ff; }
.card.hit { border: 3px solid #1a7f37; background: #f3fbf4; }
.card .head { color: #57606a; font-size: 10.5px; margin-bottom: 2px; white-space: nowrap;
              overflow: hidden; display: flex; justify-content: space-between; gap: 4px; }
.card .head .dist { color: #8c959f; overflow: hidden; text-overflow: ellipsis; }
.card .hit-mark { color: #1a7f37; font-weight: 700; }
.card .text { display: -webkit-box; -webkit-line-clamp: 7; -webkit-box-orient: vertical;
              overflow: hidden; overflow-wrap: anywhere; flex: 1; }
.card .imgbox { flex: 1; display: flex; align-items: center; justify-content: center; }
.card img { display: block; max-width: 100%; max-height: 140px; margin: 0 auto; border-radius: 3px; }
.card .missing { color: #cf222e; font-size: 11px; }
.chips { margin-top: 3px; display: flex; flex-wrap: wrap; gap: 2px; }
.chip { font-size: 10px; padding: 0 4px; border-radius: 8px; white-space: nowrap; overflow: hidden;
        text-overflow: ellipsis; max-width: 100%; }
.chip.yes { background: #dafbe1; color: #116329; }
.chip.no { background: #eaeef2; color: #6e7781; text-decoration: line-through; }
"""


def _chip_order(factors: Sequence[str], grow: GeometryRow, marked_only: bool = True) -> list[str]:
    """Factors of a row's chips: the row's primary factor first, then the others in order."""
    out = [f for f in factors if f in grow.mark or not marked_only]
    return sorted(out, key=lambda f: f != grow.factor)


def _h(s: Any) -> str:
    return html.escape(str(s), quote=True)


class _Html:
    """Builds the HTML page of a :class:`ComparisonResult`."""

    def __init__(self, result: ComparisonResult, title: str, thumbs: _Thumbs):
        self.r = result
        self.title = title
        self.thumbs = thumbs
        self._uris: dict[Any, str | None] = {}
        # factor names never reach attribute names: they are mapped to tokens f0, f1, ...
        self.tok = {f: f"f{i}" for i, f in enumerate(result.factors)}

    def _img(self, key: Any, item: Any) -> str | None:
        if key not in self._uris:
            im = self.thumbs.get(key, item)
            self._uris[key] = _data_uri(im) if im is not None else None
        return self._uris[key]

    def _content(self, key: Any, item: Any, fallback: str, query: bool = False) -> str:
        if self.r.kind == "image" and not (query and _is_text_query(item)):
            uri = self._img(key, item)
            if uri is None:
                what = _short(os.fspath(item), 60) if isinstance(item, (str, os.PathLike)) else fallback
                reason = self.thumbs.reason(key) or "missing"
                return f'<div class="missing" data-reason="{reason}">image unavailable: {_h(what)}</div>'
            alt = os.path.basename(os.fspath(item)) if isinstance(item, (str, os.PathLike)) else fallback
            return f'<div class="imgbox"><img src="{uri}" alt="{_h(alt)}" title="{_h(alt)}"></div>'
        text = fallback if item is None else str(item)
        return f'<div class="text" title="{_h(text)}">{_h(_short(text, CARD_CHARS))}</div>'

    def _query_card(self, qi: int) -> str:
        r = self.r
        row = r.query_rows[qi]
        head = "query" + (f" · #{row}" if row is not None else "")
        body = self._content(("g", row) if row is not None else ("q", qi), r.query_items[qi], r.query_titles[qi],
                             query=True)
        return f'<div class="card query"><div class="head">{_h(head)}</div>{body}</div>'

    def _neighbour_card(self, qi: int, grow: GeometryRow, rank: int) -> str:
        r = self.r
        g = int(r.indices[grow.name][qi, rank])
        d = float(r.distances[grow.name][qi, rank])
        attrs = {"data-rank": str(rank + 1), "data-index": str(g), "data-distance": f"{d:.6g}"}
        chips = []
        hit = False
        for f in _chip_order(r.factors, grow, marked_only=False):
            if not r.known[f][qi]:
                continue
            rel = bool(r.relevant[grow.name][f][qi, rank])
            attrs[f"data-relevant-{self.tok[f]}"] = "1" if rel else "0"
            if f == grow.factor and rel:
                hit = True
            if f in grow.mark:
                vals = r.gallery_values[f]
                value = _fmt_value(vals[g]) if vals is not None else f
                cls, sym = ("yes", "✓") if rel else ("no", "✗")
                chips.append(
                    f'<span class="chip {cls}" data-factor="{_h(f)}" title="{_h(f)}: {_h(value)}">'
                    f'{sym} {_h(value)}</span>'
                )
        cls = "card nbr hit" if hit else "card nbr"
        mark = '<span class="hit-mark">✓ </span>' if hit else ""
        head = f'<span>{mark}{rank + 1} · #{g}</span><span class="dist" title="distance">{_fmt_d(d)}</span>'
        body = self._content(("g", g), r.items[g] if r.items is not None else None, f"item #{g}")
        attr = " ".join(f'{k}="{_h(v)}"' for k, v in attrs.items())
        chip_html = f'<div class="chips">{"".join(chips)}</div>' if chips else ""
        return f'<div class="{cls}" {attr}><div class="head">{head}</div>{body}{chip_html}</div>'

    def _row_label(self, qi: int, grow: GeometryRow) -> str:
        r = self.r
        parts = [f'<div class="glabel">{_h(grow.label)}</div>']
        if grow.anchor_texts or grow.n_anchors:
            listed = grow.anchor_texts[:MAX_LISTED_ANCHORS]
            more = (grow.n_anchors or len(grow.anchor_texts)) - len(listed)
            items = "".join(f"<li>{_h(t)}</li>" for t in listed)
            if more > 0:
                items += f"<li>… and {more} more</li>"
            lst = f"<ol>{items}</ol>" if items else ""
            parts.append(
                f'<details class="anchors"><summary>{_h(_anchor_preview(grow.anchor_texts, grow.n_anchors))}'
                f"</summary>{lst}</details>"
            )
        shown = [f for f in r.factors if f in grow.mark or f == grow.factor]
        shown.sort(key=lambda f: f != grow.factor)
        precs = []
        for f in shown:
            p = _fmt_p(float(r.precision_at_k(grow.name, f)[qi]))
            cls = "p-primary" if f == grow.factor else "p"
            precs.append(f'<span class="{cls}" data-factor="{_h(f)}" data-precision="{p}">{_h(f)} {p}</span>')
        if precs:
            parts.append(f'<div class="prec">P@{r.k}: ' + " · ".join(precs) + "</div>")
        cls = "rowlabel primary" if grow.factor else "rowlabel"
        return f'<div class="{cls}">{"".join(parts)}</div>'

    def _query_section(self, qi: int) -> str:
        r = self.r
        out = [f'<section class="query" data-query="{qi}" data-query-index="{int(r.query_indices[qi])}">']
        out.append(f"<h2>{_h(r.query_titles[qi])}</h2>")
        item = r.query_items[qi]
        if item is not None and (r.kind == "text" or _is_text_query(item)):
            out.append(f'<p class="qtext">{_h(item)}</p>')
        vals = [(f, r.query_values[f][qi]) for f in r.factors if r.query_values[f][qi] is not None]
        if vals:
            out.append('<p class="qvalues">' + " · ".join(f"{_h(f)}: <b>{_h(_fmt_value(v))}</b>" for f, v in vals) + "</p>")
        for grow in r.rows:
            cards = [self._row_label(qi, grow), self._query_card(qi)]
            cards += [self._neighbour_card(qi, grow, j) for j in range(r.k)]
            out.append(
                f'<div class="row" data-geometry="{_h(grow.name)}" data-factor="{_h(grow.factor or "")}" '
                f'style="--cols: {r.k + 1}">' + "".join(cards) + "</div>"
            )
        out.append("</section>")
        return "\n".join(out)

    def render(self) -> str:
        r = self.r
        meta = [f"{r.n_queries} quer{'y' if r.n_queries == 1 else 'ies'}", f"{len(r.rows)} geometries",
                f"top {r.k} neighbours", f"{r.kind} items"]
        info = " · ".join(f"{_h(k)}: {_h(v)}" for k, v in r.info.items())
        factors = ", ".join(f'<span class="factor" data-token="{t}" data-factor="{_h(f)}">{_h(f)}</span>'
                            for f, t in self.tok.items())
        legend = (
            '<p class="legend"><span class="swatch"></span>green border: the neighbour shares the query\'s '
            "value of the row's factor (in green on the left). Chips: ✓ same value as the query, "
            "✗ different, per factor. P@k: fraction of the k neighbours sharing the query's value. "
            + ("Hover a card for the full text; " if r.kind == "text" else "Hover an image for its file name; ")
            + "open the anchor list under a row label.</p>"
            if r.factors else ""
        )
        body = "\n".join(self._query_section(qi) for qi in range(r.n_queries))
        skipped = ", ".join(f'<span data-reason="{k}" data-count="{v}">{v} {k.replace("_", " ")}</span>'
                            for k, v in self.thumbs.skipped().items())
        head = (
            "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{_h(self.title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
            f"<h1>{_h(self.title)}</h1>\n<p class=\"meta\">{_h(' · '.join(meta))}</p>\n"
            + (f'<p class="meta">{info}</p>\n' if info else "")
            + (f'<p class="meta factors">factors: {factors}</p>\n' if factors else "")
            + (f'<p class="meta skipped">images skipped: {skipped}</p>\n' if skipped else "")
            + legend + "\n"
        )
        return head + body + "\n</body>\n</html>\n"


# ---------------------------------------------------------------------------
# PNG


def _draw_grid(result: ComparisonResult, path: Path, title: str, thumbs: _Thumbs, dpi: float) -> None:
    """Draw the comparison grid with matplotlib (Agg, no pyplot state) into ``path``.

    Every text is drawn with ``parse_math=False``: user strings with ``$`` stay literal.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    r = result
    label_w, card_w, gap = 2.3, 1.5, 0.06
    card_h = 1.45 if r.kind == "image" else 1.2
    chip_h = 0.16 if any(g.mark for g in r.rows) and r.factors else 0.0
    head_h, title_h = 0.55, 0.5
    n_cols = r.k + 1
    width = label_w + n_cols * (card_w + gap) + 0.2
    height = title_h + r.n_queries * (head_h + len(r.rows) * (card_h + gap)) + 0.2
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
    arrays: dict[Any, Any] = {}

    def box(x, y, w, h, edge, face, lw):
        ax.add_patch(FancyBboxPatch((x + 0.02, y + 0.02), w - 0.04, h - 0.04, boxstyle="round,pad=0,rounding_size=0.05",
                                    linewidth=lw, edgecolor=edge, facecolor=face))

    def content(x, y, key, item, fallback, query=False):
        top = y + 0.2
        avail = card_h - 0.24 - chip_h
        if r.kind == "image" and not (query and _is_text_query(item)):
            if key not in arrays:
                im = thumbs.get(key, item)
                arrays[key] = None if im is None else np.asarray(im)
            arr = arrays[key]
            if arr is None:
                draw_text(x + card_w / 2, top + avail / 2, "image\nunavailable", ha="center", va="center",
                          fontsize=6.5, color="#cf222e")
                return
            h_px, w_px = arr.shape[:2]
            scale = min((card_w - 0.12) / w_px, avail / h_px)
            w_in, h_in = w_px * scale, h_px * scale
            x0, y0 = x + (card_w - w_in) / 2, top + (avail - h_in) / 2
            ax.imshow(arr, extent=(x0, x0 + w_in, y0 + h_in, y0), aspect="auto", interpolation="antialiased",
                      zorder=3)
            return
        text = fallback if item is None else " ".join(str(item).split())
        lines = textwrap.wrap(text, chars, break_long_words=True) or [""]
        if len(lines) > max_lines:
            lines = lines[:max_lines]
            lines[-1] = _short(lines[-1], chars - 1).rstrip("…") + "…"
        draw_text(x + 0.07, top, "\n".join(lines), ha="left", va="top", fontsize=fs, linespacing=1.25,
                  color="#1f2328", zorder=3)

    draw_text(0.12, 0.3, title, fontsize=13, fontweight="bold", va="center")
    y = title_h
    for qi in range(r.n_queries):
        qtext = r.query_titles[qi]
        item = r.query_items[qi]
        if item is not None and (r.kind == "text" or _is_text_query(item)):
            qtext += ": " + _short(item, 160)
        draw_text(0.12, y + 0.2, qtext, fontsize=9, fontweight="bold", va="center")
        vals = [f"{f}: {_fmt_value(r.query_values[f][qi])}" for f in r.factors if r.query_values[f][qi] is not None]
        if vals:
            draw_text(0.12, y + 0.42, " · ".join(vals), fontsize=7, color="#57606a", va="center")
        y += head_h
        for grow in r.rows:
            box(0.06, y, label_w - 0.06, card_h, "#8c959f" if not grow.factor else "#1a7f37", "#f6f8fa", 0.8)
            lab = textwrap.wrap(grow.label, int(label_w * 72 / (7.5 * 0.55)) - 3)[:2]
            draw_text(0.16, y + 0.12, "\n".join(lab), fontsize=7.5, fontweight="bold", va="top")
            lines = []
            prev = _anchor_preview(grow.anchor_texts, grow.n_anchors, width=70)
            if prev:
                lines += textwrap.wrap(prev, int(label_w * 72 / (6 * 0.55)) - 4)[:3]
            draw_text(0.16, y + 0.16 + 0.14 * len(lab), "\n".join(lines), fontsize=6, color="#57606a", va="top")
            shown = sorted([f for f in r.factors if f in grow.mark or f == grow.factor], key=lambda f: f != grow.factor)
            for j, f in enumerate(shown[:4]):
                p = _fmt_p(float(r.precision_at_k(grow.name, f)[qi]))
                primary = f == grow.factor
                draw_text(0.16, y + card_h - 0.12 - 0.13 * (len(shown[:4]) - 1 - j), f"P@{r.k} {f}: {p}",
                          fontsize=6.3, va="bottom", color="#1a7f37" if primary else "#57606a",
                          fontweight="bold" if primary else "normal")
            x = label_w + gap
            row = r.query_rows[qi]
            box(x, y, card_w, card_h, "#0969da", "#f0f6ff", 1.2)
            draw_text(x + 0.07, y + 0.1, "query" + (f" · #{row}" if row is not None else ""), fontsize=5.8,
                      color="#57606a", va="center")
            content(x, y, ("g", row) if row is not None else ("q", qi), item, r.query_titles[qi], query=True)
            for rank in range(r.k):
                x = label_w + gap + (rank + 1) * (card_w + gap)
                g = int(r.indices[grow.name][qi, rank])
                hit = bool(grow.factor and r.known[grow.factor][qi] and r.relevant[grow.name][grow.factor][qi, rank])
                box(x, y, card_w, card_h, "#1a7f37" if hit else "#d0d7de", "#f3fbf4" if hit else "white",
                    2.4 if hit else 0.8)
                d = float(r.distances[grow.name][qi, rank])
                draw_text(x + 0.07, y + 0.1, f"{'✓ ' if hit else ''}{rank + 1} · #{g} · d={_fmt_d(d)}", fontsize=5.8,
                          color="#1a7f37" if hit else "#57606a", va="center", fontweight="bold" if hit else "normal")
                content(x, y, ("g", g), r.items[g] if r.items is not None else None, f"item #{g}")
                cx = x + 0.07
                for f in _chip_order(r.factors, grow):
                    if not r.known[f][qi]:
                        continue
                    rel = bool(r.relevant[grow.name][f][qi, rank])
                    vals = r.gallery_values[f]
                    value = _short(_fmt_value(vals[g]) if vals is not None else f, 12)
                    w = (len(value) + 2.2) * 5.3 * 0.58 / 72
                    if cx + w > x + card_w - 0.03:
                        break
                    draw_text(cx, y + card_h - 0.1, f"{'✓' if rel else '✗'} {value}", fontsize=5.3, va="center",
                              color="#116329" if rel else "#8c959f", zorder=4)
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
    thumbs = _Thumbs(_as_int(thumbnail_px, "thumbnail_px"))
    title = str(title)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html_path = out / "index.html"
    html_path.write_text(_Html(result, title, thumbs).render(), encoding="utf-8")
    png_path = None
    if png:
        png_path = out / "grid.png"
        _draw_grid(result, png_path, title, thumbs, float(dpi))
    return ReportPaths(html=html_path, png=png_path, skipped=thumbs.skipped())
