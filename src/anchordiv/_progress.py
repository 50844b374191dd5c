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


def progress_bar(iterable=None, *, show: bool | None, **kwargs) -> tqdm:
    """A tqdm bar shown when ``show`` is true (``None``: tqdm decides, on a terminal),
    and never inside a silenced :func:`progress_scope`."""
    disable = True if _SILENCED.get() else (None if show is None else not show)
    return tqdm(iterable, disable=disable, leave=False, **kwargs)
