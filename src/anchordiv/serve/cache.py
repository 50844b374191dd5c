"""A thread-safe LRU cache bounded in bytes, where each value is built once."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable


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
