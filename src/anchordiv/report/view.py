"""The report's view model: what the page and the PNG grid show, as plain data.

:func:`build_view` walks a :class:`~anchordiv.report.ComparisonResult` once, reading each
image once, and returns a :class:`ReportView`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .images import Thumbs, data_uri

if TYPE_CHECKING:
    from .comparison import ComparisonResult, GeometryRow

__all__ = ["CARD_CHARS", "MAX_LISTED_ANCHORS", "Content", "Chip", "NeighbourView", "RowView", "QueryView",
           "ReportView", "build_view", "shorten", "anchor_preview"]

#: Characters of a text shown on a card (the full text is in the tooltip).
CARD_CHARS = 220

#: Anchors listed in full under a row (the rest are counted).
MAX_LISTED_ANCHORS = 200


def _is_text_query(item: Any) -> bool:
    """A query item given as text rather than as an image: a str that is not a file."""
    return isinstance(item, str) and not os.path.isfile(item)


def shorten(text: str, n: int) -> str:
    """``text`` on one line, cut to ``n`` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def anchor_preview(texts: list[str], n: int | None, width: int = 90) -> str:
    """The first anchor texts that fit in ``width`` characters, with the rest counted."""
    if not texts:
        return f"{n} anchors" if n else ""
    shown, used = [], 0
    for t in texts:
        t = shorten(t, 40)
        if shown and used + len(t) > width:
            break
        shown.append(t)
        used += len(t) + 3
    rest = (n or len(texts)) - len(shown)
    return " · ".join(shown) + (f" … (+{rest})" if rest > 0 else "")


def _fmt_value(v: Any) -> str:
    return "?" if v is None else shorten(str(v), 40)


def _fmt_d(d: float) -> str:
    if d == 0 or not np.isfinite(d):
        return f"{d:g}"
    return f"{d:.1e}" if abs(d) < 1e-2 or abs(d) >= 1e4 else f"{d:.3g}"


def _fmt_p(p: float) -> str:
    return "–" if not np.isfinite(p) else f"{p:.2f}"


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
        """Whether the card shows an image (or says why it cannot)."""
        return self.src is not None or self.reason is not None

    @property
    def short(self) -> str:
        """The text as the card shows it, cut to :data:`CARD_CHARS`."""
        return shorten(self.text, CARD_CHARS)

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


class _Cards:
    """The card bodies of one result, each image read and encoded once."""

    def __init__(self, kind: str, thumbs: Thumbs):
        self.kind = kind
        self.thumbs = thumbs
        self._uris: dict[Any, str | None] = {}

    def content(self, key: Any, item: Any, fallback: str, query: bool = False) -> Content:
        """The body of the card of ``item``, its image cached under ``key``."""
        if self.kind == "text" or (query and _is_text_query(item)):
            return Content(fallback if item is None else str(item))
        if key not in self._uris:
            im = self.thumbs.get(key, item)
            self._uris[key] = None if im is None else data_uri(im)
        path = isinstance(item, (str, os.PathLike))
        if self._uris[key] is None:
            reason = self.thumbs.reason(key) or "missing"
            return Content(shorten(os.fspath(item), 60) if path else fallback, reason=reason)
        return Content(os.path.basename(os.fspath(item)) if path else fallback, src=self._uris[key])


def _neighbours(r: ComparisonResult, grow: GeometryRow, qi: int, known: list[str], token: dict[str, str],
                cards: _Cards) -> list[NeighbourView]:
    """The neighbour cards of query ``qi`` on the row of ``grow``."""
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
            chips, cards.content(("g", g), r.items[g] if r.items is not None else None, r.item_label(g)),
            r.item_label(g)))
    return neighbours


def _row_view(r: ComparisonResult, grow: GeometryRow, qi: int, token: dict[str, str], cards: _Cards) -> RowView:
    """The row of geometry ``grow`` for query ``qi``."""
    order = sorted(r.factors, key=lambda f: f != grow.factor)  # the primary factor first
    known = [f for f in order if r.known[f][qi]]
    neighbours = _neighbours(r, grow, qi, known, token, cards)
    listed = grow.anchor_texts[:MAX_LISTED_ANCHORS]
    precision = [(f, _fmt_p(float(r.precision_at_k(grow.name, f)[qi])), f == grow.factor)
                 for f in order if f in grow.mark or f == grow.factor]
    top = r.top_anchors.get(grow.name)
    return RowView(grow.name, grow.label, grow.factor, anchor_preview(grow.anchor_texts, grow.n_anchors),
                   listed, (grow.n_anchors or len(grow.anchor_texts)) - len(listed), grow.n_anchors,
                   precision, neighbours,
                   " · ".join(f"{shorten(a, 40)} {p:.2f}" for a, p in top[qi]) if top else "")


def build_view(r: ComparisonResult, title: str, thumbs: Thumbs) -> ReportView:
    """The :class:`ReportView` of a result: the one walk over it, reading each image once."""
    token = {f: f"f{i}" for i, f in enumerate(r.factors)}
    cards = _Cards(r.kind, thumbs)
    queries = []
    for qi in range(r.n_queries):
        own, item = r.query_rows[qi], r.query_items[qi]
        card = cards.content(("g", own) if own is not None else ("q", qi), item, r.query_titles[qi], query=True)
        rows = [_row_view(r, grow, qi, token, cards) for grow in r.rows]
        text = str(item) if item is not None and (r.kind == "text" or _is_text_query(item)) else None
        values = [(f, _fmt_value(r.query_values[f][qi])) for f in r.factors if r.query_values[f][qi] is not None]
        head = "query" + (f" · {r.item_label(own)}" if own is not None else "")
        queries.append(QueryView(qi, int(r.query_indices[qi]), r.query_titles[qi], text, values, head, card, rows))
    return ReportView(title, r.kind, r.k, len(r.rows), [(str(k), str(v)) for k, v in r.info.items()],
                      [(t, f) for f, t in token.items()], queries, thumbs.skipped())
