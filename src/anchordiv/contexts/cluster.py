"""A context's features kept on a Dask cluster: each worker builds and keeps its parts, queries are merged exactly.

A :class:`~anchordiv.contexts.FeatureStore` made with ``client=`` (a :class:`distributed.Client`)
cuts the collection into parts (row ranges of its shard files, :func:`cluster_parts`). Each
part is one task: the worker memory-maps its rows, builds the part's ψ and keeps the part in
memory (a Dask future the store holds). A query is computed once on the client (o(q), φ(q)),
each part answers its exact float64 top-k of its own rows, and the client merges them by
(distance, row): the same top-k, and the same distances, as one process's scan, because a part's
blocks are the one-process build's blocks.

Faults: a part lost with its worker is rebuilt from its task (the scheduler re-runs it, on
another worker if need be) and a search waits for it. When parts cannot be answered (no worker
left, or a part failing on every worker), the search raises :class:`PartsMissing` naming them;
when the client lost its scheduler (it restarted, or went away), :class:`ContextLost`.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _gemm
from ..exact import NO_INDEX, smallest_k
from ..io.mapped import MappedRows

#: Rows of one part at most (a multiple of every build block size): 2¹⁸ rows of 512 float16 numbers are
#: 256 MiB of shards, about 0.1–0.5 s of build and 1–3 ms of a query's scan on one core; enough parts
#: to spread over many workers, few enough that a query's per-task cost stays small.
PART_ROWS = 1 << 18
#: Seconds a search waits for parts that are not answering before it names them.
DEFAULT_TIMEOUT = 120.0


class ContextLost(RuntimeError):
    """The cluster no longer holds this context: the client's scheduler restarted or went away."""


class PartsMissing(RuntimeError):
    """Some parts of a context could not be answered (their workers are gone for good)."""


@dataclass(frozen=True)
class Part:
    """Rows ``start:stop`` of shard file ``path``, rows ``offset:offset + len`` of the collection."""

    path: str
    start: int
    stop: int
    offset: int

    def __len__(self) -> int:
        return self.stop - self.start

    def describe(self) -> str:
        return f"rows {self.offset}:{self.offset + len(self)} ({self.path} [{self.start}:{self.stop}])"

    def rows(self) -> MappedRows:
        return MappedRows([np.load(self.path, mmap_mode="r", allow_pickle=False)[self.start:self.stop]])


def shard_files(rows: MappedRows) -> list[str]:
    """The file of each of ``rows``' shards, which every worker maps itself; a ``ValueError`` for rows in memory."""
    files = []
    for part in rows.parts:
        name = getattr(part, "filename", None)
        whole = name is not None and np.load(name, mmap_mode="r", allow_pickle=False).shape == part.shape
        if not whole:
            raise ValueError("client= needs the collection's shards on disk, memory-mapped as whole files "
                             "(ad.load_collection(path, mmap=True)), so that every worker maps them itself; "
                             "save the embeddings with ad.save_collection first")
        files.append(str(name))
    return files


def cluster_parts(rows: MappedRows, block: int, part_rows: int = PART_ROWS) -> list[Part]:
    """The parts of ``rows``: each shard file cut into pieces of a multiple of ``block`` rows, so that a
    part's build blocks are the one-process build's blocks."""
    step = max(block, part_rows // block * block)
    parts = []
    for s, path in enumerate(shard_files(rows)):
        n, offset = len(rows.parts[s]), int(rows.offsets[s])
        parts += [Part(path, a, min(n, a + step), offset + a) for a in range(0, n, step)]
    return parts


class PartRows:
    """The rows of a built part as its store keeps them: the :class:`Part` (pickled as such when Dask moves
    the store to another worker, never its rows), mapped again only if they are read."""

    def __init__(self, part: Part, dim: int):
        self.part, self.shape = part, (len(part), dim)

    def __len__(self) -> int:
        return self.shape[0]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("part", "shape"):
            raise AttributeError(name)
        return getattr(self.part.rows(), name)


def build_part(store_class: type, model: Any, part: Part, symmetric: bool, storage: str, memory_budget: int,
               gemm: dict | None = None) -> Any:
    """The built store (``store_class``, a :class:`FeatureStore`) of one part (a task: its result stays on the
    worker); ``gemm``: the client's GEMM library per product shape (:func:`anchordiv._gemm.using`), so that the
    part's features round as the client's own build would."""
    try:
        with _gemm.using(gemm or {}):
            store = store_class(model, part.rows(), symmetric=symmetric, storage=storage,
                                memory_budget=memory_budget).build()
    except ValueError as exc:  # a bad row: name it in the collection's numbering
        raise ValueError(f"{part.describe()}: {exc}") from None
    store.rows = PartRows(part, store.rows.shape[1])
    return store


def search_part(store: Any, offsets: torch.Tensor, phi: torch.Tensor, k: int, exclude: torch.Tensor | None,
                allow: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One part's exact float64 top-k (its own row numbers), at most ``k`` per query (a task)."""
    return store.search_terms(offsets, phi, k, exclude, allow)


class ClusterParts:
    """The parts of one context on a Dask cluster (see the module doc): :meth:`build`, :meth:`search`."""

    def __init__(self, store: Any, client: Any, *, block: int, part_rows: int = PART_ROWS,
                 timeout: float = DEFAULT_TIMEOUT):
        """The parts of ``store`` (a :class:`FeatureStore` in this process: its model, rows, storage and budget)."""
        self.store_class, self.cancelled = type(store), store.cancelled
        self.client, self.model, self.symmetric = client, store.model, store.symmetric
        if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
        self.storage, self.memory_budget, self.timeout = store.requested, store.memory_budget, float(timeout)
        self.parts = cluster_parts(store.rows, block, part_rows)
        self.futures: list[Any] = []
        self.scheduler = _scheduler_id(client)

    def build(self, on_part: Any, cancel: threading.Event | None) -> None:
        """Submit one task per part and wait for them all; ``on_part(rows)`` as each one ends."""
        tag = uuid.uuid4().hex[:10]
        gemm = _gemm.given_choices()
        self.futures = [self.client.submit(build_part, self.store_class, self.model, p, self.symmetric, self.storage,
                                           self.memory_budget, gemm, key=f"anchordiv-context-{tag}-{i}")
                        for i, p in enumerate(self.parts)]
        try:
            self._wait(self.futures, self.parts, on_part, cancel)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Drop the parts from the cluster."""
        for f in self.futures:
            f.release()
        self.futures = []

    def search(self, offsets: torch.Tensor, phi: torch.Tensor, k: int, exclude: torch.Tensor | None,
               allow: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact top-k over every part, merged by (distance, row)."""
        self._check_scheduler()
        tasks, parts = [], []
        for part, future in zip(self.parts, self.futures):
            lo, hi = part.offset, part.offset + len(part)
            local_allow = None
            if allow is not None:
                local_allow = allow[(allow >= lo) & (allow < hi)] - lo
                if local_allow.size == 0:
                    continue
            local_ex = None
            if exclude is not None:
                local_ex = torch.where((exclude >= lo) & (exclude < hi), exclude - lo, torch.full_like(exclude, -1))
            tasks.append(self.client.submit(search_part, future, offsets, phi, k, local_ex, local_allow, pure=False))
            parts.append(part)
        self._wait(tasks, parts)
        results = self.client.gather(tasks)
        dist = torch.cat([d for d, _ in results], 1)
        rows = torch.cat([torch.where(i == NO_INDEX, i, i + p.offset) for (_, i), p in zip(results, parts)], 1)
        return smallest_k(dist, rows, k)

    # ------------------------------------------------------------ faults
    def _check_scheduler(self) -> None:
        lost = sum(f.status == "cancelled" for f in self.futures)
        if lost or _scheduler_id(self.client) != self.scheduler:
            raise ContextLost(f"the Dask scheduler at {_address(self.client)} restarted or was lost since this "
                              f"context was built ({lost} of {len(self.parts)} parts gone); build the context again")

    def _wait(self, tasks: list, parts: list[Part], on_done: Any = None, cancel: threading.Event | None = None) -> None:
        """Wait until every task has finished. A lost part is re-run by the scheduler, so this only
        gives up (:class:`PartsMissing`) when a task failed on every worker that ran it, or when no
        worker has been connected for ``timeout`` seconds; :class:`ContextLost` when the scheduler goes."""
        import distributed

        seen, alone_since = set(), None
        when = "ALL_COMPLETED" if on_done is None else "FIRST_COMPLETED"  # a search: one wait, no polling
        while True:
            try:
                distributed.wait([t for t in tasks if t.key not in seen], timeout=0.5, return_when=when)
            except TimeoutError:
                pass
            if cancel is not None and cancel.is_set():
                raise self.cancelled("the build was cancelled")
            failed = [p for t, p in zip(tasks, parts) if t.status == "error"]
            if failed:
                exc = next(t.exception() for t in tasks if t.status == "error")
                if isinstance(exc, ValueError):  # bad input (a NaN row): the task's own message
                    raise exc
                raise PartsMissing(self._missing(failed, f"failed on every worker that ran them "
                                                         f"({type(exc).__name__}: {exc})"))
            self._check_scheduler()
            for t, p in zip(tasks, parts):
                if t.status == "finished" and t.key not in seen:
                    seen.add(t.key)
                    if on_done is not None:
                        on_done(len(p))
            if len(seen) == len(tasks):
                return
            if self.client.scheduler_info().get("workers"):
                alone_since = None
            elif alone_since is None:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since > self.timeout:
                missing = [p for t, p in zip(tasks, parts) if t.status != "finished"]
                raise PartsMissing(self._missing(missing, f"have no worker: none has been connected to "
                                                          f"{_address(self.client)} for {self.timeout:g} s"))

    def _missing(self, parts: list[Part], why: str) -> str:
        names = ", ".join(p.describe() for p in parts[:8]) + (" …" if len(parts) > 8 else "")
        return (f"{len(parts)} of {len(self.parts)} parts of this context {why}: {names}. No partial answer "
                "is given: start workers that can read these files, or build the context again")


def _scheduler_id(client: Any) -> str | None:
    try:
        return client.scheduler_info().get("id")
    except Exception:  # a client that lost its scheduler
        return None


def _address(client: Any) -> str:
    return str(getattr(getattr(client, "scheduler", None), "address", None) or "the client's scheduler")


__all__ = ["ClusterParts", "ContextLost", "PartsMissing", "Part", "cluster_parts", "PART_ROWS"]
