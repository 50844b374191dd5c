"""The report as a PNG grid, drawn with matplotlib (Agg, no pyplot state).

Every text is drawn with ``parse_math=False``: user strings with ``$`` stay literal.
Thumbnails are decoded from the same data URIs the page embeds.
"""

from __future__ import annotations

import base64
import io
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .view import Content, NeighbourView, QueryView, ReportView, RowView, anchor_preview, shorten

__all__ = ["draw_grid"]


@dataclass(frozen=True)
class _Layout:
    """Sizes of the grid, in inches, and of its card texts."""

    k: int
    label_w: float
    card_h: float
    chip_h: float
    width: float
    height: float
    card_w: float = 1.5
    gap: float = 0.06
    head_h: float = 0.55
    title_h: float = 0.5
    fs: float = 6.8

    @classmethod
    def of(cls, view: ReportView) -> "_Layout":
        """The layout that fits ``view``: each row label in three lines, chips when any."""
        card_w, gap, head_h, title_h = cls.card_w, cls.gap, cls.head_h, cls.title_h
        longest = max([len(row.label) for q in view.queries for row in q.rows] + [1])
        label_w = min(5.0, max(2.3, longest / 3 * 7.5 * 0.55 / 72 + 0.4))
        card_h = 1.45 if view.kind == "image" else 1.2
        chip_h = 0.16 if any(n.chips for q in view.queries for row in q.rows for n in row.neighbours) else 0.0
        width = label_w + (view.k + 1) * (card_w + gap) + 0.2
        height = title_h + len(view.queries) * (head_h + view.n_geometries * (card_h + gap)) + 0.2
        return cls(view.k, label_w, card_h, chip_h, width, height)

    @property
    def chars(self) -> int:
        """Characters of a line of card text."""
        return max(12, int(self.card_w * 72 / (self.fs * 0.55)) - 3)

    @property
    def max_lines(self) -> int:
        """Lines of card text that fit above the chips."""
        return int((self.card_h - 0.22 - self.chip_h) / (self.fs * 1.25 / 72))

    def card_x(self, rank: int) -> float:
        """Left edge of the card in column ``rank`` (0: the query)."""
        return self.label_w + self.gap + rank * (self.card_w + self.gap)


class _Painter:
    """Draws the parts of the grid on one axes, decoding each thumbnail once."""

    def __init__(self, ax: Any, lay: _Layout):
        self.ax = ax
        self.lay = lay
        self._arrays: dict[str, np.ndarray] = {}

    def text(self, *args: Any, **kwargs: Any) -> Any:
        """``ax.text`` with mathtext off."""
        return self.ax.text(*args, parse_math=False, **kwargs)

    def box(self, x: float, y: float, w: float, h: float, edge: str, face: str, lw: float) -> None:
        """A rounded box."""
        from matplotlib.patches import FancyBboxPatch

        self.ax.add_patch(FancyBboxPatch((x + 0.02, y + 0.02), w - 0.04, h - 0.04,
                                         boxstyle="round,pad=0,rounding_size=0.05",
                                         linewidth=lw, edgecolor=edge, facecolor=face))

    def _array(self, src: str) -> np.ndarray:
        if src not in self._arrays:
            from PIL import Image

            with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as im:
                self._arrays[src] = np.asarray(im.convert("RGB"))
        return self._arrays[src]

    def content(self, x: float, y: float, c: Content) -> None:
        """The body of a card: its thumbnail, "image unavailable" or its wrapped text."""
        lay = self.lay
        top = y + 0.2
        avail = lay.card_h - 0.24 - lay.chip_h
        if c.src is not None:
            arr = self._array(c.src)
            h_px, w_px = arr.shape[:2]
            scale = min((lay.card_w - 0.12) / w_px, avail / h_px)
            w_in, h_in = w_px * scale, h_px * scale
            x0, y0 = x + (lay.card_w - w_in) / 2, top + (avail - h_in) / 2
            self.ax.imshow(arr, extent=(x0, x0 + w_in, y0 + h_in, y0), aspect="auto", interpolation="antialiased",
                           zorder=3)
        elif c.is_image:
            self.text(x + lay.card_w / 2, top + avail / 2, "image\nunavailable", ha="center", va="center",
                      fontsize=6.5, color="#cf222e")
        else:
            lines = textwrap.wrap(" ".join(c.text.split()), lay.chars, break_long_words=True) or [""]
            if len(lines) > lay.max_lines:
                lines = lines[:lay.max_lines]
                lines[-1] = shorten(lines[-1], lay.chars - 1).rstrip("…") + "…"
            self.text(x + 0.07, top, "\n".join(lines), ha="left", va="top", fontsize=lay.fs, linespacing=1.25,
                      color="#1f2328", zorder=3)

    def query_head(self, y: float, q: QueryView) -> None:
        """The query's title, text and known factor values above its rows."""
        line = int(self.lay.width * 72 / (9 * 0.62)) - 2
        qtext = shorten(q.title + (": " + q.text if q.text is not None else ""), line)
        self.text(0.12, y + 0.2, qtext, fontsize=9, fontweight="bold", va="center")
        if q.values:
            self.text(0.12, y + 0.42, " · ".join(f"{f}: {v}" for f, v in q.values), fontsize=7, color="#57606a",
                      va="center")

    def row_label(self, y: float, row: RowView) -> None:
        """The label box of a row: its label, anchors or top anchors, and precisions."""
        lay = self.lay
        label_w, card_h = lay.label_w, lay.card_h
        self.box(0.06, y, label_w - 0.06, card_h, "#1a7f37" if row.factor else "#8c959f", "#f6f8fa", 0.8)
        lab = textwrap.wrap(row.label, int(label_w * 72 / (7.5 * 0.55)) - 3, break_long_words=True)
        if len(lab) > 3:
            lab = lab[:2] + [shorten(" ".join(lab[2:]), len(lab[2]))]
        self.text(0.16, y + 0.12, "\n".join(lab), fontsize=7.5, fontweight="bold", va="top")
        prev = anchor_preview(row.anchors, row.n_anchors, width=70)
        width_chars = int(label_w * 72 / (6 * 0.55)) - 4
        lines = textwrap.wrap(prev, width_chars)[:max(1, 4 - len(lab))] if prev else []
        if row.top:
            lines = lines[:max(0, 3 - len(lab))] + [shorten("top: " + row.top, width_chars)]
        self.text(0.16, y + 0.16 + 0.14 * len(lab), "\n".join(lines), fontsize=6, color="#57606a", va="top")
        shown = row.precision[:4]
        for j, (f, p, primary) in enumerate(shown):
            self.text(0.16, y + card_h - 0.12 - 0.13 * (len(shown) - 1 - j), f"P@{lay.k} {f}: {p}",
                      fontsize=6.3, va="bottom", color="#1a7f37" if primary else "#57606a",
                      fontweight="bold" if primary else "normal")

    def query_card(self, y: float, q: QueryView) -> None:
        """The query's own card, first in each of its rows."""
        x = self.lay.card_x(0)
        self.box(x, y, self.lay.card_w, self.lay.card_h, "#0969da", "#f0f6ff", 1.2)
        self.text(x + 0.07, y + 0.1, q.head, fontsize=5.8, color="#57606a", va="center")
        self.content(x, y, q.content)

    def neighbour(self, y: float, n: NeighbourView) -> None:
        """A neighbour card: green when it shares the row's factor, with its chips."""
        lay = self.lay
        x = lay.card_x(n.rank)
        self.box(x, y, lay.card_w, lay.card_h, "#1a7f37" if n.hit else "#d0d7de", "#f3fbf4" if n.hit else "white",
                 2.4 if n.hit else 0.8)
        self.text(x + 0.07, y + 0.1, f"{'✓ ' if n.hit else ''}{n.rank} · #{n.id} · d={n.distance_text}",
                  fontsize=5.8, color="#1a7f37" if n.hit else "#57606a", va="center",
                  fontweight="bold" if n.hit else "normal")
        self.content(x, y, n.content)
        cx = x + 0.07
        for chip in n.chips:
            value = shorten(chip.value, 12)
            w = (len(value) + 2.2) * 5.3 * 0.58 / 72
            if cx + w > x + lay.card_w - 0.03:
                break
            self.text(cx, y + lay.card_h - 0.1, f"{'✓' if chip.same else '✗'} {value}", fontsize=5.3,
                      va="center", color="#116329" if chip.same else "#8c959f", zorder=4)
            cx += w + 0.05


def draw_grid(view: ReportView, path: Path, dpi: float) -> None:
    """Draw the comparison grid of ``view`` into ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lay = _Layout.of(view)
    dpi = min(dpi, 12000 / max(lay.width, lay.height))
    fig = Figure(figsize=(lay.width, lay.height), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, lay.width)
    ax.set_ylim(lay.height, 0)
    ax.axis("off")
    paint = _Painter(ax, lay)
    paint.text(0.12, 0.3, view.title, fontsize=13, fontweight="bold", va="center")
    y = lay.title_h
    for q in view.queries:
        paint.query_head(y, q)
        y += lay.head_h
        for row in q.rows:
            paint.row_label(y, row)
            paint.query_card(y, q)
            for n in row.neighbours:
                paint.neighbour(y, n)
            y += lay.card_h + lay.gap
    fig.savefig(path, dpi=dpi, facecolor="white")
