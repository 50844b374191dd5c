"""Progress bars: one place decides whether a tqdm bar is shown.

A call that takes ``progress=False`` silences every bar opened while it runs, including
those of the per-vector statistics and searches it calls (a context variable, so threads
and async tasks keep their own setting).
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

from tqdm.auto import tqdm

_SILENCED: ContextVar[bool] = ContextVar("anchordiv_progress_silenced", default=False)


@contextlib.contextmanager
def progress_scope(progress: bool | None) -> Iterator[None]:
    """Within this block every bar is hidden when ``progress`` is False (else unchanged)."""
    if progress is not False:
        yield
        return
    token = _SILENCED.set(True)
    try:
        yield
    finally:
        _SILENCED.reset(token)


class HiddenBar:
    """What a bar that is never shown needs to be: iterable, with ``update`` and ``close``
    (opening even a disabled tqdm costs more than a small batch's work)."""

    def __init__(self, iterable=None):
        self._iterable = () if iterable is None else iterable

    def __iter__(self):
        return iter(self._iterable)

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(iterable=None, *, show: bool | None, **kwargs) -> "tqdm | HiddenBar":
    """A tqdm bar shown when ``show`` is true (``None``: tqdm decides, on a terminal),
    and never inside a silenced :func:`progress_scope` (then a :class:`HiddenBar`)."""
    if show is False or _SILENCED.get():
        return HiddenBar(iterable)
    return tqdm(iterable, disable=None if show is None else False, leave=False, **kwargs)
