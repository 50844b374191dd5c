"""Searching a Milvus collection: batched shortlists (ids only) re-ranked in float64.

Milvus ranks float32 vectors, and d = o(q) − φ(q)ᵀψ(g) of near neighbours is orders of
magnitude smaller than its terms (softmax at τ = 0.01: d ≈ 0.3 from terms of size ≈ 130), so
a float32 re-rank swaps neighbours whose divergences differ by less than its rounding
(≈ 1e-4 there). The shortlist itself holds the float64 top-k; the re-rank computes the
candidates' divergences in float64 from the key features ψ the client keeps
(:class:`LocalFeatures`), and only a client without them (an index loaded from a file, or built
by Dask workers) has Milvus return the stored vectors of the shortlist.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._common import query_blocks, rerank

#: Queries per search request (Milvus accepts at most 16384).
MAX_NQ = 4096


class LocalFeatures:
    """The key features ψ of every stored key, in position order, kept by the client that wrote them."""

    def __init__(self):
        self.data: torch.Tensor | None = None
        self.n = 0

    def reserve(self, rows: int, width: int, dtype: torch.dtype) -> None:
        """Room for ``rows`` more keys of ``width`` features."""
        need = self.n + rows
        if self.data is None:
            self.data = torch.empty(need, width, dtype=dtype)
        elif need > self.data.shape[0]:
            grown = torch.empty(max(need, self.data.shape[0] * 3 // 2), self.data.shape[1], dtype=self.data.dtype)
            grown[:self.n] = self.data[:self.n]
            self.data = grown

    def append(self, psi: torch.Tensor) -> None:
        psi = psi.detach().cpu()
        self.reserve(psi.shape[0], psi.shape[1], psi.dtype)
        self.data[self.n:self.n + psi.shape[0]] = psi
        self.n += psi.shape[0]

    def delete(self, positions: np.ndarray) -> None:
        keep = np.ones(self.n, dtype=bool)
        keep[positions] = False
        self.data = self.data[:self.n][torch.from_numpy(keep)]
        self.n = self.data.shape[0]

    def rows(self) -> torch.Tensor:
        """ψ of the stored keys (a view)."""
        return self.data[:self.n] if self.data is not None else torch.zeros(0, 0)


def shortlists(hits: Any, s: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids (n, s) int64, valid (n, s) bool) of a pymilvus search result, read from each query's id list."""
    cand = np.zeros((len(hits), s), dtype=np.int64)
    valid = np.zeros((len(hits), s), dtype=bool)  # not cand >= 0: ids may be negative
    for r, row in enumerate(hits):
        got = np.asarray(row.ids, dtype=np.int64)
        cand[r, :len(got)] = got
        valid[r, :len(got)] = True
    return cand, valid


def search_milvus(backend: Any, offsets: torch.Tensor, phi: torch.Tensor, k: int, s: int, positions_of: Any,
                  allow: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of the queries (o, φ): one Milvus search per block of queries, re-ranked in float64."""
    p, layout, local = backend.params, backend.layout, backend.local
    fields = [] if local is not None else [backend.vector_field]
    # per query: the gathered candidates' ψ and their float64 copy
    per_query = s * (layout.vector_dim + 2) * 12
    out_d, out_p = [], []
    for sl in query_blocks(phi.shape[0], per_query, p["memory_budget"]):
        for q0 in range(sl.start, sl.stop, MAX_NQ):
            block = slice(q0, min(sl.stop, q0 + MAX_NQ))
            y = layout.queries(phi[block])
            hits = backend.client.search(p["collection_name"], data=list(y), limit=s, anns_field=backend.vector_field,
                                         search_params=backend._search_params(s), output_fields=fields,
                                         consistency_level=backend.read_level(), filter=allow or "")
            cand, valid = shortlists(hits, s)
            pos = np.full_like(cand, -1)
            pos[valid] = positions_of(cand[valid])
            if local is not None:
                psi = local.rows()[torch.from_numpy(np.maximum(pos, 0))]
            else:
                vecs = np.zeros((len(y), s, layout.vector_dim), dtype=np.float32)
                for r, row in enumerate(hits):
                    if len(row):
                        vecs[r, :len(row)] = np.asarray([h["entity"][backend.vector_field] for h in row], dtype=np.float32)
                psi = backend._stored(vecs)
            d, i = rerank(offsets[block].double(), phi[block].double(), psi.to(phi.device),
                          torch.from_numpy(pos).to(phi.device), k)
            out_d.append(d.to(phi.dtype))
            out_p.append(i)
    return torch.cat(out_d), torch.cat(out_p)
