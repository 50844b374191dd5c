"""Building the index of a whole collection in one pass over its shards: :func:`build_index`.

A shard is a row range of one embedding file (clip-retrieval layout: ``img_emb/img_emb_<i>.npy``,
or one ``.npy`` file cut into ``shard_rows`` pieces). Each shard's key features ψ are
computed in blocks of the memory budget; row ``r`` of the collection gets id ``r``.

* In one process (no client), blocks are stored as they are made: the peak memory is
  what the backend stores plus one shard of embeddings and one block of features.
* On a Dask cluster (``client=``, a :class:`distributed.Client`), the fitted model is
  scattered to the workers once and each task computes one shard. Backends tagged
  ``workers_write`` (milvus) have the workers write their rows into the store directly
  (Milvus: upserts, so a retried task writes the same rows again instead of duplicating
  them); for the others (exact, faiss) the driver gathers the shards' features in shard
  order and stores them.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._backend import positive_int
from .._progress import progress_bar
from ..exact import key_feature_blocks
from ..models.base import Geometry
from ._index import Index

#: Rows of a shard cut from a single embedding file (or an in-memory array).
DEFAULT_SHARD_ROWS = 1 << 16


@dataclass(frozen=True)
class Shard:
    """Rows ``start:stop`` of an embedding file (or array) ``source``; global rows from ``offset``;
    ``meta``: the metadata parquet file (or DataFrame) whose rows match ``source``'s, if any."""

    source: Any
    start: int
    stop: int
    offset: int
    meta: Any = None

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def ids(self) -> np.ndarray:
        return np.arange(self.offset, self.offset + len(self), dtype=np.int64)

    def read(self) -> np.ndarray:
        """The shard's embeddings (float32, or float64 when stored so), read from a memory map."""
        rows = np.load(self.source, mmap_mode="r", allow_pickle=False) if isinstance(self.source, str) else self.source
        part = rows[self.start:self.stop]
        return np.array(part, dtype=np.float64 if part.dtype == np.float64 else np.float32)

    def read_metadata(self) -> Any:
        """The shard's metadata rows (a pandas DataFrame), or None."""
        if self.meta is None:
            return None
        if isinstance(self.meta, str):
            from ..io import read_parquet

            table = read_parquet(Path(self.meta))
            return table.slice(self.start, self.stop - self.start).to_pandas()
        return self.meta.iloc[self.start:self.stop].reset_index(drop=True)


def collection_shards(collection: Any, shard_rows: int | None = None) -> list[Shard]:
    """The shards of a collection folder (one per embedding file, clip-retrieval layout), of a
    ``.npy`` file or of an (n, d) array (pieces of ``shard_rows`` rows)."""
    from ..io import MANIFEST_NAME, layout_kind, manifest_files, manifest_of, numbered_files

    step = positive_int(DEFAULT_SHARD_ROWS if shard_rows is None else shard_rows, "shard_rows")
    if isinstance(collection, (str, os.PathLike)):
        p = Path(collection)
        metas: list = []
        if p.is_dir() and (p / MANIFEST_NAME).is_file():
            files, metas = manifest_files(p, manifest_of(p, None), allow_partial=False)
        elif p.is_dir() and (kind := layout_kind(p, None)) is not None:
            files, metas = numbered_files(p, kind)
        elif p.is_file() and p.suffix.lower() == ".npy":
            files = [p]
        else:
            raise ValueError(f"collection {str(p)!r} is not a collection folder (img_emb/ or text_emb/ shards) or a "
                             ".npy file; load other inputs with ad.load_collection and pass the embeddings.")
        metas = [str(m) for m in metas] or [None] * len(files)
        sources = [(str(f), np.load(f, mmap_mode="r", allow_pickle=False).shape[0], m) for f, m in zip(files, metas)]
        step = step if len(files) == 1 else None  # a collection's own shards are the tasks
    else:
        rows = np.asarray(getattr(collection, "embeddings", collection))
        if rows.ndim != 2:
            raise ValueError(f"collection must be a collection path or an (n, d) array, got shape {rows.shape}.")
        sources = [(rows, rows.shape[0], getattr(collection, "metadata", None))]
    shards, offset = [], 0
    for source, n, meta in sources:
        cut = step or max(n, 1)
        for start in range(0, n, cut):
            stop = min(n, start + cut)
            shards.append(Shard(source, start, stop, offset + start, meta))
        offset += n
    return shards


def shard_features(model: Geometry, symmetric: bool, shard: Shard, budget: int) -> torch.Tensor:
    """ψ of one shard as one CPU tensor (a Dask task of a build whose driver stores the features)."""
    x = shard.read()
    out = None
    for start, psi in key_feature_blocks(model, x, symmetric, budget):
        if out is None:
            out = torch.empty(len(x), psi.shape[1], dtype=psi.dtype)
        out[start:start + psi.shape[0]] = psi.cpu()
    return out


def build_index(model: Geometry, collection: Any, backend: str = "exact", *, symmetric: bool = True,
                client: Any = None, shard_rows: int | None = None, progress: bool | None = None,
                **params: Any) -> Index:
    """The index of a whole collection, built in one pass over its shards; ids are the row numbers.

    Parameters
    ----------
    model : Geometry
        A fitted anchor model or baseline.
    collection : path or array
        A collection folder (its embedding files are the shards), a ``.npy`` file, or an
        (n, d) array / :class:`anchordiv.io.Collection`.
    backend, symmetric, **params
        As for :class:`anchordiv.Index`.
    client : distributed.Client, optional
        Build on this Dask cluster: one task per shard, the model scattered once. Without
        one the shards are built in this process, one after the other.
    shard_rows : int, optional
        Rows per shard when a single file or array is cut into shards (default 65,536).
    progress : bool, optional
        Progress bar over the shards (default: on a terminal).

    Returns
    -------
    Index
        Equal to ``Index(model, backend, ...).add(embeddings)``: the same ids (row numbers)
        and the same top-k.
    """
    index = Index(model, backend, symmetric=symmetric, **params)
    store, tags = index._backend, index._backend.tags()
    shards = [s for s in collection_shards(collection, shard_rows) if len(s)]
    if not shards:
        raise ValueError("collection has no rows to index.")
    total = shards[-1].offset + len(shards[-1])
    first = shards[0].read()[:1]
    budget = store.memory_budget
    g0, _ = model.check_input(first, "collection")
    width = index._feature_width(g0)
    bar = progress_bar(total=len(shards), show=progress, desc="index shards", unit="shard")
    try:
        if client is None:
            store.reserve(total, width, g0.dtype, g0.device)
            for shard in shards:
                x, metadata = shard.read(), shard.read_metadata() if tags.stores_metadata else None
                for start, psi in key_feature_blocks(model, x, symmetric, budget):
                    block = slice(start, start + psi.shape[0])
                    index._add_keys(psi, shard.ids[block], raw=x[block],
                                    metadata=None if metadata is None else metadata.iloc[block])
                bar.update(1)
        elif tags.workers_write:
            index._ids = store.build_on_cluster(model, symmetric, client, shards, g0, budget, bar)
        else:
            store.reserve(total, width, g0.dtype, g0.device)
            model_f = client.scatter(model, broadcast=True)
            tag = uuid.uuid4().hex[:8]
            futures = [client.submit(shard_features, model_f, symmetric, s, budget, key=f"anchordiv-shard-{tag}-{i}")
                       for i, s in enumerate(shards)]
            for shard, future in zip(shards, futures):  # in shard order: positions are row numbers
                # the shard's embeddings too, for backends that search candidates among them
                raw = shard.read() if store.wants_key_embeddings else None
                index._add_keys(future.result().to(g0.device), shard.ids, raw=raw)
                future.release()
                bar.update(1)
    finally:
        bar.close()
    index._dim = int(g0.shape[1])
    return index
