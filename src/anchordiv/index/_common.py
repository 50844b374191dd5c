"""Pieces shared by the index backends: parameter checks, shortlist sizes and exact re-ranking."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from .._backend import positive_int  # noqa: F401  (re-exported for the backends)
from ..exact import DEFAULT_MEMORY_BUDGET, NO_INDEX, allowed_blocks, restricted_knn, smallest_k


def margin_value(value: Any) -> float:
    """``norm_margin`` as a float ≥ 1."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"norm_margin must be a number >= 1, got {value!r}.") from None
    if not np.isfinite(v) or v < 1:
        raise ValueError(f"norm_margin must be a finite number >= 1, got {value!r}.")
    return v


@dataclass(frozen=True)
class BackendTags:
    """What a backend can do, read by :class:`~anchordiv.Index`, :func:`~anchordiv.index.build_index`
    and the CLI instead of its class. Every tag defaults to False."""

    #: Every search is exact (no shortlist): recall is 1 and every query is certified.
    exact: bool = False
    #: ``search(exclude=)`` skips the given positions itself; otherwise the index fetches k + e
    #: results and drops the excluded ones.
    accepts_exclude: bool = False
    #: ``add(metadata=)`` stores the rows of a pandas DataFrame beside the vectors.
    stores_metadata: bool = False
    #: ``search(allow=)`` also takes a string: a filter expression the store evaluates.
    expression_filters: bool = False
    #: ``search(queries=)`` is given the query embeddings, not only their features.
    wants_queries: bool = False
    #: A search parameter is tuned after adds (:meth:`Backend.needs_tuning`,
    #: :meth:`Backend.tuning_trials`, :meth:`Backend.tuned`).
    tunable: bool = False
    #: The vectors live in a server: the index file holds the connection, :meth:`Backend.bind`
    #: names the model in the store, and ``Index.load(resync=True)`` applies (:meth:`Backend.resync`).
    remote: bool = False
    #: On a Dask cluster the workers write their shards into the store themselves
    #: (:meth:`Backend.build_on_cluster`); otherwise the driver gathers the shards' features.
    workers_write: bool = False


class Backend:
    """Base class of the storage backends of :class:`anchordiv.Index`.

    A backend stores key features ψ (row ``i`` belongs to the ``i``-th added vector) and
    answers top-k queries with positions; the owning :class:`~anchordiv.Index` maps
    positions to ids and handles validation and array kinds.

    Subclasses set ``name``, declare ``TAGS`` (a :class:`BackendTags`), ``DEFAULTS`` (every
    accepted parameter with its default), ``CHECKS`` (parameter → validator) and ``RUNTIME``
    (parameters that may be changed when an index is loaded), and implement ``add``,
    ``delete``, ``search``, ``key_blocks``, ``state`` and ``restore``. The other methods are
    hooks with working defaults. Register a subclass with
    :func:`anchordiv.index.register_backend` or an ``anchordiv.backends`` entry point, and check
    it with :func:`anchordiv.testing.check_backend`.
    """

    name: ClassVar[str] = ""
    TAGS: ClassVar[BackendTags] = BackendTags()
    DEFAULTS: ClassVar[dict] = {}
    CHECKS: ClassVar[dict[str, Callable[[Any], Any]]] = {}
    RUNTIME: ClassVar[frozenset] = frozenset()
    #: Parameters kept out of saved files (credentials).
    SECRET: ClassVar[frozenset] = frozenset()

    #: Analytic bound on ‖ψ‖ for unit-norm inputs (set by the owning Index), or None.
    norm_bound: float | None = None
    #: X ↦ per-anchor logits whose argmax is an item's most probable anchor (set by the owning
    #: Index for softmax geometries), or None.
    anchor_logits: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __init__(self, params: dict, euclidean: bool):
        self.params = self.check_params(params)
        self.euclidean = euclidean

    @classmethod
    def tags(cls) -> BackendTags:
        """The capabilities of this backend (see :class:`BackendTags`)."""
        return cls.TAGS

    @property
    def memory_budget(self) -> int:
        """Bytes of one block of features and scores: the ``memory_budget`` parameter, or
        :data:`~anchordiv.exact.DEFAULT_MEMORY_BUDGET` for a backend that declares none."""
        return int(self.params.get("memory_budget", DEFAULT_MEMORY_BUDGET))

    @classmethod
    def check_params(cls, params: dict) -> dict:
        unknown = sorted(set(params) - set(cls.DEFAULTS))
        if unknown:
            raise ValueError(
                f"Unknown parameter(s) for backend {cls.name!r}: {', '.join(unknown)}; "
                f"valid parameters are {', '.join(sorted(cls.DEFAULTS)) or 'none'}."
            )
        out = {**cls.DEFAULTS, **params}
        for key, check in cls.CHECKS.items():
            out[key] = check(out[key])
        return out

    # ------------------------------------------------------------- required
    def add(self, psi: torch.Tensor, ids: np.ndarray, stored_ids: np.ndarray, upsert: bool = False,
            raw: torch.Tensor | None = None, metadata: Any = None) -> None:
        """Store key features ``psi`` for ``ids`` (``stored_ids`` are those already stored).

        ``upsert``: some ``ids`` were just dropped with ``delete(..., replaced=True)`` and are
        written again. ``raw``: the keys' embeddings (a tensor), or None. ``metadata``: a
        pandas DataFrame of these rows (only for backends tagged ``stores_metadata``), or None.
        """
        raise NotImplementedError

    def delete(self, positions: np.ndarray, ids: np.ndarray, n: int, replaced: bool = False) -> None:
        """Remove the keys at sorted ``positions`` (of ``ids``) among the ``n`` stored; later keys move up.
        ``replaced``: the same ids are added again next (an upsert)."""
        raise NotImplementedError

    def search(self, offsets: torch.Tensor, phi: torch.Tensor, k: int, n: int,
               positions_of: Callable[[np.ndarray], np.ndarray],
               allow: np.ndarray | str | None = None, certify: bool = False,
               exclude: torch.Tensor | None = None, queries: torch.Tensor | None = None) -> tuple:
        """Top-k ``(distances, positions)`` among the ``n`` stored keys; position −1 is a miss.

        ``positions_of`` maps ids to positions (for backends that store ids). ``allow``
        restricts the search to sorted positions (what :meth:`allow_ids` made of an id
        allow-list), or is a filter expression (``expression_filters``). With ``certify``, a
        third item: a bool array saying per query whether the result is provably the exact
        top-k. ``exclude`` (``accepts_exclude``): (n_q, e) positions each query skips (−1:
        none). ``queries`` (``wants_queries``): the query embeddings.
        """
        raise NotImplementedError

    def key_blocks(self, stored_ids: np.ndarray, rows: int = 1 << 16):
        """The stored key features ψ, in blocks of ``rows`` in position order (for exact checks)."""
        raise NotImplementedError

    def state(self, n: int) -> dict:
        """Plain data (tensors, numbers, strings) that :meth:`restore` turns back into this backend."""
        raise NotImplementedError

    @classmethod
    def restore(cls, params: dict, euclidean: bool, state: dict, n: int, source: str) -> "Backend":
        """The backend saved by :meth:`state` (``n`` keys) from the file ``source``; a ``ValueError``
        naming ``source`` when ``state`` is malformed."""
        raise NotImplementedError

    # ---------------------------------------------------------------- hooks
    @classmethod
    def configure(cls, params: dict, model: Any) -> dict:
        """The parameters of a new index of ``model`` (defaults that depend on the geometry)."""
        return params

    @classmethod
    def file_params(cls, path: str) -> dict:
        """Parameters a command-line build saved at ``path`` adds when they are not given."""
        return {}

    @classmethod
    def check_load_params(cls, saved: dict, params: dict, source: str) -> None:
        """Refuse run-time ``params`` given to ``Index.load`` of ``source`` (saved with ``saved``)."""

    @classmethod
    def resync(cls, params: dict, model: Any, symmetric: bool, state: dict, ids: np.ndarray,
               source: str) -> tuple[np.ndarray, dict]:
        """The ids and state of a saved index, rebuilt from its store (``remote`` backends)."""
        raise NotImplementedError

    def bind(self, model: Any, symmetric: bool) -> None:
        """The model and ``symmetric`` flag of the owning index."""

    @property
    def wants_key_embeddings(self) -> bool:
        """Whether ``add`` needs ``raw`` (the keys' embeddings) in this configuration."""
        return False

    def allow_ids(self, positions: np.ndarray, ids: np.ndarray) -> np.ndarray | str:
        """What ``search(allow=)`` gets for an id allow-list: the sorted ``positions`` of the
        allowed ``ids``."""
        return positions

    def reserve(self, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> None:
        """Announce that the next ``add`` calls bring ``rows`` features of ``width`` (an Index.add
        streams one batch in blocks); backends that keep features in memory allocate them once."""

    def needs_tuning(self, n: int) -> bool:
        """Whether a search parameter should be tuned now that ``n`` keys are stored (``tunable``)."""
        return False

    def tuning_trials(self):
        """Apply each trial setting in turn, yielding after each; the owning index stops at the first
        whose recall is high enough (``tunable``)."""
        return iter(())

    def tuned(self, n: int) -> None:
        """The tuning with ``n`` keys stored is over (``tunable``)."""

    def build_on_cluster(self, model: Any, symmetric: bool, client: Any, shards: list, first: torch.Tensor,
                         budget: int, progress: Any) -> np.ndarray:
        """Store the ``shards`` of a collection from the workers of the Dask ``client`` (``workers_write``);
        the ids stored (the row numbers). ``first``: the first row as a tensor; ``progress``: a bar
        to update once per shard."""
        raise NotImplementedError

    def to(self, device: torch.device) -> None:
        """Move stored tensors to ``device`` (backends that store outside torch ignore this)."""

    def close(self) -> None:
        """Release connections (backends without any ignore this)."""

    def prepare_save(self) -> None:
        """Make the stored vectors durable before the index file is written."""

    def saved_params(self) -> dict:
        """The parameters written to the index file (all but ``SECRET``)."""
        return {k: v for k, v in self.params.items() if k not in self.SECRET}


def id_array(ids: Any, name: str) -> np.ndarray:
    """``ids`` (a sequence, numpy or torch array of integers) as a 1-D int64 array, or a ``ValueError``."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of int ids, got shape {arr.shape}.")
    if arr.size and (arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name} must be integers (int64 ids), got dtype {arr.dtype}.")
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit in int64.")
    return arr.astype(np.int64)


def shortlist_size(shortlist: int | None, k: int, n: int) -> int:
    """Candidates fetched per query: ``shortlist`` (default max(4k, 64)), at least k, at most n."""
    s = max(4 * k, 64) if shortlist is None else max(shortlist, k)
    return min(s, n)


def query_blocks(n_q: int, per_query_bytes: int, memory_budget: int):
    """Slices of the queries such that one slice needs at most ``memory_budget`` bytes."""
    step = max(1, int(memory_budget) // max(1, per_query_bytes))
    for q0 in range(0, n_q, step):
        yield slice(q0, min(n_q, q0 + step))


def rerank(offsets: torch.Tensor, phi: torch.Tensor, cand_psi: torch.Tensor, cand_pos: torch.Tensor,
           k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k among per-query candidates.

    Parameters
    ----------
    offsets, phi : (n, ), (n, D)
        Query terms o(q), φ(q).
    cand_psi : (n, s, D)
        Key features ψ of each query's candidates.
    cand_pos : (n, s) int64
        Their positions; −1 marks an empty slot.
    k : int

    Returns
    -------
    distances, positions : (n, k)
        o(q) − φ(q)ᵀψ(g) sorted ascending, ties broken by the lower position; missing
        entries have position −1 and distance +inf.
    """
    dtype = torch.promote_types(phi.dtype, cand_psi.dtype)
    phi = phi.to(dtype)
    scores = offsets.to(dtype)[:, None] - torch.bmm(cand_psi.to(dtype), phi[:, :, None])[:, :, 0]
    return best_candidates(scores, cand_pos, k)


def best_candidates(scores: torch.Tensor, cand_pos: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k smallest of per-query candidate ``scores`` (n, s) at positions ``cand_pos`` (−1: an
    empty slot), ties broken by the lower position; missing entries get position −1 and
    distance +inf."""
    missing = cand_pos < 0
    scores = scores.masked_fill(missing, torch.inf)
    # empty slots sort after every real candidate: give them the largest positions
    order_pos = cand_pos.masked_fill(missing, NO_INDEX)
    d, p = smallest_k(scores, order_pos, k)
    gone = p == NO_INDEX
    if bool(gone.any()):
        p = p.masked_fill(gone, -1)
        d = d.masked_fill(gone, torch.inf)
    return d, p


def warn_missing(positions: torch.Tensor, backend: str, hint: str) -> None:
    """Warn when some queries got fewer than k results from an approximate index."""
    short = int((positions < 0).any(dim=1).sum())
    if short:
        warnings.warn(
            f"The {backend} index returned fewer than k candidates for {short} quer{'y' if short == 1 else 'ies'}; "
            f"missing results have id -1 and distance inf. {hint}",
            RuntimeWarning, stacklevel=4,
        )


__all__ = ["Backend", "BackendTags", "DEFAULT_MEMORY_BUDGET", "positive_int", "margin_value", "shortlist_size", "id_array",
           "allowed_blocks", "restricted_knn",
           "query_blocks", "rerank", "best_candidates", "warn_missing"]
