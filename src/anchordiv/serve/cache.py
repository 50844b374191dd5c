"""A thread-safe LRU cache bounded in bytes, where each value is built once; sizes by storage."""

from __future__ import annotations

import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import numpy as np
import torch


def _owner(arr: np.ndarray) -> Any:
    """The object that owns an array's memory: the last ndarray of its ``base`` chain."""
    while isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def storages(*objects: Any, max_depth: int = 8) -> dict[tuple, int]:
    """Every array storage reachable from ``objects``: ``{identity: bytes}``.

    Tensors count their whole ``untyped_storage()`` and numpy arrays their owning array, so
    a small view of a large buffer counts as the buffer it keeps alive. Attributes, dicts,
    lists and tuples are followed ``max_depth`` levels deep.
    """
    found: dict[tuple, int] = {}
    seen: set[int] = set()
    stack = [(obj, 0) for obj in objects]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, bool, type, types.ModuleType,
                                                              types.FunctionType, types.MethodType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            try:
                st = obj.untyped_storage()
                found[("torch", obj.device.type, st.data_ptr())] = int(st.nbytes())
            except (RuntimeError, NotImplementedError):  # sparse and other layouts without one storage
                found[("tensor", id(obj))] = obj.numel() * obj.element_size()
            continue
        if isinstance(obj, np.ndarray):
            owner = _owner(obj)
            found[("numpy", owner.__array_interface__["data"][0])] = int(owner.nbytes)
            continue
        if depth >= max_depth:
            continue
        if isinstance(obj, dict):
            children: Iterable = obj.values()
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = obj
        elif hasattr(obj, "__dict__"):
            children = vars(obj).values()
        else:
            continue
        stack.extend((child, depth + 1) for child in children)
    return found


def storage_nbytes(*objects: Any, held: dict[tuple, int] | None = None) -> int:
    """Bytes of the storages reachable from ``objects``, less those in ``held`` (from :func:`storages`
    of what is kept alive elsewhere anyway)."""
    held = held or {}
    return sum(size for key, size in storages(*objects).items() if key not in held)


class ByteLRU:
    """Least-recently-used cache whose values have a size in bytes.

    :meth:`get_or_build` computes a missing value once, however many threads ask for it
    at the same time (the others wait for the first). Entries are evicted, oldest first,
    while the total size exceeds ``max_bytes``; a value larger than ``max_bytes`` on its
    own is returned but not kept.
    """

    def __init__(self, max_bytes: int):
        if int(max_bytes) < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes!r}")
        self.max_bytes = int(max_bytes)
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._building: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        self.hits = self.misses = self.evictions = 0

    def get_or_build(self, key: Hashable, build: Callable[[], tuple[Any, int]]) -> Any:
        """The value under ``key``; ``build()`` returns ``(value, nbytes)`` on a miss."""
        while True:
            with self._lock:
                if key in self._data:
                    self._data.move_to_end(key)
                    self.hits += 1
                    return self._data[key][0]
                event = self._building.get(key)
                owner = event is None
                if owner:
                    event = self._building[key] = threading.Event()
            if owner:
                break
            event.wait()  # another thread builds it; then look again (it may have failed)
        try:
            value, nbytes = build()
        except BaseException:
            with self._lock:
                del self._building[key]
            event.set()
            raise
        with self._lock:
            self.misses += 1
            if nbytes <= self.max_bytes:
                self._data[key] = (value, int(nbytes))
                self._bytes += int(nbytes)
                while self._bytes > self.max_bytes:
                    _, (_, size) = self._data.popitem(last=False)
                    self._bytes -= size
                    self.evictions += 1
            del self._building[key]
        event.set()
        return value

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def stats(self) -> dict:
        """Entries, bytes held, the bound, hits, misses (builds) and evictions."""
        with self._lock:
            return {"entries": len(self._data), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    "hits": self.hits, "misses": self.misses, "evictions": self.evictions}
