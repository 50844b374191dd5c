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
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from .._util import positive_int
from .._util import EmbeddingRows
from ..anchors import AnchorSet
from ..models import default_tau, model_names, registry
from ..models.base import check_tau
from ..metrics import get_metric
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
    "multilabel_cells",
    "match_labels",
    "positive_value",
    "metric_scope",
]

#: The paper's anchor-distribution models (they take a temperature): the protocols' default
#: model sets. Installed plug-ins are accepted wherever their tags fit (:func:`check_models`).
ANCHOR_MODELS = model_names(anchor_model=True, builtin=True)
#: Models with a posterior update ``fit(target, prior=broad)`` (paper §4, App. D): the
#: parametric anchor models of §3.
POSTERIOR_MODELS = model_names(accepts_prior=True, builtin=True)
PARAMETRIC = POSTERIOR_MODELS
#: Reference geometries (paper §5.1): cosine (no anchors) and image-text inversion.
BASELINES = model_names(anchor_model=False, builtin=True)
#: Every built-in registry name.
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
    multilabels : dict of str to numpy.ndarray
        Multi-label factors: one tuple of labels per row (:func:`multilabel_cells`).
        A label ``L`` of factor ``f`` is scored as the 0/1 factor ``"f=L"``
        (:meth:`flag_factor`).
    """

    embeddings: np.ndarray
    labels: dict
    queries: np.ndarray
    keys: np.ndarray
    tau: float | None = None
    name: str = "collection"
    multilabels: dict = field(default_factory=dict)

    @classmethod
    def create(cls, embeddings: Any, labels: Any, queries: Any = None, keys: Any = None,
               tau: float | None = None, name: str = "collection", multilabel: Sequence[str] = (),
               sep: str = "|") -> "EvalData":
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
        multilabel : sequence of str, optional
            Factors whose cells hold several labels: ``sep``-separated strings or lists
            (:func:`multilabel_cells`).
        sep : str, optional
            Separator of the labels in a multi-label string cell.

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
        multilabel = [multilabel] if isinstance(multilabel, str) else list(multilabel)
        unknown = sorted(set(multilabel) - set(map(str, labels)))
        if unknown:
            raise ValueError(f"multilabel names {unknown}, which are not factors; the factors are "
                             f"{sorted(map(str, labels))}.")
        out, multi = {}, {}
        for key, value in labels.items():
            if str(key) in multilabel:
                cells = multilabel_cells(value, sep, name=f"labels {key!r}")
                if cells.shape[0] != n:
                    raise ValueError(f"labels {key!r} has {cells.shape[0]} entries but embeddings has {n} rows; "
                                     "give one cell per row, in the same order.")
                multi[str(key)] = cells
                continue
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
            tau = check_tau(tau)
        return cls(X, out, q, k, tau, str(name), multi)

    @classmethod
    def from_collection(cls, collection: Any, factors: Sequence[str] | None = None,
                        split_column: str | None = None, name: str | None = None, multilabel: Sequence[str] = (),
                        sep: str = "|") -> "EvalData":
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
        multilabel, sep : optional
            As in :meth:`create`.

        Returns
        -------
        EvalData
        """
        meta = getattr(collection, "metadata", None)
        if meta is None:
            raise ValueError("the collection has no metadata, so no labels; add label columns to it.")
        skip = {"caption", "text", "image_path", "id", split_column, getattr(collection, "item_column", None)}
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
                          name=name or str(getattr(collection, "path", None) or "collection"),
                          multilabel=multilabel, sep=sep)


    @property
    def queries_are_keys(self) -> bool:
        """Whether queries and keys are the same rows in the same order (exclude-self retrieval)."""
        return self.queries.shape == self.keys.shape and bool(np.array_equal(self.queries, self.keys))

    def check_factor(self, factor: str) -> str:
        """``factor`` if it is a label of this collection, else a ``ValueError`` naming the choices."""
        if factor not in self.labels:
            raise ValueError(f"unknown factor {factor!r}; this collection has {sorted(self.labels)}"
                             + (f" and the multi-label factors {sorted(self.multilabels)}" if self.multilabels
                                else "") + ".")
        return factor

    def label_names(self, factor: str) -> list[str]:
        """The labels of multi-label factor ``factor``, sorted."""
        if factor not in self.multilabels:
            raise ValueError(f"{factor!r} is not a multi-label factor; the multi-label factors are "
                             f"{sorted(self.multilabels)} (pass multilabel=[{factor!r}] when creating the data).")
        return sorted({label for cell in self.multilabels[factor] for label in cell})

    def flag_factor(self, factor: str, label: str) -> tuple["EvalData", str]:
        """A copy with the 0/1 factor ``"factor=label"`` (the rows carrying ``label``) and its name.

        Scored in the per-label setting (:func:`positive_value`), its queries are the
        items carrying the label and the relevant keys are the other items carrying it.
        """
        if label not in self.label_names(factor):
            raise ValueError(f"{factor!r} has no label {label!r}; its labels are {self.label_names(factor)}.")
        name = f"{factor}={label}"
        flags = np.fromiter((label in cell for cell in self.multilabels[factor]), bool, len(self))
        return replace(self, labels={**self.labels, name: flags}), name

    def resolve_factor(self, factor: str, set_name: str, what: str = "factor") -> tuple["EvalData", str]:
        """``(data, factor)`` of an entry: a factor as it is; a multi-label factor ``f`` becomes
        ``"f=L"`` for the label ``L`` matching ``set_name`` (:func:`match_labels`), and
        ``"f=L"`` picks label ``L`` explicitly (matched the same way)."""
        if factor in self.labels:
            return self, factor
        base, eq, label = factor.partition("=")
        if base in self.multilabels:
            want = label if eq else set_name
            found = match_labels([want], self.label_names(base), arg=what).get(want)
            if found is None:
                raise ValueError(f"{what}: no label of {base!r} matches {want!r} (ignoring case, spaces and "
                                 f"underscores); its labels are {self.label_names(base)}. Map it explicitly "
                                 f"with {base}=LABEL (CLI: --anchors FILE:SET=LABEL).")
            return self.flag_factor(base, found)
        return self, self.check_factor(factor)

    def subsample_queries(self, n: int, seed: int = 0) -> "EvalData":
        """A copy with at most ``n`` queries drawn uniformly without replacement (seeded)."""
        if positive_int(n, "n") >= self.queries.size:
            return self
        pick = np.sort(np.random.default_rng(seed).choice(self.queries.size, size=int(n), replace=False))
        return replace(self, queries=self.queries[pick])

    def describe(self) -> str:
        """One line: rows, dimension, queries, keys and factors."""
        mode = "queries = keys, self excluded" if self.queries_are_keys else "query/key split"
        return (f"{self.name}: {len(self)} items, d = {self.dim}, {self.queries.size} queries, "
                f"{self.keys.size} keys ({mode}); factors: "
                + ", ".join([f"{f} ({np.unique(v).size} values)" for f, v in self.labels.items()
                             if f.partition("=")[0] not in self.multilabels]
                            + [f"{f} ({len(self.label_names(f))} labels, multi-label)" for f in self.multilabels]))


def multilabel_cells(values: Any, sep: str = "|", name: str = "labels") -> np.ndarray:
    """One tuple of labels per row: ``sep``-separated strings (CSV) or lists (parquet).

    Labels are stripped; an empty or missing cell has no label.
    """
    if not isinstance(sep, str) or not sep:
        raise ValueError(f"sep must be a non-empty string, got {sep!r}; e.g. '|'.")
    out = np.empty(len(values), dtype=object)
    for i, cell in enumerate(values):
        if isinstance(cell, str):
            parts = cell.split(sep)
        elif cell is None or (isinstance(cell, float) and math.isnan(cell)):
            parts = []
        elif isinstance(cell, (list, tuple, set, frozenset, np.ndarray)):
            parts = [str(x) for x in cell]
        else:
            raise ValueError(f"{name}: row {i} holds {cell!r}; a multi-label cell is a {sep!r}-separated string "
                             "or a list of labels.")
        out[i] = tuple(sorted({p.strip() for p in parts if p.strip()}))
    return out


def _label_key(name: str) -> str:
    return "".join(ch for ch in str(name).casefold() if ch not in " _")


def match_labels(names: Sequence[str], labels: Sequence[str], mapping: Mapping[str, str] | None = None,
                 arg: str = "names") -> dict[str, str]:
    """``{name: label}`` pairing each of ``names`` with the label equal to it ignoring case,
    spaces and underscores, or as ``mapping`` says; names without a match are left out.

    Raises ValueError when a mapping targets an unknown label or a name matches two labels.
    """
    by_key: dict[str, list[str]] = {}
    for label in labels:
        by_key.setdefault(_label_key(label), []).append(label)
    out = {}
    for name in names:
        if mapping and name in mapping:
            target = mapping[name]
            found = target if target in labels else (by_key.get(_label_key(target)) or [None])[0]
            if found is None:
                raise ValueError(f"{arg}: {name!r} is mapped to {target!r}, which is not a label; the labels are "
                                 f"{sorted(labels)}.")
            out[name] = found
            continue
        hits = by_key.get(_label_key(name), [])
        if len(hits) > 1:
            raise ValueError(f"{arg}: {name!r} matches the labels {hits}; map it to one explicitly.")
        if hits:
            out[name] = hits[0]
    return out


def positive_value(values: Any) -> Any:
    """The positive value of a 0/1 factor (True, 1, "1", "true", "yes" beside their negatives), else None.

    The per-label setting of the paper's Tables 2 and 3 scores a 0/1 factor on the queries
    with the positive value, relevance being "also positive".
    """
    uniq = np.unique(np.asarray(values))
    if uniq.size == 0 or uniq.size > 2:
        return None
    if uniq.dtype == bool:
        return True if True in uniq.tolist() else None
    if np.issubdtype(uniq.dtype, np.number):
        return uniq[uniq == 1][0] if set(uniq.tolist()) <= {0, 1} and (uniq == 1).any() else None
    text = {str(v).strip().lower(): v for v in uniq.tolist()}
    for neg, pos in (("0", "1"), ("false", "true"), ("no", "yes")):
        if set(text) <= {neg, pos} and pos in text:
            return text[pos]
    return None


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


def _entry_items(entries: Any, what: str) -> list[tuple]:
    items = [(k, *v) for k, v in entries.items()] if isinstance(entries, Mapping) else list(entries or [])
    if not items:
        raise ValueError(f"{what} is empty; give at least one (name, anchors, factor).")
    for item in items:
        if len(item) != 3:
            raise ValueError(f"each {what} entry must be (name, anchors, factor), got {item!r}.")
    return items


def check_entries(entries: Any, data: EvalData, what: str) -> list[tuple[str, AnchorSet, str]]:
    """``[(name, AnchorSet, factor)]`` from a mapping name → (anchors, factor) or a list of triples."""
    out = [(str(name), check_anchor_set(anchors, data, f"{what}[{name!r}]"), data.check_factor(factor))
           for name, anchors, factor in _entry_items(entries, what)]
    names = [n for n, _, _ in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{what} names {dup} more than once; give each entry its own name.")
    return out


def resolve_entries(entries: Any, data: EvalData, what: str) -> tuple[EvalData, list[tuple[str, AnchorSet, str]]]:
    """:func:`check_entries` where a factor may also be a multi-label factor ``f`` (the label
    matching the entry's name) or ``"f=LABEL"`` (:meth:`EvalData.resolve_factor`); returns the
    data with the 0/1 factors of those labels and the entries naming them."""
    resolved = []
    for name, anchors, factor in _entry_items(entries, what):
        data, f = data.resolve_factor(str(factor), str(name), f"{what}[{str(name)!r}]")
        resolved.append((name, anchors, f))
    return data, check_entries(resolved, data, what)


# --------------------------------------------------------------------- geometries
def check_models(models: Iterable[str], allowed: Sequence[str] | Mapping[str, bool] | None = None,
                 what: str = "model") -> list[str]:
    """Model names, checked against ``allowed``; duplicates dropped, order kept.

    ``allowed`` is a list of names, a mapping of :class:`~anchordiv.models.Tags` that the
    registered geometries must have (``{"anchor_model": True}``), or None for every
    registered geometry; the registry is read at call time, so plug-ins count.
    """
    if isinstance(models, str):
        models = [models]
    if allowed is None or isinstance(allowed, Mapping):
        allowed = model_names(**(allowed or {}))
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
        Fit what the anchors allow: every declared parameter with an ``at_most`` bound
        (:class:`anchordiv.models.Param`) is clipped to it, e.g. a GMM gets at most
        ``n_anchors`` components and an integer latent rank is at most
        ``min(n_anchors - 1, dim)`` (a covariance of n anchors has rank at most n - 1).
        When False the parameters are used as given. A declared seed parameter that
        ``model_params`` does not set gets ``seed``.

    Returns
    -------
    Geometry
        Not fitted.
    """
    from ..models import make_model, model_params as declared

    params = dict((model_params or {}).get(name, {}))
    if registry()[name].tags().takes_temperature and "tau" not in params and "logit_scale" not in params:
        params["tau"] = tau
    for key, p in declared(name).items():
        if p.seed:
            params.setdefault(key, int(seed))
        if clip and p.at_most is not None:
            value = params.get(key, p.default)
            clipped = p.clip(value, n_anchors, dim)
            if key in params or clipped != value:
                params[key] = clipped
    return make_model(name, **params)


def min_anchors(name: str) -> int:
    """Fewest anchors a geometry of this name can be fitted on."""
    return int(getattr(registry()[name], "min_anchors", 1))


# ------------------------------------------------------------------------- scoring
def _distances(geometry: Any, Q: np.ndarray, key_psi: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Distances of a block of queries to all keys (:func:`anchordiv.exact.distance_matrix`)
    and the size of the terms of each row, ``|o_i| + max_j |φ_i·ψ_j|``."""
    q, _ = geometry.check_input(Q, "Q")
    offsets, phi = geometry.query_terms(q.to(key_psi.dtype), True, compute_dtype=True)  # the compute dtype of the keys
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
          memory_budget: int = SCORE_MEMORY_BUDGET, metric: str | None = None) -> dict[str, np.ndarray]:
    """Per-query average precision (or ``metric``) of a fitted geometry on each factor.

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
    metric : str, optional
        A name of :func:`anchordiv.metrics.get_metric` (``"recall@10"``, ``"ndcg@10"``,
        ...); default the one of :func:`metric_scope`, ``"auprc"`` outside one.

    Returns
    -------
    dict of str to numpy.ndarray
        For each factor, one value per query (NaN for a query without a relevant key).

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
    per_query = get_metric(metric or current_metric())
    q_idx = data.queries if queries is None else np.asarray(queries)
    k_idx = data.keys
    X = data.embeddings
    step = max(1, min(q_idx.size, int(memory_budget) // (8 * max(1, k_idx.size))))
    k, _ = geometry.check_input(X[k_idx], "G")
    key_psi = geometry.key_terms(k, True, compute_dtype=True)  # float64 where float32 cannot resolve the geometry
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
            out[f][start:start + step] = per_query(D, rel)
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

    A geometry that needs no anchors (``cosine``) is fitted on None. With ``prior`` (a fitted
    broad geometry) the fit is the posterior update ``fit(anchors, prior=prior)`` (paper §4,
    App. D); ``clip_n`` is then the anchor count the parameters are clipped to
    (:func:`build_geometry`).
    """
    if not registry()[name].tags().needs_anchors:
        return score(build_geometry(name, tau, 0, data.dim, model_params, seed).fit(None), data, factors)
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
def progress_bar(total: int, desc: str, progress: bool | str | None):
    """A tqdm bar (shown on a terminal when ``progress`` is None), or a line per step for ``"log"``."""
    from .._progress import progress_bar as bar

    return bar(total=total, desc=desc, show=progress)


_METRIC: ContextVar[str] = ContextVar("anchordiv_eval_metric", default="auprc")


def current_metric() -> str:
    """The per-query metric of the protocol running now (``"auprc"`` by default)."""
    return _METRIC.get()


@contextmanager
def metric_scope(metric: str | None):
    """Score with ``metric`` (a :func:`anchordiv.metrics.get_metric` name) inside the block."""
    if metric is None:
        yield current_metric()
        return
    name = str(metric).strip().lower()
    get_metric(name)  # a ValueError names the choices
    token = _METRIC.set(name)
    try:
        yield name
    finally:
        _METRIC.reset(token)


def honours_progress(protocol):
    """Run ``protocol`` so that ``progress=False`` silences every bar it opens, nested ones included
    (``progress="log"`` prints a line per step of the protocol instead, and no bar), and
    ``metric=NAME`` (a :func:`anchordiv.metrics.get_metric` name, default ``"auprc"``) replaces AP
    as the per-query score everywhere in it; the result's value columns are then named after the
    metric."""
    import functools

    from .._progress import check_progress, progress_scope

    @functools.wraps(protocol)
    def run(*args, metric: str | None = None, **kwargs):
        if "progress" in kwargs:
            kwargs["progress"] = check_progress(kwargs["progress"])
        with progress_scope(kwargs.get("progress")), metric_scope(metric):
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
        cfg["metric"] = current_metric()
        cfg["data"] = {"name": data.name, "n_items": len(data), "dim": data.dim, "n_queries": int(data.queries.size),
                       "n_keys": int(data.keys.size), "queries_are_keys": data.queries_are_keys,
                       "factors": {f: int(np.unique(v).size) for f, v in data.labels.items()},
                       **({"multilabel_factors": {f: len(data.label_names(f)) for f in data.multilabels}}
                          if data.multilabels else {})}
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
