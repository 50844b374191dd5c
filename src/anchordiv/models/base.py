"""Shared machinery for every geometry: divergences, symmetrization, feature maps, batching.

Every anchor divergence is determined by per-vector statistics
s(λ) = (η(λ), κ(η(λ)), ∇κ(η(λ))) (Kannan, Park, Veitch 2026, eq. 2.2 and App. F.4):

.. math::

    d(\\lambda_1 \\| \\lambda_2) = B_\\kappa(\\eta_2 \\| \\eta_1)
        = \\kappa(\\eta_2) - \\kappa(\\eta_1) - \\nabla\\kappa(\\eta_1)^\\top(\\eta_2 - \\eta_1),

    d_\\mathrm{sym}(q, g) = \\tfrac12[d(q\\|g) + d(g\\|q)]
        = \\tfrac12 (\\eta_q - \\eta_g)^\\top(\\nabla\\kappa(\\eta_q) - \\nabla\\kappa(\\eta_g))
        \\quad\\text{(eq. F.1)}.

Both are inner products between a query map and a key map, which is what makes exact
search one matrix product and lets any inner-product index serve any anchor geometry.
A model states only its natural-parameter map η(λ), κ, ∇κ and its fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch

from .._util import TAU_RANGE, check_tau  # noqa: F401  (re-exported: one τ range everywhere)
from .._backend import Kind, all_finite, as_tensor, check_dim, concat, in_dtype, row_chunks
from .._progress import progress_bar
from ..anchors import AnchorSet
from .params import Param

#: Estimated floating-point work above which a progress bar is shown (≈ a few seconds).
PROGRESS_FLOPS = 5e10




def temperature(tau: Any = None, logit_scale: Any = None) -> float:
    """τ from exactly one of ``tau`` and ``logit_scale`` (τ = 1/logit_scale), checked by :func:`check_tau`."""
    if (tau is None) == (logit_scale is None):
        raise ValueError(
            "Give exactly one of tau= or logit_scale= (τ = 1/logit_scale), "
            f"got tau={tau!r}, logit_scale={logit_scale!r}."
        )
    if tau is not None:
        return check_tau(tau)
    lo, hi = TAU_RANGE
    try:
        scale = float(logit_scale)
    except (TypeError, ValueError):
        scale = math.nan
    if isinstance(logit_scale, bool) or not 1 / hi <= scale <= 1 / lo:
        raise ValueError(f"logit_scale must be a number in [{1 / hi:g}, {1 / lo:g}] (τ = 1/logit_scale in "
                         f"[{lo:g}, {hi:g}]), got {logit_scale!r}.")
    return 1.0 / scale


def require_finite(values: torch.Tensor, geometry: Any = None, what: str = "distances") -> torch.Tensor:
    """``values`` when every entry is finite; otherwise a ``ValueError`` naming the cause.

    With τ in :data:`TAU_RANGE` and finite inputs, a non-finite feature or distance means the
    vectors are too large for the dtype: |d| grows like ‖λ‖/τ or ‖λ‖²/τ², past float32's 3.4e38.
    ``geometry`` (optional) names the model and its τ in the message.
    """
    if all_finite(values):
        return values
    raise overflow_error(geometry, what, values.dtype)


def overflow_error(geometry: Any, what: str, dtype: torch.dtype) -> ValueError:
    """The error of :func:`require_finite`: ``what`` of ``geometry`` overflow ``dtype``."""
    tau = getattr(geometry, "tau_", None)
    model = f"{type(geometry).__name__} " if geometry is not None else ""
    overflow = f"{model}{what} overflow {str(dtype).removeprefix('torch.')}"
    lo, hi = TAU_RANGE
    if isinstance(tau, float) and not lo <= tau <= hi:
        return ValueError(f"{overflow}: tau={tau:g} is outside [{lo:g}, {hi:g}]; refit the model with a tau in range.")
    at = f" at tau={tau:g}" if tau is not None else ""
    return ValueError(f"{overflow}: the vectors are too large{at}; normalise the embeddings to unit norm "
                      "(as encoders give them) or pass float64 arrays.")


def prepare_anchors(anchors: Any, model: str, needed: int = 1) -> AnchorSet:
    """The fit prologue of every geometry fitted on anchors: an :class:`AnchorSet` of the
    anchors with positive weight, at least ``needed`` of them."""
    if not isinstance(anchors, AnchorSet):
        anchors = AnchorSet(anchors)
    anchors = anchors.support()
    if len(anchors) < needed:
        raise ValueError(
            f"{model} needs at least {needed} anchors with positive weight, "
            f"got {len(anchors)}; add anchors or use another model."
        )
    return anchors


class NotFittedError(RuntimeError):
    """Raised when a model is used before ``fit``."""


@dataclass(frozen=True)
class Tags:
    """What a geometry is, read by generic code (CLI choices, experiment model sets, checks).

    Classes state their tags with the class method ``tags()``, each refining its parent's,
    in the manner of scikit-learn's estimator tags.
    """

    #: An anchor-distribution model (a CGF κ), rather than a baseline.
    anchor_model: bool = False
    #: ``fit`` needs anchors.
    needs_anchors: bool = False
    #: Takes ``tau=`` / ``logit_scale=``.
    takes_temperature: bool = False
    #: ``fit(target, prior=broad)`` is a posterior update (paper §4).
    accepts_prior: bool = False
    #: The divergence is a squared Euclidean distance of an embedding.
    euclidean: bool = False
    #: The anchor measure itself (no parametric family): its statistics cost grows with the anchors.
    nonparametric: bool = False
    #: How a distance d reads as a similarity: ``"divergence"`` exp(−d) for d ≥ 0, ``"cosine"`` 1 − d
    #: (a cosine), ``"iti"`` −d (an inner product with a unit vector).
    similarity: str = "divergence"


@dataclass(frozen=True)
class FeatureBound:
    """A lower bound on a divergence read from one block of the features:

    .. math::

        d(q, g) \\ge w\\,\\lVert u(q) - u(g)\\rVert^2, \\qquad
        u(g) = \\psi(g)[\\text{key}], \\quad u(q) = s\\,\\phi(q)[\\text{query}],

    with ``weight`` w, ``query_scale`` s. ``error`` bounds ‖û − u‖ for u computed in float32
    (:meth:`Geometry.feature_bound`). Certificates of approximate indexes bound unseen keys by
    it (an index cell whose u lie in a ball of radius ρ around m is at least
    w·(‖u(q) − m‖ − ρ)² away)."""

    key: slice
    query: slice
    query_scale: float
    weight: float
    error: float = 0.0

    def keys(self, psi):
        """u(g) of key features ``psi`` (rows)."""
        return psi[..., self.key]

    def queries(self, phi):
        """u(q) of query features ``phi`` (rows)."""
        return self.query_scale * phi[..., self.query]


class Geometry:
    """Base class of every geometry (anchor models and baselines). Lower means closer.

    Subclasses implement the hooks ``_query_terms`` and ``_key_terms`` on checked tensors;
    this class turns them into the public ``query_terms``, ``key_terms``, ``pairwise``,
    ``query_features``, ``key_features`` and ``query_offsets``, which satisfy the
    feature-map contract

    .. math::

        \\mathrm{pairwise}(Q, G)_{ij} = o(q_i) - \\phi(q_i)^\\top \\psi(g_j),

    with ``(o, φ) = query_terms(Q)`` and ``ψ = key_terms(G)``.

    A class declares its constructor parameters in ``PARAMS`` (:class:`Param`; the
    temperature excepted), which the command line, the service and the experiments read.
    """

    #: Rows processed per chunk when computing per-vector statistics.
    batch_size: int = 4096
    #: The constructor's parameters (the temperature excepted), read by generic code.
    PARAMS: ClassVar[tuple[Param, ...]] = ()
    #: The colour of this geometry in the experiments' plots (None: one derived from its name).
    color: ClassVar[str | None] = None

    @classmethod
    def tags(cls) -> Tags:
        """The capabilities of this class (see :class:`Tags`)."""
        return Tags()

    # ------------------------------------------------------------ subclass API
    def _query_terms(self, Q: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook: (o(q), φ(q)) of checked compute tensor rows ``Q`` (see :meth:`query_terms`)."""
        raise NotImplementedError

    def _key_terms(self, G: torch.Tensor, symmetric: bool) -> torch.Tensor:
        """Hook: ψ(g) of checked compute tensor rows ``G`` (see :meth:`key_terms`)."""
        raise NotImplementedError

    def _key_terms_in_dtype(self, G: torch.Tensor, symmetric: bool) -> torch.Tensor:
        """Hook: ψ(g) computed in the dtype of ``G`` throughout, without the float64 steps some
        geometries take for accuracy (``key_terms(..., precise=False)``); by default :meth:`_key_terms`."""
        return self._key_terms(G, symmetric)

    def key_error_bound(self, dtype: torch.dtype, symmetric: bool = True) -> float:
        """A bound on ‖ψ̂(g) − ψ(g)‖ for ψ̂ = ``key_terms(g, precise=False)`` computed in ``dtype``
        (‖g‖ ≤ :data:`INPUT_NORM`), beyond what the float32 rounding bound
        4(m + 2)·u·(|o(q)| + ‖φ(q)‖·max‖ψ‖) of :func:`anchordiv.testing.float32_rounding` covers.

        0 for geometries whose precise and in-dtype features are the same computation.
        """
        return 0.0

    def feature_bound(self, symmetric: bool = True) -> FeatureBound | None:
        """A :class:`FeatureBound` d(q, g) ≥ w‖u(q) − u(g)‖² on this geometry's features, or None
        (no such bound known): lets indexes certify results without scanning every key."""
        return None

    def _divergence(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # ------------------------------------------------------------- plumbing
    def _is_fitted(self) -> bool:
        return hasattr(self, "dim_")

    def _check_fitted(self) -> None:
        if not self._is_fitted():
            raise NotFittedError(
                f"This {type(self).__name__} is not fitted yet; call .fit(anchors) before using it."
            )

    @property
    def device(self) -> torch.device:
        return getattr(self, "device_", torch.device("cpu"))

    def _input(self, X: Any, name: str) -> tuple[torch.Tensor, Kind]:
        self._check_fitted()
        t, kind = as_tensor(X, name, device=self.device)
        check_dim(t, self.dim_, name)
        return t, kind

    def _flops_per_row(self) -> float:
        return 0.0

    #: Largest input norm the analytic bounds allow (unit-norm embeddings, with rounding slack).
    INPUT_NORM = 1.01

    def key_norm_bound(self, symmetric: bool = True) -> float | None:
        """An upper bound on ‖ψ(g)‖ for every input with ‖g‖ ≤ :data:`INPUT_NORM`, or None.

        Approximate indexes use it as the fixed constant M of the MIPS→L2 augmentation.
        """
        return None

    def _chunks(self, n: int, desc: str):
        chunks = list(row_chunks(n, self.batch_size))
        show = len(chunks) > 1 and n * self._flops_per_row() > PROGRESS_FLOPS
        return progress_bar(chunks, show=show, desc=desc)

    # ------------------------------------------------------------ public API
    def check_input(self, X: Any, name: str = "X") -> tuple[torch.Tensor, Kind]:
        """``X`` as a checked compute tensor on the model's device (2-D, finite, of the fitted
        dimension) and the :class:`~anchordiv._backend.Kind` that hands results back as given."""
        return self._input(X, name)

    def query_terms(self, Q: Any, symmetric: bool = True, *, compute_dtype: bool = False) -> tuple[Any, Any]:
        """(o(q), φ(q)) in one pass over the statistics, such that
        d(q, g) = o(q) − φ(q)ᵀψ(g) with ψ = :meth:`key_terms`.

        Numpy in, numpy out; torch in, torch out (same device). Use it instead of
        :meth:`query_offsets` and :meth:`query_features` when both are needed. With
        ``compute_dtype=True`` the terms keep the dtype they were computed in (float64 where
        the input's float32 cannot resolve them, e.g. near one-hot softmaxes) instead of the
        input's; search and indexes rank in that dtype.
        """
        t, kind = self._input(Q, "Q")
        offsets, phi = self._query_terms(t, symmetric)
        if compute_dtype:
            kind = replace(kind, dtype=phi.dtype)
        return kind.out(offsets), kind.out(phi)

    def key_terms(self, G: Any, symmetric: bool = True, *, compute_dtype: bool = False, precise: bool = True) -> Any:
        """ψ(g), the key feature map: d(q, g) = o(q) − φ(q)ᵀψ(g) (see :meth:`query_terms`,
        also for ``compute_dtype``).

        ``precise=False`` computes in the input's dtype throughout (softmax: one float32 GEMM of
        logits and float32 element-wise work instead of float64 log-probabilities), for builds
        whose searches re-rank exactly; the extra error is at most :meth:`key_error_bound`.
        """
        t, kind = self._input(G, "G")
        psi = self._key_terms(t, symmetric) if precise else self._key_terms_in_dtype(t, symmetric)
        return kind.out(psi) if not compute_dtype else replace(kind, dtype=psi.dtype).out(psi)

    def query_features(self, Q: Any, symmetric: bool = True) -> Any:
        """Query feature map φ(q) of the inner-product form (see class docstring)."""
        t, kind = self._input(Q, "Q")
        return kind.out(self._query_terms(t, symmetric)[1])

    def query_offsets(self, Q: Any, symmetric: bool = True) -> Any:
        """Query offsets o(q) of the inner-product form (see class docstring)."""
        t, kind = self._input(Q, "Q")
        return kind.out(self._query_terms(t, symmetric)[0])

    def key_features(self, G: Any, symmetric: bool = True) -> Any:
        """Key feature map ψ(g) of the inner-product form (see class docstring)."""
        t, kind = self._input(G, "G")
        return kind.out(self._key_terms(t, symmetric))

    def pairwise(self, Q: Any, G: Any, symmetric: bool = True) -> Any:
        """The (|Q|, |G|) matrix of d(q‖g), or of ½[d(q‖g) + d(g‖q)] when ``symmetric``.

        Computed as ``query_offsets(Q)[:, None] - query_features(Q) @ key_features(G).T``,
        with the key features made block by block (:func:`anchordiv.exact.distance_matrix`).
        """
        from ..exact import distance_matrix, key_feature_blocks, prepare

        q, g, kind = prepare(self, Q, G)
        offsets, phi = self._query_terms(q, symmetric)
        blocks = (psi for _, psi in key_feature_blocks(self, g, symmetric, width=phi.shape[1]))
        D = distance_matrix(offsets, phi, blocks, n_keys=g.shape[0], keys_given=False)
        return kind.out(require_finite(D, self, "distances"))

    def divergence(self, X: Any, Y: Any) -> Any:
        """Row-wise d(x_i ‖ y_i) for paired rows of ``X`` and ``Y`` (length-n vector)."""
        x, kind = self._input(X, "X")
        y, _ = self._input(Y, "Y")
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"X has {x.shape[0]} rows but Y has {y.shape[0]}; divergence pairs rows one to one.")
        if x.dtype != y.dtype:
            dtype = torch.promote_types(x.dtype, y.dtype)
            x, y = x.to(dtype), y.to(dtype)
        return kind.out(require_finite(self._divergence(x, y), self, "divergences"))

    def search(self, Q: Any, G: Any, k: int = 10, symmetric: bool = True, exclude_self: bool = False,
               memory_budget: int | None = None, progress: bool | None = None,
               exclude: Any = None) -> tuple[Any, Any]:
        """Exact top-k: ``(distances, indices)``, each (|Q|, k), sorted ascending.

        See :func:`anchordiv.exact.search`; ties are broken by the lower gallery index.
        """
        from ..exact import DEFAULT_MEMORY_BUDGET, search

        d, i = search(self, Q, G, k=k, symmetric=symmetric, exclude_self=exclude_self,
                      memory_budget=DEFAULT_MEMORY_BUDGET if memory_budget is None else memory_budget,
                      progress=progress, exclude=exclude)
        require_finite(torch.as_tensor(d), self, "distances")
        return d, i

    def to(self, device: Any) -> "Geometry":
        """Move fitted tensors to ``device`` (in place) and return self."""
        device = torch.device(device)
        for key, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor):
                setattr(self, key, value.to(device))
        if self._is_fitted():
            self.device_ = device
        return self

    # scikit-learn style parameter access
    def get_params(self, deep: bool = True) -> dict:
        import inspect

        sig = inspect.signature(type(self).__init__)
        return {p: getattr(self, p) for p in sig.parameters if p != "self"}

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items() if v is not None)
        return f"{type(self).__name__}({params})"


class AnchorModel(Geometry):
    """An anchor-distribution model: a CGF κ on natural parameters η(λ).

    Subclasses implement ``_fit``, ``_cgf_and_grad`` (and optionally ``_grad``) and,
    for latent models, ``_natural_params``. Everything else is shared.

    The symmetric feature maps are written in λ units and centred on c = ∇κ(0)
    (``center_``), which leaves eq. F.1 unchanged and keeps every feature O(1) for
    unit-norm inputs (in η units they grow like 1/τ):

    .. math::

        d_\\mathrm{sym}(q, g) = \\frac{1}{2\\tau}(\\lambda'_q - \\lambda'_g)^\\top(\\mu'_q - \\mu'_g),
        \\qquad \\lambda' = \\tau\\eta - c,\\ \\mu' = \\nabla\\kappa(\\eta) - c,

    so o(q) = λ'_qᵀμ'_q/2τ, φ(q) = [λ'_q, μ'_q, 1]/2τ and ψ(g) = [μ'_g, λ'_g, −λ'_gᵀμ'_g].

    Parameters
    ----------
    tau : float, optional
        Temperature τ > 0 of the contrastive model.
    logit_scale : float, optional
        Inverse temperature (CLIP's ``logit_scale.exp()``); τ = 1/logit_scale.
        Give exactly one of ``tau`` and ``logit_scale``.
    """

    #: Smallest number of anchors the fit needs.
    min_anchors: int = 1

    @classmethod
    def tags(cls) -> Tags:
        return replace(super().tags(), anchor_model=True, needs_anchors=True, takes_temperature=True)

    def __init__(self, *, tau: float | None = None, logit_scale: float | None = None):
        self.tau = tau
        self.logit_scale = logit_scale

    # ---------------------------------------------------------------- fitting
    def _resolve_tau(self) -> float:
        return temperature(self.tau, self.logit_scale)

    #: Completes the error message when a model without a posterior update is given a prior.
    _no_prior_hint: str = ""

    def fit(self, anchors: Any, prior: Any = None) -> "AnchorModel":
        """Fit the anchor distribution to ``anchors`` (an :class:`AnchorSet` or an (N, d) array).

        Models with a posterior update (``tags().accepts_prior``) also take ``prior``; see
        :class:`anchordiv.models.posterior.PosteriorMixin`. Returns self.
        """
        if prior is not None:
            raise ValueError(f"{type(self).__name__} takes no prior.{self._no_prior_hint}")
        anchors = self._begin_fit(anchors, self.min_anchors)
        self._fit(anchors)
        return self._end_fit(anchors)

    def _begin_fit(self, anchors: Any, needed: int) -> AnchorSet:
        """The shared prologue: the temperature, the anchors, cleared caches."""
        tau = self._resolve_tau()
        anchors = prepare_anchors(anchors, type(self).__name__, needed)
        self.tau_ = tau
        self.n_anchors_ = len(anchors)
        self.device_ = anchors.device
        self.anchor_texts_ = list(anchors.texts) if anchors.texts else None
        return anchors

    def _end_fit(self, anchors: AnchorSet) -> "AnchorModel":
        self.dim_ = anchors.dim
        if not self.tags().euclidean:  # c = ∇κ(0), the mean of the anchor distribution
            zero = torch.zeros(1, self.natural_dim_, dtype=torch.float64, device=self.device_)
            self.center_ = self._grad(zero)[0]
        return self

    def _fit(self, anchors: AnchorSet) -> None:
        raise NotImplementedError

    def explain(self, X: Any, top: int = 5) -> Any:
        """Each item's softmax over the fitted anchors: entropy, effective number, top anchors
        (:func:`anchordiv.diagnostics.explain`). Needs the anchor measure (softmax); for another
        model call ``anchordiv.diagnostics.explain(anchors, X, tau=model.tau_)``."""
        from ..diagnostics import explain

        self._check_fitted()
        if getattr(self, "anchors_", None) is None:
            raise ValueError(f"{type(self).__name__} keeps no anchors; call anchordiv.diagnostics.explain(anchors, X, "
                             f"tau={self.tau_:g}) with the anchor set it was fitted on.")
        return explain(self.anchors_, X, self.tau_, top=top, texts=self.anchor_texts_,
                       log_weights=self.log_weights_)

    # ----------------------------------------------------- model-specific math
    def _natural_params(self, X: torch.Tensor) -> torch.Tensor:
        """η(λ) = λ/τ for ambient models; latent models override."""
        return X / self.tau_

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _grad(self, eta: torch.Tensor) -> torch.Tensor:
        return self._cgf_and_grad(eta)[1]

    @property
    def natural_dim_(self) -> int:
        """Dimension of the natural parameter η (d, or k for latent models)."""
        return self.dim_

    # ------------------------------------------------ per-vector statistics
    def _stats(self, X: torch.Tensor, need_cgf: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(η, κ(η) or None, ∇κ(η)) for the rows of X, chunked over rows."""
        etas, cgfs, grads = [], [], []
        for sl in self._chunks(X.shape[0], desc=f"{type(self).__name__} statistics"):
            eta = self._natural_params(X[sl])
            if need_cgf:
                k, g = self._cgf_and_grad(eta)
                cgfs.append(k)
            else:
                g = self._grad(eta)
            etas.append(eta)
            grads.append(g)
        return concat(etas), (concat(cgfs) if need_cgf else None), concat(grads)

    def _grad_norm_bound(self) -> float | None:
        """A bound on ‖∇κ(η(λ))‖ for ‖λ‖ ≤ :data:`INPUT_NORM`, or None (then no analytic M)."""
        return None

    def key_norm_bound(self, symmetric: bool = True) -> float | None:
        """For ψ = [μ', λ', −λ'ᵀμ']: ‖ψ‖² ≤ B² + L² + B²L² with L = R + ‖c‖, B = ‖∇κ‖max + ‖c‖."""
        grad = self._grad_norm_bound()
        if not symmetric or grad is None or self.tags().euclidean:
            return None
        c = float(self.center_.norm())
        L, B = self.INPUT_NORM + c, grad + c
        return math.sqrt(B * B + L * L + (B * L) ** 2)

    def _centred(self, eta: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(τη − c, ∇κ − c) with c = ``center_``: O(1) vectors for unit-norm inputs."""
        c = in_dtype(self.center_, g.dtype)
        return self.tau_ * eta - c, g - c

    def _query_terms(self, Q: torch.Tensor, symmetric: bool):
        eta, k, g = self._stats(Q, need_cgf=not symmetric)
        if symmetric:
            lam, mu = self._centred(eta, g)
            half = 0.5 / self.tau_
            offsets, phi = half * (lam * mu).sum(1), half * torch.cat([lam, mu, torch.ones_like(mu[:, :1])], dim=1)
        else:
            offsets, phi = (eta * g).sum(1) - k, torch.cat([g, torch.ones_like(g[:, :1])], dim=1)
        return require_finite(offsets, self, "query offsets"), require_finite(phi, self, "query features")

    def _key_terms(self, G: torch.Tensor, symmetric: bool) -> torch.Tensor:
        eta, k, g = self._stats(G, need_cgf=not symmetric)
        if symmetric:
            lam, mu = self._centred(eta, g)
            psi = torch.cat([mu, lam, -(lam * mu).sum(1, keepdim=True)], dim=1)
        else:
            psi = torch.cat([eta, -k[:, None]], dim=1)
        return require_finite(psi, self, "key features")

    def _divergence(self, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
        eta_x, k_x, g_x = self._stats(X, need_cgf=True)
        eta_y, k_y, _ = self._stats(Y, need_cgf=True)
        return k_y - k_x - (g_x * (eta_y - eta_x)).sum(1)

    # ---------------------------------------------------------- public math
    def natural_params(self, X: Any) -> Any:
        """η(λ): λ/τ for ambient models, the latent map of App. B for latent models."""
        t, kind = self._input(X, "X")
        return kind.out(concat([self._natural_params(t[sl]) for sl in row_chunks(t.shape[0], self.batch_size)]))

    def _eta_input(self, eta: Any) -> tuple[torch.Tensor, Kind]:
        self._check_fitted()
        t, kind = as_tensor(eta, "eta", device=self.device)
        check_dim(t, self.natural_dim_, "eta")
        return t, kind

    def cgf(self, eta: Any) -> Any:
        """κ(η), the cumulant generating function of the fitted anchor distribution."""
        t, kind = self._eta_input(eta)
        return kind.out(concat([self._cgf_and_grad(t[sl])[0] for sl in row_chunks(t.shape[0], self.batch_size)]))

    def grad_cgf(self, eta: Any) -> Any:
        """∇κ(η), the mean of the exponentially tilted anchor distribution."""
        t, kind = self._eta_input(eta)
        return kind.out(concat([self._grad(t[sl]) for sl in row_chunks(t.shape[0], self.batch_size)]))


class EuclideanModel(AnchorModel):
    """A model whose divergence is a squared Euclidean distance, d(x‖y) = ‖z(x) − z(y)‖².

    Symmetric, so ``symmetric`` has no effect. Its feature maps are (k+1)-dimensional:
    o(q) = ‖z_q‖², φ(q) = [2 z_q, −1], ψ(g) = [z_g, ‖z_g‖²], and any L2 index on z serves it.
    Subclasses implement ``_embed``.
    """

    @classmethod
    def tags(cls) -> Tags:
        return replace(super().tags(), euclidean=True)

    def _embed(self, X: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def euclidean_embedding(self, X: Any) -> Any:
        """z(λ) such that d(λ1‖λ2) = ‖z(λ1) − z(λ2)‖²."""
        t, kind = self._input(X, "X")
        return kind.out(concat([self._embed(t[sl]) for sl in row_chunks(t.shape[0], self.batch_size)]))

    def _embedding(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z and ‖z‖², checked ‖z‖² ≤ max/4 of the dtype, so that every ‖z_q‖² − 2z_qᵀz_g + ‖z_g‖²
        and its partial sums are finite."""
        z = concat([self._embed(X[sl]) for sl in self._chunks(X.shape[0], "embedding")])
        sq = (z * z).sum(1)
        if not bool((sq <= torch.finfo(sq.dtype).max / 4).all()):  # NaN fails too
            raise overflow_error(self, "squared distances", sq.dtype)
        return z, sq

    def _query_terms(self, Q: torch.Tensor, symmetric: bool):
        z, sq = self._embedding(Q)
        return sq, torch.cat([2 * z, -torch.ones_like(z[:, :1])], dim=1)

    def _key_terms(self, G: torch.Tensor, symmetric: bool) -> torch.Tensor:
        z, sq = self._embedding(G)
        return torch.cat([z, sq[:, None]], dim=1)
