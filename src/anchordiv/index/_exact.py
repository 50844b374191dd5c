"""The ``exact`` backend: key features in torch, blocked exact search."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ._common import DEFAULT_MEMORY_BUDGET, Backend, BackendTags, allowed_blocks, positive_int, restricted_knn


class ExactBackend(Backend):
    """Stores ψ(g) for every key and searches exactly with blocked matrix products.

    The features keep the dtype of the first batch added (float32 or float64) and live on
    the model's device. A search is :func:`anchordiv.exact.knn` over the stored blocks:
    one score block of at most ``memory_budget`` bytes, the same distances and the same
    tie-breaking (lower position first) as :func:`anchordiv.exact.search`.

    Parameters
    ----------
    memory_budget : int
        Bytes allowed for one block of scores.
    """

    name = "exact"
    TAGS = BackendTags(exact=True, accepts_exclude=True)
    DEFAULTS = {"memory_budget": DEFAULT_MEMORY_BUDGET}
    CHECKS = {"memory_budget": lambda v: positive_int(v, "memory_budget")}
    RUNTIME = frozenset({"memory_budget"})

    def __init__(self, params: dict, euclidean: bool):
        super().__init__(params, euclidean)
        self.blocks: list[torch.Tensor] = []
        self.dtype: torch.dtype | None = None
        self._batch: tuple[torch.Tensor, int] | None = None  # (storage of the batch being added, rows filled)

    def reserve(self, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        # one allocation for the whole batch: blocks are copied in, and the temporaries of
        # computing them are freed and reused instead of fragmenting the heap between blocks
        if self.dtype is not None and torch.promote_types(dtype, self.dtype) == self.dtype:
            dtype = self.dtype
        self._batch = (torch.empty(rows, width, dtype=dtype, device=device), 0)

    def add(self, psi: torch.Tensor, ids: np.ndarray, stored_ids: np.ndarray, upsert: bool = False,
            raw: torch.Tensor | None = None, metadata: None = None) -> None:
        if self.dtype is None:
            self.dtype = psi.dtype
        elif torch.promote_types(psi.dtype, self.dtype) != self.dtype:  # features that need float64
            self.dtype = psi.dtype
            self.blocks = [b.to(self.dtype) for b in self.blocks]
        if self._batch is not None and self._batch[0].dtype != self.dtype:
            self._batch = (self._batch[0].to(self.dtype), self._batch[1])
        if self._batch is not None:
            storage, filled = self._batch
            storage[filled:filled + psi.shape[0]] = psi
            filled += psi.shape[0]
            self._batch = (storage, filled)
            if filled < storage.shape[0]:
                return
            self._batch, psi = None, storage
        # blocks are kept as they come (no re-concatenation, whose copy would double the
        # memory of the last block); knn streams them in order
        self.blocks = self.blocks + [psi.to(self.dtype).contiguous()]

    def delete(self, positions: np.ndarray, ids: np.ndarray, n: int, replaced: bool = False) -> None:
        keep = np.setdiff1d(np.arange(n), positions)
        self.blocks = [b for b in allowed_blocks(self.blocks, keep)]

    def search(self, offsets: torch.Tensor, phi: torch.Tensor, k: int, n: int,
               positions_of: Callable[[np.ndarray], np.ndarray], allow: np.ndarray | None = None,
               certify: bool = False, exclude: torch.Tensor | None = None,
               queries: torch.Tensor | None = None) -> tuple:
        """Exact top-k positions; ``exclude`` (n_q, e) holds positions each query must skip, ``allow``
        the sorted positions a search is restricted to (a scan of those rows only). With
        ``certify``, every query is certified."""
        dtype = torch.promote_types(phi.dtype, self.dtype)
        if phi.dtype != dtype or offsets.dtype != dtype:
            offsets, phi = offsets.to(dtype), phi.to(dtype)
        d, p = restricted_knn(offsets, phi, self.blocks, k, n, exclude, allow, self.params["memory_budget"])
        return (d, p, np.ones(len(d), dtype=bool)) if certify else (d, p)

    def key_blocks(self, stored_ids: np.ndarray, rows: int = 1 << 16):
        return iter(self.blocks)

    def state(self, n: int) -> dict:
        return {"blocks": [b.detach().cpu() for b in self.blocks]}

    @classmethod
    def restore(cls, params: dict, euclidean: bool, state: dict, n: int, source: str) -> "ExactBackend":
        self = cls(params, euclidean)
        blocks = state.get("blocks")
        if not isinstance(blocks, list) or not all(isinstance(b, torch.Tensor) and b.ndim == 2 for b in blocks):
            raise ValueError(f"{source!r} is corrupt: the exact backend's feature blocks are missing or malformed.")
        rows = sum(b.shape[0] for b in blocks)
        if rows != n:
            raise ValueError(f"{source!r} is corrupt: it holds {rows} feature rows but {n} ids.")
        self.blocks = blocks
        self.dtype = blocks[0].dtype if blocks else None
        return self

    def to(self, device: torch.device) -> None:
        self.blocks = [b.to(device) for b in self.blocks]
