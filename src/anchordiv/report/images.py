"""Image thumbnails for the report and the service, read defensively.

An image is read only from a regular file of at most :data:`anchordiv.report.MAX_IMAGE_BYTES`
(looked up when read, so it can be changed at run time); anything else, and Pillow's
decompression bombs, raise :class:`Skip` with one of :data:`SKIP_REASONS`.
"""

from __future__ import annotations

import base64
import io
import os
import stat
import warnings
from typing import Any

#: Longest side, in pixels, of an embedded thumbnail.
THUMBNAIL_PX = 160

#: Why an image was skipped: the keys of :attr:`anchordiv.report.ReportPaths.skipped`.
SKIP_REASONS = ("missing", "unreadable", "not_a_file", "too_large", "decompression_bomb", "corrupt")

__all__ = ["THUMBNAIL_PX", "SKIP_REASONS", "Skip", "read_image_file", "thumbnail", "Thumbs", "data_uri"]


class Skip(Exception):
    """An image that is not shown, with the reason (one of :data:`SKIP_REASONS`)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _max_bytes() -> int:
    """The package's :data:`anchordiv.report.MAX_IMAGE_BYTES`, as it is now."""
    from . import MAX_IMAGE_BYTES

    return MAX_IMAGE_BYTES


def read_image_file(path: Any) -> bytes:
    """The bytes of a regular file of at most ``MAX_IMAGE_BYTES``; raises :class:`Skip` otherwise.

    The file is opened non-blocking and checked with ``fstat`` before reading, so a FIFO or
    a device is never read from.
    """
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise Skip("unreadable")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Skip("missing") from None
    except (OSError, ValueError):
        raise Skip("unreadable") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Skip("not_a_file")
        cap = _max_bytes()
        if st.st_size > cap:
            raise Skip("too_large")
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, min(1 << 20, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > cap:
            raise Skip("too_large")
        return b"".join(chunks)
    except OSError:
        raise Skip("unreadable") from None
    finally:
        os.close(fd)


def thumbnail(item: Any, px: int = THUMBNAIL_PX) -> "Any":
    """An RGB PIL thumbnail of an image path or PIL image; raises :class:`Skip` if unreadable."""
    from PIL import Image

    from ..encoders import open_rgb

    if isinstance(item, Image.Image):
        im = item.copy()
    else:
        data = read_image_file(item)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(data)) as f:
                    im = f.copy()
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise Skip("decompression_bomb") from None
        except Exception:  # any decoder failure of an untrusted file
            raise Skip("corrupt") from None
    try:
        im = open_rgb(im)  # transparent pixels on white, as the encoders see them
        im.thumbnail((px, px))
    except Exception:
        raise Skip("corrupt") from None
    return im


class Thumbs:
    """Thumbnails of the items of one report, read once each, with the skipped ones counted."""

    def __init__(self, px: int):
        self.px = px
        self._cache: dict[Any, Any] = {}
        self._reasons: dict[Any, str] = {}

    def get(self, key: Any, item: Any) -> "Any | None":
        """The thumbnail of ``item`` (cached under ``key``), or None when it is skipped."""
        if key not in self._cache:
            try:
                self._cache[key] = thumbnail(item, self.px) if item is not None else None
            except Skip as e:
                self._cache[key] = None
                self._reasons[key] = e.reason
        return self._cache[key]

    def reason(self, key: Any) -> str | None:
        """Why the item cached under ``key`` was skipped, or None."""
        return self._reasons.get(key)

    def skipped(self) -> dict[str, int]:
        """Per reason, how many images were skipped (reasons with none left out)."""
        counts = {r: 0 for r in SKIP_REASONS}
        for r in self._reasons.values():
            counts[r] += 1
        return {r: c for r, c in counts.items() if c}


def data_uri(im: Any) -> str:
    """A PIL image as a JPEG ``data:`` URI."""
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")
