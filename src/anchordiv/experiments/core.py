"""The shared core of the experiment protocols: data, geometries and per-query scores.

Every protocol in :mod:`anchordiv.experiments` does the same three things:

1. take an evaluation collection (:class:`EvalData`: embeddings, one label array per
   semantic factor, and which rows are queries and which are keys);
2. build geometries by registry name from anchor sets (:func:`build_geometry`, which
   calls :func:`anchordiv.make_model`) and fit them (:func:`fit_score`);
3. score each fitted geometry by per-query average precision on one or more factors
   (:func:`score`), relevance being "same value of the factor", and record the values
   in a tidy frame that :mod:`anchordiv.experiments.report` aggregates and writes.

AUPRC is the mean over queries of the average precision (Kannan, Park, Veitch 2026,
§5.1 and App. E.4), computed by :func:`anchordiv.metrics.mean_average_precision`. A
query is never its own key: when the queries are the keys (the ImageNet-R setting of
App. E.1) this is ``exclude_self=True``; with a query/key split of one collection the
pair (i, i) is removed wherever it occurs. Queries without any relevant key are skipped.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from .._util import positive_int
from .._util import EmbeddingRows
from ..anchors import AnchorSet
from ..models import default_tau, model_names, registry
from ..metrics import mean_average_precision
from ..exact import distance_matrix

__all__ = [
    "EvalData",
    "ANCHOR_MODELS",
    "BASELINES",
    "PARAMETRIC",
    "POSTERIOR_MODELS",
    "build_geometry",
    "check_models",
    "fit_score",
    "score",
    "mean_auprc",
]

#: Anchor-distribution models by registry name (they take a temperature).
ANCHOR_MODELS = model_names(anchor_model=True)
#: Models with a posterior update ``fit(target, prior=broad)`` (paper §4, App. D): the
#: parametric anchor models of §3.
POSTERIOR_MODELS = model_names(accepts_prior=True)
PARAMETRIC = POSTERIOR_MODELS
#: Reference geometries (paper §5.1): cosine (no anchors) and image-text inversion.
BASELINES = model_names(anchor_model=False)
#: Every registry name.
ALL_MODELS = ANCHOR_MODELS + BASELINES


#: Bytes of one block of float64 query-key distances in :func:`score`.
SCORE_MEMORY_BUDGET = 32 * 2**20


# --------------------------------------------------------------------------- data
def _as_index(value: Any, n: int, name: str) -> np.ndarray:
    """Row indices from None (all rows), a boolean mask or integer indices."""
    if value is None:
        return np.arange(n)
    arr = np.asarray(value)
    if arr.dtype == bool:
        if arr.shape != (n,):
            raise ValueError(f"{name} is a boolean mask of shape {arr.shape}; it needs one entry per row ({n}).")
        idx = np.flatnonzero(arr)
    else:
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must be a boolean mask or a 1-D array of row indices.")
        idx = arr.astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"{name} holds row indices outside [0, {n}).")
        if np.unique(idx).size != idx.size:
            raise ValueError(f"{name} holds repeated row indices.")
    if idx.size == 0:
        raise ValueError(f"{name} selects no rows.")
    return idx


@dataclass
class EvalData(EmbeddingRows):
    """An evaluation collection: embeddings, semantic labels, queries and keys.

    Build it with :meth:`create` (checks every input) or :meth:`from_collection`.

    Attributes
    ----------
    embeddings : numpy.ndarray, shape (n, d)
        Item embeddings (float64).
    labels : dict of str to numpy.ndarray
        One 1-D array of n labels per semantic factor (class names, ids, 0/1 flags).
        Relevance on a factor is "same label".
    queries, keys : numpy.ndarray of int
        Rows used as queries and as keys. They may be the same rows (every item a query
        against all others), disjoint (a query/key split) or overlap; the pair (i, i)
        never counts.
    tau : float or None
        Temperature of the encoder, used when a protocol is given none.
    name : str
        Shown in the output files.
    """

    embeddings: np.ndarray
    labels: dict
    queries: np.ndarray
    keys: np.ndarray
    tau: float | None = None
    name: str = "collection"

    @classmethod
    def create(cls, embeddings: Any, labels: Any, queries: Any = None, keys: Any = None,
               tau: float | None = None, name: str = "collection") -> "EvalData":
        """Check and assemble an evaluation collection.

        Parameters
        ----------
        embeddings : array-like, shape (n, d)
            Item embeddings (numpy or torch).
        labels : mapping of str to array-like, or pandas.DataFrame
            One label array of length n per factor (a DataFrame: one per column).
        queries, keys : array-like, optional
            Boolean masks or row indices; all rows by default.
        tau : float, optional
            Temperature of the encoder.
        name : str, optional
            Name of the collection.

        Returns
        -------
        EvalData

        Raises
        ------
        ValueError
            For non-2-D, empty or non-finite embeddings, no labels, a label array whose
            length differs from the number of rows or that is not 1-D, bad query/key
            selections, fewer than 2 keys, or a bad ``tau``.
        """
        if hasattr(embeddings, "detach"):
            embeddings = embeddings.detach().cpu().numpy()
        X = np.asarray(embeddings, dtype=np.float64)
        if X.ndim != 2 or X.shape[0] == 0 or X.shape[1] == 0:
            raise ValueError(f"embeddings must be a non-empty (n, d) array, got shape {X.shape}.")
        if not np.isfinite(X).all():
            raise ValueError("embeddings contain NaN or inf.")
        n = X.shape[0]
        if hasattr(labels, "columns") and hasattr(labels, "__getitem__") and not isinstance(labels, Mapping):
            labels = {str(c): labels[c].to_numpy() for c in labels.columns}
        if not isinstance(labels, Mapping) or not labels:
            raise ValueError("labels must be a non-empty mapping of factor name to one label per row.")
        out = {}
        for key, value in labels.items():
            if hasattr(value, "detach"):
                value = value.detach().cpu().numpy()
            arr = np.asarray(value)
            if arr.ndim != 1:
                raise ValueError(f"labels {key!r} must be 1-D (one label per row), got shape {arr.shape}.")
            if arr.shape[0] != n:
                raise ValueError(
                    f"labels {key!r} has {arr.shape[0]} entries but embeddings has {n} rows; "
                    "give one label per row, in the same order."
                )
            out[str(key)] = arr
        q = _as_index(queries, n, "queries")
        k = _as_index(keys, n, "keys")
        if k.size < 2:
            raise ValueError("at least 2 keys are needed for retrieval.")
        if tau is not None:
            tau = float(tau)
            if not math.isfinite(tau) or tau <= 0:
                raise ValueError(f"tau must be a finite number > 0, got {tau!r}.")
        return cls(X, out, q, k, tau, str(name))

    @classmethod
    def from_collection(cls, collection: Any, factors: Sequence[str] | None = None,
                        split_column: str | None = None, name: str | None = None) -> "EvalData":
        """An evaluation collection from an :class:`anchordiv.io.Collection`.

        Parameters
        ----------
        collection : anchordiv.io.Collection
            Embeddings with a metadata table.
        factors : sequence of str, optional
            Metadata columns to use as factors (default: every column except ``caption``,
            ``text``, ``image_path``, ``id`` and ``split_column``).
        split_column : str, optional
            A metadata column whose value ``"query"`` marks queries and ``"key"`` keys
            (``"both"`` marks a row that is both). Without it every row is both.
        name : str, optional
            Name of the collection (default: its path).

        Returns
        -------
        EvalData
        """
        meta = getattr(collection, "metadata", None)
        if meta is None:
            raise ValueError("the collection has no metadata, so no labels; add label columns to it.")
        skip = {"caption", "text", "image_path", "id", split_column}
        cols = list(factors) if factors else [c for c in meta.columns if c not in skip]
        missing = [c for c in cols if c not in meta.columns]
        if missing:
            raise ValueError(f"the collection has no column(s) {missing}; it has {list(meta.columns)}.")
        if not cols:
            raise ValueError("the collection has no label columns.")
        queries = keys = None
        if split_column is not None:
            if split_column not in meta.columns:
                raise ValueError(f"split column {split_column!r} is not in the collection ({list(meta.columns)}).")
            split = meta[split_column].astype(str).to_numpy()
            queries = np.isin(split, ["query", "both"])
            keys = np.isin(split, ["key", "both"])
        return cls.create(collection.embeddings, {c: meta[c].to_numpy() for c in cols}, queries, keys,
                          tau=getattr(collection, "tau", None),
                          name=name or str(getattr(collection, "path", None) or "collection"))


    @property
    def queries_are_keys(self) -> bool:
        """Whether queries and keys are the same rows in the same order (exclude-self retrieval)."""
        return self.queries.shape == self.keys.shape and bool(np.array_equal(self.queries, self.keys))

    def check_factor(self, factor: str) -> str:
        """``factor`` if it is a label of this collection, else a ``ValueError`` naming the choices."""
        if factor not in self.labels:
            raise ValueError(f"unknown factor {factor!r}; this collection has {sorted(self.labels)}.")
        return factor

    def subsample_queries(self, n: int, seed: int = 0) -> "EvalData":
        """A copy with at most ``n`` queries drawn uniformly without replacement (seeded)."""
        if positive_int(n, "n") >= self.queries.size:
            return self
        pick = np.sort(np.random.default_rng(seed).choice(self.queries.size, size=int(n), replace=False))
        return EvalData(self.embeddings, self.labels, self.queries[pick], self.keys, self.tau, self.name)

    def describe(self) -> str:
        """One line: rows, dimension, queries, keys and factors."""
        mode = "queries = keys, self excluded" if self.queries_are_keys else "query/key split"
        return (f"{self.name}: {len(self)} items, d = {self.dim}, {self.queries.size} queries, "
                f"{self.keys.size} keys ({mode}); factors: "
                + ", ".join(f"{f} ({np.unique(v).size} values)" for f, v in self.labels.items()))


def check_anchor_set(anchors: Any, data: EvalData, name: str) -> AnchorSet:
    """``anchors`` as a non-empty :class:`AnchorSet` of the data's dimension."""
    if anchors is None:
        raise ValueError(f"{name} is missing; pass an AnchorSet.")
    if not isinstance(anchors, AnchorSet):
        arr = np.asarray(anchors.detach().cpu() if hasattr(anchors, "detach") else anchors)
        if arr.ndim != 2 or arr.shape[0] == 0:
            raise ValueError(f"{name} is empty; an anchor set needs at least one anchor (shape {arr.shape}).")
        anchors = AnchorSet(arr)
    if len(anchors) == 0:
        raise ValueError(f"{name} is empty; an anchor set needs at least one anchor.")
    if anchors.dim != data.dim:
        raise ValueError(f"{name} has dimension {anchors.dim} but the embeddings have {data.dim}; use one encoder.")
    return anchors


def check_entries(entries: Any, data: EvalData, what: str) -> list[tuple[str, AnchorSet, str]]:
    """``[(name, AnchorSet, factor)]`` from a mapping name → (anchors, factor) or a list of triples."""
    items = [(k, *v) for k, v in entries.items()] if isinstance(entries, Mapping) else list(entries or [])
    if not items:
        raise ValueError(f"{what} is empty; give at least one (name, anchors, factor).")
    out = []
    for item in items:
        if len(item) != 3:
            raise ValueError(f"each {what} entry must be (name, anchors, factor), got {item!r}.")
        name, anchors, factor = item
        out.append((str(name), check_anchor_set(anchors, data, f"{what}[{name!r}]"), data.check_factor(factor)))
    return out


# --------------------------------------------------------------------- geometries
def check_models(models: Iterable[str], allowed: Sequence[str] = ALL_MODELS, what: str = "model") -> list[str]:
    """Model names, checked against ``allowed``; duplicates dropped, order kept."""
    if isinstance(models, str):
        models = [models]
    out: list[str] = []
    for m in models:
        if m not in allowed:
            raise ValueError(f"unknown {what} {m!r}; choose from {', '.join(allowed)}.")
        if m not in out:
            out.append(m)
    return out


def resolve_tau(tau: float | None, data: EvalData, models: Iterable[str]) -> float | None:
    """The temperature: ``tau``, else the collection's (:func:`anchordiv.models.default_tau`)."""
    return default_tau(list(models), tau, data.tau)


def build_geometry(name: str, tau: float | None, n_anchors: int, dim: int,
                   model_params: Mapping[str, Mapping[str, Any]] | None = None, seed: int = 0,
                   clip: bool = True) -> Any:
    """An unfitted geometry from its registry name, with per-model parameters.

    Parameters
    ----------
    name : str
        Registry name (see :func:`anchordiv.make_model`).
    tau : float or None
        Temperature of the anchor models.
    n_anchors : int
        Number of anchors it will be fitted on.
    dim : int
        Embedding dimension.
    model_params : mapping, optional
        ``{name: {param: value}}``, e.g. ``{"gmm": {"n_components": 8}}``.
    seed : int, optional
        Seed of the GMM's k-means++ initialisation (unless ``model_params`` sets one).
    clip : bool, optional
        Fit what the anchors allow: a GMM gets at most ``n_anchors`` components and an
        integer latent rank at most ``min(n_anchors - 1, dim)`` (a covariance of n
        anchors has rank at most n - 1). When False the parameters are used as given.

    Returns
    -------
    Geometry
        Not fitted.
    """
    from ..models import make_model

    params = dict((model_params or {}).get(name, {}))
    if name in model_names(takes_temperature=True) and "tau" not in params and "logit_scale" not in params:
        params["tau"] = tau
    if name == "gmm":
        params.setdefault("seed", int(seed))
        if clip:
            given = params.get("n_components", registry()["gmm"]().n_components)
            params["n_components"] = max(1, min(int(given), int(n_anchors)))
    if name.startswith("latent_") and clip:
        rank = params.get("rank", 0.95)
        if isinstance(rank, numbers.Integral) and not isinstance(rank, bool):
            params["rank"] = max(1, min(int(rank), int(n_anchors) - 1, int(dim)))
    return make_model(name, **params)


def min_anchors(name: str) -> int:
    """Fewest anchors a geometry of this name can be fitted on."""
    return int(getattr(registry()[name], "min_anchors", 1))


# ------------------------------------------------------------------------- scoring
def _distances(geometry: Any, Q: np.ndarray, key_psi: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Distances of a block of queries to all keys (:func:`anchordiv.exact.distance_matrix`)
    and the size of the terms of each row, ``|o_i| + max_j |φ_i·ψ_j|``."""
    q, _ = geometry._input(Q, "Q")
    offsets, phi = geometry._query_terms(q.to(key_psi.dtype), True)
    D = distance_matrix(offsets, phi, key_psi, n_keys=key_psi.shape[0])
    scale = offsets.abs() + (offsets[:, None] - D).abs().amax(1)
    return D.cpu().numpy(), scale.cpu().numpy()


#: Significant digits kept, relative to the size of the terms of each query's distances.
TIE_DIGITS = 9


def _merge_noise_ties(D: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Round row i of ``D`` to multiples of ``scale[i]·10^-TIE_DIGITS``.

    ``scale`` is the size of the terms whose difference gives the distances, so values
    that differ only by floating-point cancellation noise become exact ties, which
    average precision ranks as a block instead of in an order set by rounding (a softmax
    geometry of one anchor is 0 for every pair; a rank-1 latent spherical geometry
    takes two values).
    """
    s = scale.copy()
    s[~(s > 0)] = 1.0
    return np.round(D / s[:, None], TIE_DIGITS)


def score(geometry: Any, data: EvalData, factors: Sequence[str], queries: np.ndarray | None = None,
          memory_budget: int = SCORE_MEMORY_BUDGET) -> dict[str, np.ndarray]:
    """Per-query average precision of a fitted geometry on each factor.

    Parameters
    ----------
    geometry : Geometry
        A fitted geometry (lower is closer); keys are ranked by its symmetrized
        divergence (paper §5.1).
    data : EvalData
        The collection.
    factors : sequence of str
        Factors to score; relevance on a factor is "same label".
    queries : numpy.ndarray, optional
        Row indices of the queries (default: ``data.queries``).
    memory_budget : int, optional
        Bytes of the float64 query-key distances held at once.

    Returns
    -------
    dict of str to numpy.ndarray
        For each factor, one AP per query (NaN for a query without a relevant key).

    Notes
    -----
    Distances come from :func:`anchordiv.exact.distance_matrix` in float64. Each
    query's distances are then rounded to 9 digits relative to the size of the terms
    they are computed from (:func:`_merge_noise_ties`), so that distances equal up to
    floating-point noise are ties, ranked as a block by average precision rather than in
    an order set by rounding. A query that is also a key never retrieves itself: the pair
    is given an infinite distance and no relevance, which leaves every AP as it would be
    without that key (an irrelevant item ranked after every relevant one adds nothing).
    """
    factors = [data.check_factor(f) for f in factors]
    q_idx = data.queries if queries is None else np.asarray(queries)
    k_idx = data.keys
    X = data.embeddings
    step = max(1, min(q_idx.size, int(memory_budget) // (8 * max(1, k_idx.size))))
    k, _ = geometry._input(X[k_idx], "G")
    key_psi = geometry._key_terms(k, True)
    key_pos = {int(r): j for j, r in enumerate(k_idx)}
    out = {f: np.empty(q_idx.size) for f in factors}
    for start in range(0, q_idx.size, step):
        rows = q_idx[start:start + step]
        D, term_scale = _distances(geometry, X[rows], key_psi)
        D = _merge_noise_ties(D, term_scale)
        self_cols = np.array([key_pos.get(int(r), -1) for r in rows])
        own = np.flatnonzero(self_cols >= 0)
        D[own, self_cols[own]] = np.inf
        for f in factors:
            lab = data.labels[f]
            rel = lab[rows][:, None] == lab[k_idx][None, :]
            rel[own, self_cols[own]] = False
            out[f][start:start + step] = mean_average_precision(D, rel).per_query
    return out


def mean_auprc(geometry: Any, embeddings: Any, labels: Any, factors: Sequence[str] | None = None) -> dict[str, float]:
    """Mean AUPRC on each factor with every item a query against all others (the demo's table).

    The same computation as the evaluation protocols (:func:`score`).
    """
    data = EvalData.create(embeddings, labels)
    per_query = score(geometry, data, list(data.labels) if factors is None else factors)
    return {f: float(np.nanmean(v)) for f, v in per_query.items()}


def fit_score(name: str, anchors: AnchorSet | None, data: EvalData, factors: Sequence[str], tau: float | None,
              model_params: Mapping | None, seed: int, prior: Any = None, clip_n: int | None = None):
    """Fit geometry ``name`` on ``anchors`` and :func:`score` it; None when there are too few anchors.

    ``cosine`` needs no anchors. With ``prior`` (a fitted broad geometry) the fit is the
    posterior update ``fit(anchors, prior=prior)`` (paper §4, App. D); ``clip_n`` is then
    the anchor count the parameters are clipped to (:func:`build_geometry`).
    """
    if name == "cosine":
        return score(build_geometry("cosine", tau, 0, data.dim), data, factors)
    support = anchors.support()
    n = len(support)
    if prior is None and n < min_anchors(name):
        return None
    if prior is not None and n < int(getattr(prior, "min_target_anchors", 1)):
        return None
    geometry = build_geometry(name, tau, clip_n if clip_n is not None else n, data.dim, model_params, seed)
    if prior is None:
        geometry.fit(support)
    else:
        geometry.fit(support, prior=prior)
    return score(geometry, data, factors)


# --------------------------------------------------------------------------- misc
def progress_bar(total: int, desc: str, progress: bool | None):
    """A tqdm bar (shown on a terminal when ``progress`` is None)."""
    from .._progress import progress_bar as bar

    return bar(total=total, desc=desc, show=progress)


def honours_progress(protocol):
    """Run ``protocol`` so that ``progress=False`` silences every bar it opens, nested ones included."""
    import functools

    from .._progress import progress_scope

    @functools.wraps(protocol)
    def run(*args, **kwargs):
        with progress_scope(kwargs.get("progress")):
            return protocol(*args, **kwargs)

    return run


def check_seed(seed: Any) -> int:
    """``seed`` as a non-negative int."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}.")
    return int(seed)


def draw_seed(seed: int, *parts: int) -> int:
    """A deterministic derived seed for draw ``parts`` of a run seeded by ``seed``."""
    return int(np.random.SeedSequence([int(seed), *map(int, parts)]).generate_state(1)[0])


def subsample(anchors: AnchorSet, fraction_or_n: float | int | None, seed: int) -> AnchorSet:
    """A random subset: a fraction in (0, 1], or a count; None or 1.0 keeps every anchor."""
    if fraction_or_n is None:
        return anchors
    if isinstance(fraction_or_n, numbers.Integral) and not isinstance(fraction_or_n, bool):
        n = int(fraction_or_n)
    else:
        f = float(fraction_or_n)
        if not 0 < f <= 1:
            raise ValueError(f"anchor_fraction must be in (0, 1], got {fraction_or_n!r}.")
        if f == 1.0:
            return anchors
        n = max(1, int(round(f * len(anchors))))
    n = min(n, len(anchors))
    return anchors.subsample(n, seed=seed)


class Timer:
    """Wall time since creation, in seconds."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0


def environment() -> dict:
    """Versions of the packages that shape the numbers."""
    import platform

    import torch

    from .. import __version__

    return {"anchordiv": __version__, "source_sha256": source_fingerprint(), "numpy": np.__version__,
            "torch": torch.__version__, "python": platform.python_version(), "torch_threads": torch.get_num_threads()}


def run_config(protocol: str, data: EvalData | None, seconds: float, verdicts: Sequence[str], **params: Any) -> dict:
    """The ``<protocol>.json`` record: parameters, wall time, package versions, the collection's sizes, verdicts."""
    cfg = {"protocol": protocol, **params, "seconds": round(seconds, 3), "environment": environment()}
    if data is not None:
        cfg["data"] = {"name": data.name, "n_items": len(data), "dim": data.dim, "n_queries": int(data.queries.size),
                       "n_keys": int(data.keys.size), "queries_are_keys": data.queries_are_keys,
                       "factors": {f: int(np.unique(v).size) for f, v in data.labels.items()}}
    cfg["verdicts"] = list(verdicts)
    return cfg


def source_fingerprint() -> str:
    """First 12 hex digits of a SHA-256 over the package's ``.py`` files (paths and contents).

    Identifies the code that produced a result when the package version does not change.
    """
    import hashlib

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]
