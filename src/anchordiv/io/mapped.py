"""A collection's embedding shards memory-mapped and read as one (n, d) array: :class:`MappedRows`.

The shards (``img_emb_<i>.npy`` of the clip-retrieval layout, float16 or float32) stay on
disk; rows are read when a block, a row or a list of rows is asked for, so opening a
collection of any size costs only its file headers.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Stored dtypes that can be mapped (others are read with :func:`anchordiv.io.load_collection`).
MAPPED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class MappedRows:
    """Rows of one or more (n_i, d) arrays, in order, seen as one read-only (n, d) array.

    ``np.asarray(rows)`` reads every row; ``rows[i]``, ``rows[a:b]`` and ``rows[idx]`` (an
    integer array) read those rows only; :meth:`blocks` yields views of at most a given
    number of rows, shard by shard, for streaming passes.

    Parameters
    ----------
    parts : sequence of numpy arrays
        The shards (typically read-only ``np.memmap``), all 2-D with the same number of
        columns and the same float dtype.
    """

    def __init__(self, parts: Sequence[np.ndarray]):
        parts = [p for p in parts]
        if not parts:
            raise ValueError("parts is empty; pass at least one (n, d) array.")
        if any(not isinstance(p, np.ndarray) or p.ndim != 2 for p in parts):
            raise ValueError("every part must be a 2-D numpy array (n_i, d).")
        dims, dtypes = {p.shape[1] for p in parts}, {p.dtype for p in parts}
        if len(dims) != 1:
            raise ValueError(f"the parts have different dimensions {sorted(dims)}; all shards must come from one encoder.")
        if len(dtypes) != 1 or next(iter(dtypes)) not in MAPPED_DTYPES:
            raise ValueError(f"the parts must share one dtype among float16, float32 and float64, got "
                             f"{sorted(map(str, dtypes))}.")
        self.parts = parts
        self.offsets = np.cumsum([0] + [p.shape[0] for p in parts])
        self.dtype = parts[0].dtype
        self.shape = (int(self.offsets[-1]), int(parts[0].shape[1]))

    @classmethod
    def open(cls, files: Sequence[str | os.PathLike]) -> "MappedRows":
        """Memory-map ``.npy`` files read-only (no pickles), in the order given."""
        parts = []
        for f in files:
            a = np.load(Path(f), mmap_mode="r", allow_pickle=False)
            if not isinstance(a, np.ndarray) or a.ndim != 2:
                raise ValueError(f"{os.fspath(f)!r} is not a 2-D .npy array; embeddings must be (n, d).")
            parts.append(a)
        return cls(parts)

    # ----------------------------------------------------------- array-like
    ndim = 2

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"MappedRows(n={self.shape[0]}, dim={self.shape[1]}, dtype={self.dtype}, shards={len(self.parts)})"

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.dtype if dtype is None else dtype)
        for start, block in self.blocks(1 << 16):
            out[start:start + block.shape[0]] = block
        return out

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, (int, np.integer)):
            i = int(key) + (self.shape[0] if int(key) < 0 else 0)
            if not 0 <= i < self.shape[0]:
                raise IndexError(f"row {int(key)} is out of range for {self.shape[0]} rows")
            s = int(np.searchsorted(self.offsets, i, side="right")) - 1
            return np.array(self.parts[s][i - self.offsets[s]])
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            if step != 1:
                return self.take(np.arange(start, stop, step))
            return self.read(start, stop)
        return self.take(np.asarray(key))

    # ---------------------------------------------------------------- reads
    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` as one array in the stored dtype."""
        out = np.empty((max(0, stop - start), self.shape[1]), dtype=self.dtype)
        for s, part in enumerate(self.parts):
            lo, hi = max(start, self.offsets[s]), min(stop, self.offsets[s + 1])
            if hi > lo:
                out[lo - start:hi - start] = part[lo - self.offsets[s]:hi - self.offsets[s]]
        return out

    def take(self, rows: Any) -> np.ndarray:
        """The rows at integer positions ``rows`` (any order, repeats allowed), in the stored dtype."""
        idx = np.asarray(rows)
        if idx.dtype == bool or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(f"rows must be integer positions, got dtype {idx.dtype}.")
        idx = idx.astype(np.int64).reshape(-1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.shape[0]):
            raise IndexError(f"rows must be in [0, {self.shape[0]}).")
        out = np.empty((idx.size, self.shape[1]), dtype=self.dtype)
        shard = np.searchsorted(self.offsets, idx, side="right") - 1
        for s in np.unique(shard).tolist():
            at = np.flatnonzero(shard == s)
            out[at] = self.parts[s][idx[at] - self.offsets[s]]
        return out

    def blocks(self, rows: int, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, view)`` of consecutive blocks of at most ``rows`` rows of ``start:stop``
        (views of the maps: nothing is read until the block is used)."""
        rows, stop = max(1, int(rows)), self.shape[0] if stop is None else stop
        for s, part in enumerate(self.parts):
            lo, hi = max(start, self.offsets[s]), min(stop, self.offsets[s + 1])
            for b in range(lo, hi, rows):
                e = min(hi, b + rows)
                yield int(b), part[b - self.offsets[s]:e - self.offsets[s]]


def as_rows(embeddings: Any) -> MappedRows:
    """``embeddings`` (a :class:`MappedRows`, or an (n, d) array) as :class:`MappedRows`."""
    if isinstance(embeddings, MappedRows):
        return embeddings
    arr = embeddings if isinstance(embeddings, np.ndarray) else np.asarray(embeddings)  # a memmap stays one
    if arr.dtype not in MAPPED_DTYPES:
        arr = arr.astype(np.float32)
    return MappedRows([arr])


__all__ = ["MappedRows", "as_rows", "MAPPED_DTYPES"]
