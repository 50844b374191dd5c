"""Progress bars: one place decides whether a tqdm bar is shown.

A call that takes ``progress=False`` silences every bar opened while it runs, including
those of the per-vector statistics and searches it calls and the bars transformers and
huggingface_hub show while a model loads (a context variable, so threads and async tasks
keep their own setting). ``progress="log"`` prints one line per step instead of a bar, for
output that is not a terminal.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import time
from contextvars import ContextVar
from typing import Any, Iterator

from tqdm.auto import tqdm

_SILENCED: ContextVar[bool] = ContextVar("anchordiv_progress_silenced", default=False)

#: The ``progress`` value that asks for one line per step.
LOG = "log"


def check_progress(progress: Any, name: str = "progress") -> bool | str | None:
    """``progress`` as True, False, None (a bar on a terminal) or ``"log"`` (a line per step)."""
    if progress is None or isinstance(progress, bool) or progress == LOG:
        return progress
    raise ValueError(f"{name} must be True, False, None or {LOG!r} (a line per step), got {progress!r}.")


def bars_silenced() -> bool:
    """Whether this code runs inside a silenced :func:`progress_scope`."""
    return _SILENCED.get()


@contextlib.contextmanager
def progress_scope(progress: bool | str | None) -> Iterator[None]:
    """Within this block every bar is hidden when ``progress`` is False or ``"log"`` (else
    unchanged); a ``"log"`` caller prints its own step lines."""
    if progress is not False and progress != LOG:
        yield
        return
    token = _SILENCED.set(True)
    try:
        yield
    finally:
        _SILENCED.reset(token)


@contextlib.contextmanager
def quiet_loading(quiet: bool | None = None) -> Iterator[None]:
    """Hide the bars of transformers and huggingface_hub (e.g. "Loading weights") in this block
    when ``quiet`` is true (None: when bars are silenced); their settings are restored after.

    Only libraries that are already imported are touched.
    """
    if not (bars_silenced() if quiet is None else quiet):
        yield
        return
    hub = importlib.import_module("huggingface_hub.utils") if "huggingface_hub" in sys.modules else None
    hf = importlib.import_module("transformers.utils.logging") if "transformers" in sys.modules else None
    hub_off = hub.are_progress_bars_disabled() if hub is not None else True
    hf_on = hf.is_progress_bar_enabled() if hf is not None else False
    if hf is not None and hf_on:
        hf.disable_progress_bar()
    if hub is not None and not hub_off:
        hub.disable_progress_bars()
    try:
        yield
    finally:
        if hf is not None and hf_on:
            hf.enable_progress_bar()  # re-enables huggingface_hub's bars as well
        if hub is not None:
            if hub_off and not hub.are_progress_bars_disabled():
                hub.disable_progress_bars()
            elif not hub_off and hub.are_progress_bars_disabled():
                hub.enable_progress_bars()


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


class StepLog(HiddenBar):
    """A bar for logs: one line per step on stderr, ``DESC: step I/N, T s (about R s left)``,
    and one when it closes, ``DESC: N steps in T s``."""

    def __init__(self, iterable=None, *, total: int | None = None, desc: str | None = None, file: Any = None):
        super().__init__(iterable)
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.desc, self.n = total, desc or "progress", 0
        self._file, self._closed = file, False
        self._start = time.perf_counter()
        self._write(f"{self.desc}: {total} steps" if total is not None else f"{self.desc}: started")

    def __iter__(self):
        for item in self._iterable:
            yield item
            self.update()

    def _write(self, line: str) -> None:
        stream = self._file if self._file is not None else sys.stderr
        print(line, file=stream, flush=True)

    def update(self, n: int = 1) -> None:
        """Count ``n`` more steps and print a line."""
        self.n += n
        took = time.perf_counter() - self._start
        line = f"{self.desc}: step {self.n}" + (f"/{self.total}" if self.total is not None else "") + f", {took:.1f} s"
        left = took / self.n * (self.total - self.n) if self.total and 0 < self.n < self.total else 0.0
        if left >= 1:
            line += f" (about {left:.0f} s left)"
        self._write(line)

    def close(self) -> None:
        """Print how many steps ran and how long they took (once)."""
        if not self._closed:
            self._closed = True
            self._write(f"{self.desc}: {self.n} steps in {time.perf_counter() - self._start:.1f} s")


def progress_bar(iterable=None, *, show: bool | str | None, **kwargs) -> "tqdm | HiddenBar":
    """A tqdm bar shown when ``show`` is true (``None``: tqdm decides, on a terminal), a
    :class:`StepLog` when ``show`` is ``"log"``, and never inside a silenced
    :func:`progress_scope` (then a :class:`HiddenBar`)."""
    if show == LOG:
        return StepLog(iterable, total=kwargs.get("total"), desc=kwargs.get("desc"), file=kwargs.get("file"))
    if show is False or _SILENCED.get():
        return HiddenBar(iterable)
    return tqdm(iterable, disable=None if show is None else False, leave=False, **kwargs)
