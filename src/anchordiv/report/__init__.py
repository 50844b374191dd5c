"""Side-by-side neighbour reports: the same query, its nearest neighbours under several geometries.

:func:`compare` runs an exact top-k search for each named geometry and collects, for each
query, one row per geometry: the neighbours, their distances and, when labels are known,
which neighbours share the query's label for each label column ("factor").
:func:`write_report` turns the result into one plain view (:class:`ReportView`) and renders
it twice: as a self-contained HTML page (``index.html``, from the Jinja2 template
``templates/report.html.j2`` with autoescaping on: inline CSS, images embedded as base64
thumbnails, no external resources) and as a PNG grid (``grid.png``, drawn with matplotlib).
Names and texts are escaped in the page (factor names reach attribute names only as tokens
``f0``, ``f1``, ...; the header lists them) and drawn literally in the PNG (no mathtext).
Images are read only from regular files of at most :data:`MAX_IMAGE_BYTES`; others, and
Pillow's decompression bombs, are shown as unavailable and counted in :attr:`ReportPaths.skipped`.

Each row is labelled with its geometry and the anchors that define it. A row may have a
*primary* factor (for an anchor set naming breeds, ``"breed"``): neighbours that share
the query's value of that factor get a green border, and the row's precision@k on it is
shown first. The factors *marked* on a row get a ✓/✗ chip on every neighbour.

The modules: :mod:`~anchordiv.report.comparison` (:func:`compare` and its result),
:mod:`~anchordiv.report.view` (the view model), :mod:`~anchordiv.report.html` (the page),
:mod:`~anchordiv.report.png` (the grid) and :mod:`~anchordiv.report.images` (thumbnails).

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

import os
from dataclasses import dataclass, field
from pathlib import Path

from .._util import positive_int
from .comparison import (ITEM_COLUMNS, TOP_ANCHORS, ComparisonResult, GeometryRow, RelevanceFn, ReportGeometry, cards,
                      compare)
from .html import FRAGMENT_CLASS, render_html, scope_css
from .images import SKIP_REASONS, THUMBNAIL_PX, Thumbs
from .png import draw_grid
from .view import (CARD_CHARS, MAX_LISTED_ANCHORS, Chip, Content, NeighbourView, QueryView, ReportView, RowView,
                   build_view)

__all__ = ["ReportGeometry", "GeometryRow", "ComparisonResult", "ReportPaths", "compare", "cards", "write_report"]

#: Largest image file, in bytes, that is read for a thumbnail (larger ones are skipped); read
#: when an image is, so setting it here takes effect at once.
MAX_IMAGE_BYTES = 64 * 2**20


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
    view = build_view(result, str(title), Thumbs(positive_int(thumbnail_px, "thumbnail_px")))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    html_path = out / "index.html"
    html_path.write_text(render_html(view), encoding="utf-8")
    png_path = None
    if png:
        png_path = out / "grid.png"
        draw_grid(view, png_path, float(dpi))
    return ReportPaths(html=html_path, png=png_path, skipped=view.skipped)
