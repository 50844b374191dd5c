"""Named live contexts over one collection, built in the background and kept within a byte bound.

:class:`ContextRegistry` is what a service holds: ``start(name, fit)`` returns the context of
that name at once, building it in a background thread (one build at a time, in order of
request) when it is new; ``wait`` gives a build a moment to finish, so that a small
context is answered in the same request and a large one is reported with its progress. The
built stores count against ``max_bytes`` (their feature bytes, reserved before the build
starts) and against ``max_contexts``; the least recently used ready contexts make room.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..exact import DEFAULT_MEMORY_BUDGET
from .store import Cancelled, FeatureStore, IndexStore, context_store

#: Bytes counted per context beyond its features (the fitted model and Python objects).
CONTEXT_OVERHEAD = 1 << 16


class ContextLimit(RuntimeError):
    """A new context does not fit: too many building, or larger than the whole byte bound."""


@dataclass(eq=False)
class LiveContext:
    """One context of a :class:`ContextRegistry`: its status (``building``, ``ready``, ``failed``), progress,
    fitted model and store; ``info`` is the caller's description of it."""

    name: str
    info: dict
    status: str = "building"
    error: str | None = None
    exception: BaseException | None = None
    model: Any = None
    store: FeatureStore | IndexStore | None = None
    nbytes: int = CONTEXT_OVERHEAD
    created: float = field(default_factory=time.time)
    seconds: float = 0.0
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def progress(self) -> float:
        if self.status == "ready":
            return 1.0
        return 0.0 if self.store is None else self.store.progress

    @property
    def path(self) -> str | None:
        """``"scan"`` (compact features, :class:`FeatureStore`) or ``"index"`` (:class:`IndexStore`)."""
        return None if self.store is None else self.store.path

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the build has ended (ready or failed) within ``timeout`` seconds."""
        return self.done.wait(timeout)

    def describe(self) -> dict:
        """Status, progress, path, sizes and timings, as the service reports them."""
        out = {"context": self.name, "status": self.status, "progress": round(self.progress, 4), "path": self.path,
               "seconds": round(self.seconds, 3), "bytes": self.nbytes}
        if self.store is not None:
            out["rows"] = self.store.n
            out["features"] = self.store.width
            if getattr(self.store, "cluster", None) is not None:
                out["parts"] = len(self.store.cluster.parts)
        if self.error:
            out["error"] = self.error
        return out


class ContextRegistry:
    """Live contexts over ``rows`` (see the module doc).

    Parameters
    ----------
    rows : MappedRows or array (n, d)
        The collection's embeddings.
    max_bytes : int
        Bound on the features held by all contexts together.
    max_contexts : int
        Most contexts held at once (built or building).
    memory_budget, storage, backend
        As for :func:`anchordiv.contexts.context_store`.
    size : callable, optional
        ``size(context)`` → the bytes a built context holds (default: its features and
        :data:`CONTEXT_OVERHEAD`); a service counts every storage it keeps alive.
    client : distributed.Client, optional
        Build and keep compact contexts on this Dask cluster (:mod:`anchordiv.contexts.cluster`).
    """

    def __init__(self, rows: Any, *, max_bytes: int = 1 << 30, max_contexts: int = 32,
                 memory_budget: int = DEFAULT_MEMORY_BUDGET, storage: str = "auto", backend: str = "exact",
                 size: Callable[[LiveContext], int] | None = None, client: Any = None):
        if int(max_contexts) < 1:
            raise ValueError(f"max_contexts must be at least 1, got {max_contexts!r}.")
        if int(max_bytes) < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes!r}.")
        self.rows, self.max_bytes, self.max_contexts = rows, int(max_bytes), int(max_contexts)
        self.memory_budget, self.storage, self.backend = memory_budget, storage, backend
        self.size, self.client = size, client
        self._contexts: OrderedDict[Any, LiveContext] = OrderedDict()
        self._lock = threading.Lock()
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anchordiv-context")
        self.hits = self.builds = self.evictions = 0

    # ------------------------------------------------------------- look-ups
    def get(self, key: Any) -> LiveContext | None:
        """The context under ``key`` (any hashable, e.g. a service's context key), or None."""
        with self._lock:
            ctx = self._contexts.get(key)
            if ctx is not None:
                self._contexts.move_to_end(key)
            return ctx

    def __contains__(self, key: Any) -> bool:
        with self._lock:
            return key in self._contexts

    def __len__(self) -> int:
        with self._lock:
            return len(self._contexts)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(c.nbytes for c in self._contexts.values())

    def stats(self) -> dict:
        """Contexts held, bytes held, the bounds, look-ups of held contexts (hits), builds started and evictions."""
        with self._lock:
            return {"entries": len(self._contexts), "bytes": sum(c.nbytes for c in self._contexts.values()),
                    "max_bytes": self.max_bytes, "max_contexts": self.max_contexts,
                    "building": sum(c.status == "building" for c in self._contexts.values()),
                    "hits": self.hits, "misses": self.builds, "evictions": self.evictions}

    # -------------------------------------------------------------- changes
    def start(self, key: Any, fit: Callable[[], tuple[Any, bool]], name: str | None = None,
              info: dict | None = None) -> LiveContext:
        """The context under ``key``; when new (or failed before), its build is queued: ``fit()``
        returns ``(fitted model, symmetric)`` or ``(model, symmetric, info)`` and runs in the builder
        thread. ``name`` (default ``str(key)``) and ``info`` describe it."""
        with self._lock:
            ctx = self._contexts.get(key)
            if ctx is not None and ctx.status != "failed":
                self._contexts.move_to_end(key)
                self.hits += 1
                return ctx
            self._contexts.pop(key, None)
            self._make_room(CONTEXT_OVERHEAD, count=1)
            ctx = self._contexts[key] = LiveContext(str(key) if name is None else name, dict(info or {}))
            self.builds += 1
        self._builder.submit(self._build, ctx, fit)
        return ctx

    def delete(self, key: Any) -> bool:
        """Remove a context (a build in progress is cancelled); whether it existed."""
        with self._lock:
            ctx = self._contexts.pop(key, None)
        if ctx is None:
            return False
        ctx.cancel.set()
        return True

    def forget(self, ctx: LiveContext) -> None:
        """Drop ``ctx`` if it is still held (its features are gone, e.g. with its cluster), so that the
        next :meth:`start` of its key builds it again."""
        with self._lock:
            for key, held in list(self._contexts.items()):
                if held is ctx:
                    del self._contexts[key]

    def close(self) -> None:
        """Cancel every build and stop the builder thread."""
        with self._lock:
            for ctx in self._contexts.values():
                ctx.cancel.set()
        self._builder.shutdown(wait=False, cancel_futures=True)

    # --------------------------------------------------------------- builds
    def _build(self, ctx: LiveContext, fit: Callable[[], tuple[Any, bool]]) -> None:
        start = time.perf_counter()
        try:
            if ctx.cancel.is_set():
                raise Cancelled("the build was cancelled")
            model, symmetric, *extra = fit()
            ctx.info.update(*extra)
            store = context_store(model, self.rows, symmetric=symmetric, backend=self.backend, storage=self.storage,
                                  memory_budget=self.memory_budget, client=self.client)
            needed = store.nbytes + CONTEXT_OVERHEAD
            with self._lock:
                if needed > self.max_bytes:
                    raise ContextLimit(f"this context needs {needed / 2**20:.1f} MiB of features but the cache holds "
                                       f"{self.max_bytes / 2**20:.1f} MiB; raise the cache bound (--cache-mb)")
                ctx.model, ctx.store, ctx.nbytes = model, store, needed
                self._make_room(0, count=0, keep=ctx)
            store.build(cancel=ctx.cancel)
            if self.size is not None:
                with self._lock:
                    ctx.nbytes = int(self.size(ctx))
                    self._make_room(0, count=0, keep=ctx)
            ctx.status = "ready"
        except Exception as exc:  # reported by status and by the next search
            ctx.status, ctx.error, ctx.exception = "failed", str(exc) or type(exc).__name__, exc
            ctx.store, ctx.nbytes = None, CONTEXT_OVERHEAD
        finally:
            ctx.seconds = time.perf_counter() - start
            ctx.done.set()

    def _make_room(self, nbytes: int, count: int, keep: LiveContext | None = None) -> None:
        """Drop least recently used ready (or failed) contexts until ``nbytes`` more bytes and ``count``
        more contexts fit; the lock is held. Building contexts are never dropped."""
        def over() -> bool:
            held = sum(c.nbytes for c in self._contexts.values())
            return held + nbytes > self.max_bytes or len(self._contexts) + count > self.max_contexts

        for key in [n for n, c in self._contexts.items() if c.status != "building" and c is not keep]:
            if not over():
                return
            del self._contexts[key]
            self.evictions += 1
        if over():
            building = sum(c.status == "building" for c in self._contexts.values())
            raise ContextLimit(f"{building} contexts are building and the cache is full ({len(self._contexts)} "
                               f"contexts, at most {self.max_contexts}); wait for a build or delete a context")


__all__ = ["ContextRegistry", "LiveContext", "ContextLimit"]
