"""``Index``: a persistent gallery for one geometry, searched exactly or through an ANN index."""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import torch

from .._backend import concat, positive_int
from ..models.base import EuclideanModel, Geometry
from ._common import Backend, id_array, restricted_knn
from ._registry import BACKENDS, backend_class, backend_names
from ..exact import NO_INDEX, block_shape, key_feature_blocks, smallest_k
from ._storage import (FORMAT, VERSION, atomic_save, fingerprint, geometry_from_dict, geometry_to_dict, read_payload,
                       seal)

#: Relative tolerance under which :meth:`Index.recall` treats two divergences as tied.
TIE_RTOL = 1e-6
#: Tuning of ``tunable`` backends (faiss ``nprobe="auto"``, ``ef_search="auto"``): the recall@10 a trial setting must
#: reach, on this many keys of the batch added as queries.
AUTO_RECALL, AUTO_SAMPLE = 0.995, 500


class Index:
    """A gallery of vectors, searched by an anchor divergence (or any geometry).

    Each vector g is stored as its key features ψ(g) of the inner-product form
    ``d(q, g) = o(q) − φ(q)ᵀψ(g)`` (see :class:`anchordiv.Geometry`). Results are exact
    divergences in the units of ``model.search``: the approximate backends fetch a
    shortlist of candidates and re-rank it with the model.

    Parameters
    ----------
    model : Geometry
        A fitted anchor model or baseline (``model.fit`` has been called).
    backend : str
        A name of :data:`anchordiv.index.BACKENDS`. ``"exact"`` (default) keeps ψ in torch
        and searches exhaustively, memory-bounded, exactly as :func:`anchordiv.exact.search`.
        ``"faiss"`` keeps a faiss-cpu index (``pip install faiss-cpu``). ``"milvus"`` keeps
        the vectors in a Milvus collection: an embedded milvus-lite file or a server/cluster
        (``pip install pymilvus milvus-lite``). Backends of one's own:
        :func:`anchordiv.index.register_backend` or an ``anchordiv.backends`` entry point.
    symmetric : bool
        Rank by ½[d(q‖g) + d(g‖q)] (default) or, when False, by d(q‖g).
    **params
        Backend parameters.

        exact
            ``memory_budget`` (bytes of one score block, default 256 MiB).
        faiss
            ``index_type`` ("flat" default, "hnsw", "ivf"), ``M`` (32), ``ef_construction``
            (200), ``ef_search`` ("auto": tuned as nprobe), ``nlist`` (default min(⌊4√n⌋, n/39) of the first
            batch), ``nprobe`` ("auto": tuned after adds to reach recall@10 ≥ 0.995 on sampled
            keys), ``candidates`` ("auto": routed IVF lists for softmax and mixtures),
            ``shortlist`` (default max(4k, 64)), ``norm_margin`` (1.25), ``memory_budget``.
        milvus
            ``uri`` (required: "./name.db" for milvus-lite, "http://host:19530" for a
            server), ``token``, ``db_name``, ``collection_name`` ("anchordiv"),
            ``index_type`` ("FLAT" default, "HNSW", "IVF_FLAT", "AUTOINDEX"), ``M``,
            ``ef_construction``, ``ef_search``, ``nlist`` (128), ``nprobe``, ``shortlist``,
            ``norm_margin``, ``overwrite`` (False), ``consistency_level`` ("Session"),
            ``memory_budget``.

    Notes
    -----
    Euclidean models (Gaussian and the latent models, d = ‖z_q − z_g‖²) are indexed by
    their embedding z with L2. Every other geometry is indexed through the MIPS-to-L2
    reduction x = [ψ, √(M² − ‖ψ‖²)], y = [φ, 0] (Bachrach et al., 2014), whose L2 order is
    the divergence order; M is set to ``norm_margin`` × the largest ‖ψ‖ of the first batch,
    and a later batch with a larger norm re-augments all stored keys with a new M (faiss:
    the index is rebuilt; milvus: every stored row is read back and upserted).

    The faiss and milvus backends store float32 vectors, so their distances are exact
    divergences of float32-rounded key features. The exact backend keeps the dtype of
    the first batch added.

    Milvus servers and clusters: see :mod:`anchordiv.index` for connecting with ``uri``,
    ``token`` and ``collection_name``; the token is never written by :meth:`save`.
    With the augmented layout, milvus indexes the keys with metric COSINE, which orders
    keys of one norm as L2 does.

    Examples
    --------
    >>> index = ad.Index(ad.Softmax(tau=0.05).fit(anchors), backend="faiss", index_type="hnsw")
    >>> index.add(gallery, ids=gallery_ids)
    >>> distances, ids = index.search(queries, k=10)
    >>> index.save("gallery.index"); index = ad.Index.load("gallery.index")
    """

    def __init__(self, model: Geometry, backend: str = "exact", *, symmetric: bool = True, **params: Any):
        if not isinstance(model, Geometry):
            raise TypeError(f"model must be an anchordiv geometry (e.g. ad.Softmax(...).fit(anchors)), got {type(model).__name__}.")
        model._check_fitted()
        cls = backend_class(backend)
        self._setup(model, bool(symmetric), cls(cls.configure(params, model), isinstance(model, EuclideanModel)))

    def _setup(self, model: Geometry, symmetric: bool, backend: Backend, ids: np.ndarray | None = None,
               dim: int | None = None) -> None:
        self._model = model
        self._symmetric = symmetric
        self._backend = backend
        backend.norm_bound = model.key_norm_bound(symmetric)
        backend.anchor_logits = getattr(model, "anchor_logits", None)
        self._ids = np.zeros(0, dtype=np.int64) if ids is None else ids
        self._dim = dim
        # made from the ids when first needed, and again once they are replaced (add, delete, build):
        self._lookup: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (sorted ids, their order, ids)
        self._id_table: tuple[np.ndarray, np.ndarray] | None = None  # (ids followed by −1, ids)
        self._width: int | None = None  # width of φ and ψ (they pair up in one inner product)
        backend.bind(model, symmetric)

    # -------------------------------------------------------------- properties
    @property
    def model(self) -> Geometry:
        """The geometry whose divergence ranks the results."""
        return self._model

    @property
    def backend(self) -> str:
        """Backend name: ``"exact"``, ``"faiss"``, ``"milvus"`` or a registered one."""
        return self._backend.name

    @property
    def symmetric(self) -> bool:
        """Whether results are ranked by the symmetrized divergence."""
        return self._symmetric

    @property
    def params(self) -> dict:
        """Backend parameters in force (a copy)."""
        return dict(self._backend.params)

    @property
    def ids(self) -> np.ndarray:
        """Ids of the stored vectors, in the order they were added (a read-only view)."""
        view = self._ids.view()
        view.flags.writeable = False
        return view

    @property
    def dim(self) -> int | None:
        """Dimension of the stored vectors (None before the first ``add``)."""
        return self._dim

    def __len__(self) -> int:
        return int(self._ids.shape[0])

    def __repr__(self) -> str:
        defaults = self._backend.DEFAULTS
        shown = {k: v for k, v in self._backend.saved_params().items()
                 if k in ("uri", "collection_name") or v != defaults.get(k)}
        extra = "".join(f", {k}={v!r}" for k, v in shown.items())
        return f"Index({self._model!r}, backend={self.backend!r}, symmetric={self._symmetric}, n={len(self)}{extra})"

    # ---------------------------------------------------------------- helpers
    def _vectors(self, X: Any, name: str) -> tuple[torch.Tensor, Any]:
        t, kind = self._model.check_input(X, name)
        if self._dim is not None and t.shape[1] != self._dim:
            raise ValueError(f"{name} has dimension {t.shape[1]} but this index holds vectors of dimension {self._dim}.")
        return t, kind

    def _new_ids(self, ids: Any, n: int, replace: bool = False) -> np.ndarray:
        """Checked ids of ``n`` new rows (default: continuing len(index)); with ``replace``, ids
        already stored are allowed (an upsert)."""
        if ids is None:
            if replace:
                raise ValueError("upsert needs ids=: the ids of the rows to insert or replace.")
            new = np.arange(len(self), len(self) + n, dtype=np.int64)
        else:
            new = id_array(ids, "ids")
            if new.shape[0] != n:
                raise ValueError(f"ids must be a 1-D sequence of {n} ints (one per row of G), got shape {new.shape}.")
        uniq, counts = np.unique(new, return_counts=True)
        if (counts > 1).any():
            dup = uniq[counts > 1]
            raise ValueError(f"Duplicate ids within this batch: {dup[:5].tolist()}{' ...' if len(dup) > 5 else ''}.")
        clash = new[np.isin(new, self._ids)]
        if clash.size and not replace:
            raise ValueError(
                f"ids already in the index: {clash[:5].tolist()}{' ...' if clash.size > 5 else ''}; every id must be "
                "unique (use upsert to replace stored vectors)."
            )
        return new

    def _find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions, found) of ``ids`` among the stored ids (positions valid where found)."""
        if self._lookup is None or self._lookup[2] is not self._ids:
            order = np.argsort(self._ids, kind="stable")
            self._lookup = (self._ids[order], order, self._ids)
        sorted_ids, order, _ = self._lookup
        at = np.clip(np.searchsorted(sorted_ids, ids), 0, max(0, len(sorted_ids) - 1))
        found = sorted_ids[at] == ids if len(sorted_ids) else np.zeros(np.shape(ids), bool)
        return order[at], found

    def _positions_of(self, ids: np.ndarray) -> np.ndarray:
        positions, found = self._find(ids)
        if not found.all():
            raise RuntimeError(
                f"The {self.backend} store returned id(s) {np.asarray(ids)[~found][:5].tolist()} that this index never "
                "added; it was changed outside this index."
            )
        return positions

    # ------------------------------------------------------------------- API
    def add(self, G: Any, ids: Any = None, metadata: Any = None) -> "Index":
        """Add the rows of ``G`` (numpy or torch, (n, d)) with optional int64 ``ids``.

        Parameters
        ----------
        G : array-like (n, d)
            Vectors in the model's embedding space.
        ids : array-like (n,) of int, optional
            One unique id per row; default len(index), len(index) + 1, …
        metadata : pandas.DataFrame (n rows), optional
            Backends tagged ``stores_metadata`` (milvus) only: stored as scalar fields (bool,
            int, float or str columns) beside the vectors, for ``search(filter=...)``
            expressions and other tools. The first add fixes the columns; later adds bring
            the same ones.

        Returns
        -------
        Index
            self.

        Notes
        -----
        Key features are computed and handed to the backend in blocks whose features take
        a quarter of ``memory_budget``, so an add needs no more memory than the budget
        beyond what the backend stores.
        """
        g, _ = self._vectors(G, "G")
        self._add(g, self._new_ids(ids, g.shape[0]), metadata=self._metadata(metadata, g.shape[0]))
        return self

    def _metadata(self, metadata: Any, n: int) -> Any:
        """``metadata`` as a pandas DataFrame of ``n`` rows (backends tagged ``stores_metadata``), or None."""
        if metadata is None:
            return None
        if not self._backend.tags().stores_metadata:
            keep = " or ".join(n for n in backend_names() if backend_class(n).tags().stores_metadata)
            raise ValueError(f"metadata is stored by the {keep or 'metadata-storing'} backend only; the "
                             f"{self.backend!r} backend keeps vectors alone (keep the metadata table beside the "
                             "index and filter by ids).")
        import pandas as pd

        frame = metadata if isinstance(metadata, pd.DataFrame) else pd.DataFrame(metadata)
        if len(frame) != n:
            raise ValueError(f"metadata has {len(frame)} rows but G has {n}; give one metadata row per vector.")
        return frame.reset_index(drop=True)

    def _add(self, g: torch.Tensor, new: np.ndarray, upsert: bool = False, metadata: Any = None) -> None:
        """Store the key features of ``g`` under the (checked) ids ``new``, a budget-sized block at a time."""
        budget = self._backend.memory_budget
        width = self._feature_width(g)  # the feature width sets the block
        self._backend.reserve(g.shape[0], width, g.dtype, g.device)
        for start, psi in key_feature_blocks(self._model, g, self._symmetric, budget, width):
            block = slice(start, start + psi.shape[0])
            self._add_keys(psi, new[block], upsert, g[block], None if metadata is None else metadata.iloc[block])
        self._dim = int(g.shape[1])
        if self._backend.needs_tuning(len(self)):
            self._tune(g, new)

    def _tune(self, g: torch.Tensor, new: np.ndarray) -> None:
        """The first of the backend's trial settings (:meth:`Backend.tuning_trials`; faiss: the values of
        ``NPROBE_LADDER`` up to nlist) whose recall@10 reaches ``AUTO_RECALL`` on ``AUTO_SAMPLE`` keys
        of the batch ``g`` (ids ``new``) as queries, each excluding itself."""
        backend, n = self._backend, len(self)
        k = min(10, n - 1)
        if k < 1:
            return
        rows = np.sort(np.random.default_rng(0).choice(g.shape[0], size=min(AUTO_SAMPLE, g.shape[0]), replace=False))
        q = g[torch.from_numpy(rows).to(g.device)]
        ex = self._excluded_positions(new[rows][:, None], len(rows), k, q.device)
        exact_d, exact_p = self._exact_positions(q, k, ex)
        threshold = self._tie_threshold(q, exact_d)
        for _ in backend.tuning_trials():
            with warnings.catch_warnings():  # a too-small trial value's short lists are no news to the caller
                warnings.simplefilter("ignore", RuntimeWarning)
                d, p = self._search_block(q, k, ex)[:2]
            if self._found_share(d, p, exact_p, threshold) >= AUTO_RECALL:
                break
        backend.tuned(n)

    def _add_keys(self, psi: torch.Tensor, new: np.ndarray, upsert: bool = False, raw: Any = None,
                  metadata: Any = None) -> None:
        """Hand key features ``psi`` of ids ``new`` to the backend, with their raw embeddings ``raw`` and
        ``metadata`` rows (given only to backends that store metadata)."""
        self._backend.add(psi, new, self._ids, upsert=upsert, raw=None if raw is None else torch.as_tensor(raw),
                          metadata=metadata)
        self._ids = np.concatenate([self._ids, new])

    def upsert(self, G: Any, ids: Any, metadata: Any = None) -> "Index":
        """Insert the rows of ``G`` under ``ids``, replacing the stored vectors of ids already present.

        A replaced vector is stored as a newly added one (it moves to the end of the
        insertion order that breaks ties). On Milvus the rows are written with Milvus'
        upsert, so a repeated call (a retried task) leaves one row per id.

        Returns
        -------
        Index
            self.
        """
        g, _ = self._vectors(G, "G")
        new = self._new_ids(ids, g.shape[0], replace=True)
        frame = self._metadata(metadata, g.shape[0])
        positions, found = self._find(new)
        if found.any():
            self._drop(positions[found], new[found], replaced=True)
        self._add(g, new, upsert=True, metadata=frame)
        return self

    def delete(self, ids: Any) -> "Index":
        """Remove the vectors of ``ids`` (each must be stored); the others keep their order.

        faiss ``hnsw`` and ``ivf`` indexes are rebuilt from the remaining vectors (an HNSW
        graph cannot drop nodes; the IVF lists keep their trained centroids).

        Returns
        -------
        Index
            self.
        """
        gone = id_array(ids, "ids")
        positions, found = self._find(gone)
        if not found.all():
            missing = gone[~found]
            raise ValueError(f"ids not in the index: {missing[:5].tolist()}{' ...' if missing.size > 5 else ''}; "
                             "delete only stored ids (see index.ids).")
        self._drop(np.unique(positions), np.unique(gone))
        return self

    def _drop(self, positions: np.ndarray, ids: np.ndarray, replaced: bool = False) -> None:
        positions = np.unique(positions)
        self._backend.delete(positions, ids, len(self), replaced=replaced)
        self._ids = np.delete(self._ids, positions)

    def search(self, Q: Any, k: int = 10, exclude: Any = None, filter: Any = None, *, certify: bool = False,
               fallback: bool = True) -> tuple[Any, ...]:
        """The k stored vectors closest to each query.

        Parameters
        ----------
        Q : array-like (|Q|, d)
            Queries (numpy in → numpy out, torch in → torch out).
        k : int
            Neighbours per query, at most ``len(index)``.
        exclude : array-like (|Q|,) or (|Q|, e) of int, optional
            Ids that each query must not return (−1 for none), e.g. a query's own id.
        filter : array-like of int or str, optional
            Search only these ids (an allow-list; ids not stored are ignored), on every
            backend: exact restricts the blocked scan, faiss passes an ``IDSelectorBatch``
            in its search parameters, milvus an ``id in [...]`` expression. A string is a
            Milvus boolean expression on the collection's scalar fields (e.g.
            ``'label == "cat" and id > 10'``), milvus only; queries with fewer than k
            matching rows get id −1 and distance inf for the rest.
        certify : bool
            Also prove, per query, that the result is the exact top-k: the keys left out of
            the re-ranked shortlist are bounded away from the k-th result (faiss ``flat``
            and ``ivf``; see :mod:`anchordiv.index._certify`). Exact indexes certify every
            query, graph (HNSW) and milvus indexes none.
        fallback : bool
            With ``certify``: search the queries that are not certified again exactly (over
            the stored features), so that every result is exact.

        Returns
        -------
        distances : (|Q|, k)
            Exact divergences (``model.search`` units), ascending; ties are broken by the
            order in which vectors were added.
        ids : (|Q|, k) int64
            Ids of the neighbours. An approximate index that finds fewer than k
            candidates for a query fills the rest with id −1 and distance inf (with a
            ``RuntimeWarning``).
        certified : (|Q|,) bool numpy array, only with ``certify``
            Whether the approximate result of each query was proven exact (False for the
            queries ``fallback`` searched again exactly).
        """
        k = positive_int(k, "k")
        if len(self) == 0:
            raise ValueError("This index is empty; add vectors with .add(G) before searching.")
        if k > len(self):
            raise ValueError(f"k={k} exceeds the {len(self)} vectors in the index; pass k <= {len(self)}.")
        q, kind = self._vectors(Q, "Q")
        allow = None if filter is None else self._allowed(filter, k)
        ex = None if exclude is None else self._excluded_positions(exclude, q.shape[0], k, q.device)
        if ex is not None and isinstance(allow, np.ndarray):
            inside = int(np.isin(ex.cpu().numpy(), allow).sum(1).max(initial=0))
            if k > allow.size - inside:
                raise ValueError(f"k={k} exceeds the allowed ids left after excluding ({allow.size - inside}); "
                                 "pass a smaller k.")
        # the query features are made a block at a time, within the key share of the budget
        budget = self._backend.memory_budget
        width = self._feature_width(q)
        rows = block_shape(1, q.shape[0], width, q.element_size(), 1, budget)[1]
        parts = [self._search_block(q, k, ex, allow, certify)] if rows >= q.shape[0] else [
            self._search_block(q[s:s + rows], k, None if ex is None else ex[s:s + rows], allow, certify)
            for s in range(0, q.shape[0], rows)]
        dist, pos = concat([p[0] for p in parts]), concat([p[1] for p in parts])
        if certify:
            certified = np.concatenate([p[2] for p in parts])
            if fallback and not certified.all():
                redo = torch.from_numpy(np.flatnonzero(~certified)).to(q.device)
                dist[redo], pos[redo] = self._exact_positions(q[redo], k, None if ex is None else ex[redo], allow)
        ids = self._ids_at((pos if pos.is_cpu else pos.cpu()).numpy())
        if kind.is_numpy:
            out = (kind.out(dist), ids)
        elif q.is_cpu and dist.is_cpu:
            out = (kind.out(dist), torch.from_numpy(ids))
        else:
            out = (kind.out(dist.to(q.device)), torch.from_numpy(ids).to(q.device))
        return out + (certified,) if certify else out

    def _ids_at(self, positions: np.ndarray) -> np.ndarray:
        """Ids of stored ``positions`` (−1: no result, which stays −1), read from the ids followed by
        a −1 (the entry position −1 reads): one lookup, no test for missing results."""
        if self._id_table is None or self._id_table[1] is not self._ids:
            self._id_table = (np.append(self._ids, -1), self._ids)
        return self._id_table[0][positions]

    def _feature_width(self, X: torch.Tensor) -> int:
        """Width of the feature maps, from one row's key features the first time it is needed."""
        if self._width is None:
            self._width = int(self._model.key_terms(X[:1], self._symmetric, compute_dtype=True).shape[1])
        return self._width

    def _allowed(self, filter: Any, k: int) -> np.ndarray | str:
        """What the backend searches among for an id allow-list (sorted stored positions, or its
        :meth:`Backend.allow_ids`), or a filter expression (backends tagged ``expression_filters``)."""
        if isinstance(filter, str):
            if not self._backend.tags().expression_filters:
                raise ValueError(
                    f"filter={filter!r} is a Milvus expression, which the {self.backend!r} backend cannot evaluate; "
                    "pass an array of allowed ids (or use backend='milvus')."
                )
            return filter
        ids = id_array(filter, "filter")
        positions, found = self._find(ids)
        positions = np.unique(positions[found])
        if k > positions.size:
            raise ValueError(f"k={k} exceeds the {positions.size} stored ids that filter allows; pass a smaller k.")
        return self._backend.allow_ids(positions, self._ids[positions])

    def _search_block(self, q: torch.Tensor, k: int, ex: torch.Tensor | None,
                      allow: np.ndarray | str | None = None, certify: bool = False) -> tuple:
        """(distances, positions) of one block of queries, and with ``certify`` the certificate."""
        offsets, phi = self._model.query_terms(q, self._symmetric, compute_dtype=True)
        tags = self._backend.tags()
        extra = {"certify": True} if certify else {}
        if tags.wants_queries:
            extra["queries"] = q
        if ex is None:
            return self._backend.search(offsets, phi, k, len(self), self._positions_of, allow=allow, **extra)
        if tags.accepts_exclude:
            return self._backend.search(offsets, phi, k, len(self), self._positions_of, exclude=ex, allow=allow,
                                        **extra)
        # an approximate index: fetch e more candidates, drop the excluded ones (an exact top-(k + e)
        # stays exact once the excluded keys are dropped)
        wanted = min(len(self) if allow is None or isinstance(allow, str) else allow.size, k + ex.shape[1])
        found = self._backend.search(offsets, phi, wanted, len(self), self._positions_of, allow=allow, **extra)
        dist, pos = found[0], found[1]
        dropped = (pos[:, :, None] == ex[:, None, :]).any(-1) | (pos < 0)
        dist, pos = smallest_k(dist.masked_fill(dropped, torch.inf), pos.masked_fill(dropped, NO_INDEX), k)
        return (dist, pos.masked_fill(pos == NO_INDEX, -1)) + tuple(found[2:])

    def _exact_positions(self, q: torch.Tensor, k: int, ex: torch.Tensor | None,
                         allow: np.ndarray | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k (distances, positions) over the stored key features (those at the sorted
        positions ``allow`` only, when given), by :func:`knn`."""
        if isinstance(allow, str):
            raise ValueError("An exact search again (certify=True with fallback) cannot evaluate a Milvus expression "
                             "filter; pass the allowed ids as an array, or fallback=False.")
        offsets, phi = self._model.query_terms(q, self._symmetric, compute_dtype=True)
        budget = self._backend.memory_budget
        return restricted_knn(offsets, phi, self._backend.key_blocks(self._ids), k, len(self), ex, allow, budget)

    def recall(self, Q: Any, k: int = 10) -> float:
        """Recall@k of this index on queries ``Q``: the share of the keys :meth:`search` returns that
        are in the exact top-k (over the stored key features, by :func:`anchordiv.exact.knn`),
        averaged over the queries; 1.0 for the exact backend.

        Ties have no order: a returned key whose divergence is at most the exact k-th plus
        ``TIE_RTOL`` × the query's scale |o(q)| + ‖φ(q)‖·max‖ψ‖ (the size of the terms the
        divergence is computed from) counts as found, as in ann-benchmarks' distance-based recall.
        """
        k = positive_int(k, "k")
        dist, got = (torch.as_tensor(np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x)) for x in self.search(Q, k=k))
        q, _ = self._vectors(Q, "Q")
        exact_d, exact_p = self._exact_positions(q, k, None)
        got_p = torch.from_numpy(self._find(got.numpy())[0]).masked_fill(got < 0, -1)
        return self._found_share(dist, got_p, exact_p, self._tie_threshold(q, exact_d))

    def _tie_threshold(self, q: torch.Tensor, exact_d: torch.Tensor) -> torch.Tensor:
        """Per query, the largest divergence tied with its exact k-th: exact_d[:, −1] + ``TIE_RTOL`` ×
        (|o(q)| + ‖φ(q)‖·max‖ψ‖), in float64 on the CPU."""
        offsets, phi = self._model.query_terms(q, self._symmetric, compute_dtype=True)
        key_norm = max((float(b.double().norm(dim=1).max()) for b in self._backend.key_blocks(self._ids)
                        if b.shape[0]), default=0.0)
        scale = offsets.double().abs().cpu() + phi.double().norm(dim=1).cpu() * key_norm
        return exact_d[:, -1].double().cpu() + TIE_RTOL * scale

    @staticmethod
    def _found_share(dist: torch.Tensor, pos: torch.Tensor, exact_p: torch.Tensor, threshold: torch.Tensor) -> float:
        """Share of the results (distances ``dist``, positions ``pos``; −1 a miss) in the exact top-k
        positions ``exact_p``, a key within the ``threshold`` of :meth:`_tie_threshold` counting as found."""
        pos, exact_p = pos.cpu(), exact_p.cpu()
        in_exact = (pos[:, :, None] == exact_p[:, None, :]).any(2)
        tied = dist.double().cpu() <= threshold[:, None]
        return float(((in_exact | tied) & (pos >= 0)).double().mean())

    def _excluded_positions(self, exclude: Any, n_q: int, k: int, device: torch.device) -> torch.Tensor:
        """Positions (n_q, e) of the ids each query excludes (−1: none); unknown ids are ignored."""
        ids = exclude.detach().cpu().numpy() if isinstance(exclude, torch.Tensor) else np.asarray(exclude)  # (n_q, e)
        if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"exclude must hold integer ids (−1 for none), got dtype {ids.dtype}.")
        ids = ids.astype(np.int64).reshape(n_q, -1) if ids.ndim == 1 and ids.shape[0] == n_q else ids.astype(np.int64)
        if ids.ndim != 2 or ids.shape[0] != n_q:
            raise ValueError(f"exclude must have one row of ids per query ({n_q}), got shape {ids.shape}.")
        positions, found = self._find(ids)
        known = found & (ids != -1)
        pos = np.where(known, positions, -1)
        if k > len(self) - int(known.sum(1).max(initial=0)):
            raise ValueError(f"k={k} exceeds the vectors left after excluding; pass a smaller k.")
        return torch.from_numpy(pos).to(device)

    def close(self) -> None:
        """Release the backend's connection (milvus); the index cannot be used afterwards."""
        self._backend.close()

    # ------------------------------------------------------------- persistence
    @property
    def file_digest(self) -> str | None:
        """SHA-256 (hex) identifying the content of the index file this index was last saved to
        or loaded from (None before either); equal files have equal digests."""
        return getattr(self, "_file_digest", None)

    def save(self, path: str | os.PathLike) -> str:
        """Write the model, the ids and the stored vectors (or, for milvus, the connection) to ``path``.

        The file is written to a temporary file first and then moved over ``path``, so a
        failed save leaves any previous file intact. Each part of the file (header, model,
        ids, stored vectors) carries a SHA-256 digest that :meth:`load` checks. The milvus
        backend writes the uri, database and collection name but never the token; its
        vectors stay in Milvus (flushed before the file is written).

        Returns
        -------
        str
            The file's digest, also :attr:`file_digest`.
        """
        self._backend.prepare_save()
        payload = {
            "format": FORMAT,
            "version": VERSION,
            "backend": self.backend,
            "symmetric": self._symmetric,
            "params": self._backend.saved_params(),
            "model": geometry_to_dict(self._model),
            "dim": self._dim,
            "ids": torch.from_numpy(self._ids.copy()),
            "store": self._backend.state(len(self)),
        }
        atomic_save(seal(payload), path)
        self._file_digest = fingerprint(payload)
        return self._file_digest

    @classmethod
    def load(cls, path: str | os.PathLike, device: Any = None, *, resync: bool = False, **params: Any) -> "Index":
        """Read an index written by :meth:`save`.

        Parameters
        ----------
        path : str or PathLike
        device : torch device, optional
            Where the model (and the exact backend's features) go; default CPU.
        resync : bool
            Milvus only: rebuild the id list from the collection, for a collection with rows
            added after the file was saved (a crash before ``save``). The collection must
            hold the file's model, ``symmetric`` setting, dimension and layout; the file's
            ids it holds keep their order, the others follow in ascending order (Milvus keeps
            no insertion order). Without it such a collection raises a ``ValueError``.
        **params
            Run-time parameters to change: ``memory_budget`` (all), ``shortlist``,
            ``ef_search``, ``nprobe`` (faiss, milvus), and the connection ``uri``,
            ``token``, ``db_name``, ``consistency_level`` (milvus). A ``token`` is sent
            only to a ``uri`` given in the same call, never to the uri the file names.

        Notes
        -----
        What a file is trusted with: an index file is read with
        ``torch.load(weights_only=True)``, which rebuilds tensors, numbers, strings, lists
        and dicts only, and the model class is looked up by its registry name
        (:func:`anchordiv.register_model` for one's own geometries); nothing a file names
        is imported or run. A crafted file can therefore make searches return wrong
        neighbours (its vectors and model are data), and a milvus file names the server
        that is contacted without credentials; it cannot run code, read other files, or
        receive a token. Load indexes from sources you trust for their *results*.

        Every part of the file is checked against the SHA-256 digest recorded at save
        before it is used. Files of format version 2 (written before digests) load with a
        ``UserWarning``; saving them again adds the digests.

        Raises
        ------
        FileNotFoundError
            No file at ``path``.
        ValueError
            The file is damaged (a digest does not match), corrupt, of another format, or
            its Milvus collection is missing or no longer matches it.
        """
        source = os.fspath(path)
        payload = read_payload(source)
        try:
            backend_name, symmetric = payload["backend"], bool(payload["symmetric"])
            saved, ids, store, dim = payload["params"], payload["ids"], payload["store"], payload["dim"]
        except (KeyError, TypeError):
            raise ValueError(f"{source!r} is corrupt: required fields are missing.") from None
        if not isinstance(backend_name, str) or backend_name not in BACKENDS:
            raise ValueError(f"{source!r} uses backend {backend_name!r}, which is not registered here; install or "
                             "register that backend (anchordiv.index.register_backend) before loading.")
        backend_cls = backend_class(backend_name)
        bad = sorted(set(params) - backend_cls.RUNTIME)
        if bad:
            raise ValueError(
                f"Cannot change {', '.join(bad)} when loading a {backend_name!r} index; "
                f"changeable: {', '.join(sorted(backend_cls.RUNTIME))}."
            )
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.int64 or ids.ndim != 1:
            raise ValueError(f"{source!r} is corrupt: its ids are not a 1-D int64 tensor.")
        uniq, counts = np.unique(ids.numpy(), return_counts=True)
        if (counts > 1).any():
            raise ValueError(
                f"{source!r} is corrupt: it lists the id(s) {uniq[counts > 1][:5].tolist()} more than once; "
                "every id of an index is unique. Rebuild the index from its collection."
            )
        backend_cls.check_load_params(saved, params, source)
        if not isinstance(saved, dict) or not isinstance(store, dict):
            raise ValueError(f"{source!r} is corrupt: backend parameters or store are malformed.")
        dev = torch.device(device) if device is not None else torch.device("cpu")
        model = geometry_from_dict(payload["model"], dev, source)
        ids_np = ids.numpy().copy()
        if resync:
            if not backend_cls.tags().remote:
                remote = " or ".join(n for n in backend_names() if backend_class(n).tags().remote)
                raise ValueError(f"resync=True applies to {remote or 'server-backed'} indexes only; {source!r} is a "
                                 f"{backend_name!r} index.")
            ids_np, store = backend_cls.resync({**saved, **params}, model, symmetric, store, ids_np, source)
        backend = backend_cls.restore({**saved, **params}, isinstance(model, EuclideanModel), store, len(ids_np), source)
        backend.to(dev)
        self = cls.__new__(cls)
        self._setup(model, symmetric, backend, ids_np, dim)
        self._file_digest = fingerprint(payload)
        return self
