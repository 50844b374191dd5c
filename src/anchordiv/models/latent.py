"""Latent low-rank anchor models: latent Gaussian and latent spherical (paper §3, App. B.3, B.4, C),
and their matrix-Bingham adaptation (App. D.3, D.4)."""

from __future__ import annotations

import numbers

import numpy as np
import torch

import math

from .._backend import in_dtype
from ..anchors import AnchorSet
from ..special import bessel_ratio, log_vmf_normalizer
from ..linalg import row_norms, symmetric_eigh, unit_rows, weighted_mean_cov
from .base import EuclideanModel
from .params import Param
from .posterior import MatrixBingham, PosteriorMixin, check_positive


def select_rank(eigenvalues: torch.Tensor, rank: int | float, dim: int) -> int:
    """k from ``rank``: an int k, or the smallest k explaining a fraction ``rank`` of the variance.

    ``eigenvalues`` are sorted in descending order.
    """
    if isinstance(rank, bool) or not isinstance(rank, numbers.Real):
        raise ValueError(f"rank must be an int k in [1, {dim}] or a float in (0, 1], got {rank!r}.")
    if isinstance(rank, numbers.Integral):
        if not 1 <= int(rank) <= dim:
            raise ValueError(f"rank={rank} is out of range; pass an int k in [1, {dim}] or a float in (0, 1].")
        return int(rank)
    if not 0.0 < float(rank) <= 1.0:
        raise ValueError(f"rank={rank} is out of range; a float rank is a variance fraction in (0, 1].")
    ratio = torch.cumsum(eigenvalues.clamp_min(0), 0) / eigenvalues.clamp_min(0).sum()
    k = int(torch.searchsorted(ratio, torch.tensor([float(rank) - 1e-12], dtype=ratio.dtype)).item()) + 1
    return min(k, dim)


def principal_subspace(cov: torch.Tensor, rank: int | float) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Top eigenvectors of a covariance: (components (k, d), all eigenvalues descending, k)."""
    eigenvalues, eigenvectors = symmetric_eigh(cov)
    eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)
    if float(eigenvalues.clamp_min(0).sum()) <= 0:
        raise ValueError("The anchors have zero variance (all identical); a subspace needs at least 2 distinct anchors.")
    k = select_rank(eigenvalues, rank, cov.shape[0])
    return eigenvectors[:, :k].T.clone(memory_format=torch.contiguous_format), eigenvalues, k


class _LatentSubspace(PosteriorMixin, EuclideanModel):
    """Shared fit of the latent models: U = top-k eigenvectors of the anchor covariance (eq. C.3).

    With a prior, the matrix-Bingham update of App. D.3/D.4: A = α U_b U_bᵀ from the broad
    subspace, A_post = A + β Cov̂(Γ_target), U_post = top-k eigenvectors of A_post. Subclasses
    give β (``_posterior_beta``).
    """

    min_anchors = 2
    min_target_anchors = 2
    #: k, or a variance fraction; n anchors have a covariance of rank at most n − 1.
    RANK = Param("rank", "rank", 0.95, "Subspace dimension k, or the variance fraction in (0, 1] it explains.",
                 at_most=lambda n_anchors, dim: min(n_anchors - 1, dim))
    ALPHA = Param("alpha", "float", 50.0, "Posterior: α > 0, strength of the Bingham prior.", low=0, low_open=True)
    _min_target_reason = (
        "the Bingham update uses the target covariance, which a single anchor does not define."
    )
    _prior_shared_params = ("rank",)
    _posterior_attributes = ("prior_", "posterior_", "beta_")

    def _fit(self, anchors: AnchorSet) -> None:
        self.mean_, cov = weighted_mean_cov(anchors.embeddings, anchors.weights)
        self._set_subspace(*principal_subspace(cov, self.rank))

    def _set_subspace(self, components: torch.Tensor, eigenvalues: torch.Tensor, k: int) -> None:
        # a compact copy: a slice of the d × d eigenvector matrix would keep all of it alive
        self.components_ = components.clone(memory_format=torch.contiguous_format)
        self.n_components_ = k
        total = eigenvalues.clamp_min(0).sum()
        self.explained_variance_ = eigenvalues[:k].clamp_min(0)
        self.explained_variance_ratio_ = self.explained_variance_ / total

    # -------------------------------------------------------------- posterior
    def _check_posterior_params(self, dim: int) -> None:
        check_positive("alpha", self.alpha)

    def _posterior_beta(self, n: int, cov: torch.Tensor) -> float:
        raise NotImplementedError

    def _fit_posterior(self, target: AnchorSet, prior: "_LatentSubspace", hyper: None = None) -> None:
        mean, cov = weighted_mean_cov(target.embeddings, target.weights)
        beta = self._posterior_beta(len(target), cov)
        k = prior.n_components_
        posterior = MatrixBingham.from_subspace(prior.components_, self.alpha).update(cov, beta)
        components, _ = posterior.mode(k)
        self.mean_ = mean
        self.beta_ = beta
        self.posterior_ = posterior
        self._set_subspace(components, torch.ones(k, dtype=cov.dtype, device=cov.device), k)
        # variance of the target anchors along each posterior direction
        self.explained_variance_ = ((components @ cov) * components).sum(1).clamp_min(0)
        self.explained_variance_ratio_ = self.explained_variance_ / torch.trace(cov)

    @property
    def natural_dim_(self) -> int:
        return self.n_components_

    def _flops_per_row(self) -> float:
        return 2.0 * self.dim_ * self.n_components_

    def _project(self, X: torch.Tensor) -> torch.Tensor:
        return X @ in_dtype(self.components_, X.dtype).T


class LatentGaussian(_LatentSubspace):
    """Latent Gaussian anchor model: z ~ N(0, I_k) realised as γ = μ + Uz.

    .. math::

        \\eta(\\lambda) = U^\\top\\lambda/\\tau, \\quad \\kappa(\\eta) = \\tfrac12\\|\\eta\\|^2, \\quad
        d(\\lambda_1\\|\\lambda_2) = \\frac{1}{2\\tau^2}\\|U^\\top(\\lambda_1-\\lambda_2)\\|^2.

    Reference: Kannan, Park, Veitch (2026), Prop. 7 (eq. B.24), App. C.

    **Posterior adaptation** (``fit(target, prior=broad)``, App. D.3, hyperparameters of
    App. E.5). Under the ambient surrogate N(μ, UUᵀ + εI), a matrix Bingham prior
    p(U) ∝ exp(tr(UᵀAU)) centred on the broad subspace is conjugate for U:

    .. math::

        A = \\alpha\\, U_b U_b^\\top, \\qquad
        A_\\mathrm{post} = A + \\beta\\,\\widehat{\\mathrm{Cov}}(\\Gamma_\\mathrm{target}), \\qquad
        \\beta = \\frac n2\\left(\\frac1\\varepsilon - \\frac1{1+\\varepsilon}\\right),

        U_\\mathrm{post} = \\arg\\max_{U \\in \\mathrm{St}(d,k)} \\operatorname{tr}(U^\\top A_\\mathrm{post} U)
        = \\text{top-}k \\text{ eigenvectors of } A_\\mathrm{post} \\ \\text{(MAP)}.

    Cov̂ is the (1/n, weighted) covariance of the n target anchors, which needs at least 2
    of them. k is the broad model's: ``rank`` is applied to the broad anchors. With the
    default ε = 1e-8, β ≈ 5·10⁷ n, so the directions in which the target anchors vary take
    over the subspace and the broad subspace fills the remaining k − rank(Cov̂) directions.
    ``mean_`` is the target mean (the centring of Cov̂); it does not enter the divergence.

    Parameters
    ----------
    rank : int or float, default 0.95
        k, or the smallest k whose eigenvalues explain this fraction of the anchor variance
        (of the broad anchors when adapting).
    tau, logit_scale : float
        Temperature, or its inverse. Give exactly one.
    alpha : float, default 50
        α > 0, strength of the Bingham prior (App. E.5).
    eps : float, default 1e-8
        ε > 0, isotropic regularisation of the ambient surrogate (App. E.5).

    Attributes
    ----------
    components_ : torch.Tensor (k, d)
        Uᵀ: the top-k eigenvectors of the anchor covariance (of A_post when adapted), as rows.
    mean_, explained_variance_, explained_variance_ratio_, n_components_
        For an adapted model, the explained variance is that of the target anchors along
        each posterior direction, and its ratio is relative to their total variance.
    prior_ : LatentGaussian
        The broad fit (adapted models only).
    posterior_ : MatrixBingham
        The posterior, with ``parameter`` A_post (adapted models only).
    beta_ : float
        β of the update (adapted models only).
    """

    PARAMS = (_LatentSubspace.RANK, _LatentSubspace.ALPHA,
              Param("eps", "float", 1e-8, "Posterior: ε > 0, regularisation of the ambient surrogate.", low=0,
                    low_open=True))
    color = "#d62728"

    def __init__(self, *, rank: int | float = 0.95, tau: float | None = None, logit_scale: float | None = None,
                 alpha: float = 50.0, eps: float = 1e-8):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.rank = rank
        self.alpha = alpha
        self.eps = eps

    def _check_posterior_params(self, dim: int) -> None:
        super()._check_posterior_params(dim)
        check_positive("eps", self.eps)

    def _posterior_beta(self, n: int, cov: torch.Tensor) -> float:
        eps = float(self.eps)
        return n / 2 * (1 / eps - 1 / (1 + eps))

    def _natural_params(self, X: torch.Tensor) -> torch.Tensor:
        return self._project(X) / self.tau_

    def _grad(self, eta: torch.Tensor) -> torch.Tensor:
        return eta

    def _embed(self, X: torch.Tensor) -> torch.Tensor:
        return self._project(X) / (self.tau_ * math.sqrt(2))

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return 0.5 * (eta * eta).sum(1), eta


class LatentSpherical(_LatentSubspace):
    """Latent spherical anchor model: z ~ Unif(S^{k-1}) realised as γ = μ + Uz.

    .. math::

        \\eta(\\lambda) = \\frac{1}{\\tau}\\frac{U^\\top\\lambda}{\\|U^\\top\\lambda\\|}, \\quad
        \\kappa(\\eta) = c_k(\\|\\eta\\|), \\quad
        \\nabla\\kappa(\\eta) = A_k(\\|\\eta\\|)\\frac{\\eta}{\\|\\eta\\|},

        d(\\lambda_1\\|\\lambda_2) = \\frac1\\tau A_k\\!\\left(\\frac1\\tau\\right)
            \\left(1 - \\cos(U^\\top\\lambda_1, U^\\top\\lambda_2)\\right),

    with :math:`c_k` the von Mises–Fisher log-normaliser and
    :math:`A_k(r) = I_{k/2}(r)/I_{k/2-1}(r)` (finite for large k and small τ; see
    :mod:`anchordiv.special`). Undefined where Uᵀλ = 0, which raises a ``ValueError``.
    Reference: Kannan, Park, Veitch (2026), Prop. 8 (eq. B.34–B.35), App. C.

    **Posterior adaptation** (``fit(target, prior=broad)``, App. D.4, hyperparameters of
    App. E.5). The posterior-like matrix Bingham update of :class:`LatentGaussian` with a
    free β:

    .. math::

        A_\\mathrm{post} = \\alpha\\, U_b U_b^\\top + \\beta\\,\\widehat{\\mathrm{Cov}}(\\Gamma_\\mathrm{target}),
        \\qquad U_\\mathrm{post} = \\text{top-}k \\text{ eigenvectors of } A_\\mathrm{post},

        \\beta = \\frac{4\\,\\alpha\\, n}{\\operatorname{tr}\\widehat{\\mathrm{Cov}}(\\Gamma_\\mathrm{target})}
        \\quad \\text{(default, } \\texttt{beta=None}\\text{)}.

    The paper leaves β free. The default writes β Cov̂ = 4αn Ĉ with Ĉ = Cov̂/tr Cov̂ of unit
    trace, against α U_bU_bᵀ of trace αk: the broad subspace weighs as much as k/4 target
    anchors, and a target direction holding a fraction f of the target variance overtakes a
    broad direction once 4nf > 1. It grows with n like the latent Gaussian's β and does not
    depend on the embedding scale or dimension; the factor 4 was chosen by measurement
    (docs/latent_spherical_beta.md). A number ``beta`` ≥ 0 fixes β (β = 0 keeps the broad subspace). Cov̂ needs at least 2 target
    anchors.

    Parameters
    ----------
    rank, tau, logit_scale, alpha
        As in :class:`LatentGaussian`.
    beta : float, optional
        β ≥ 0 of the update; ``None`` (default) means 4αn / tr Cov̂(Γ_target).

    Attributes
    ----------
    components_, mean_, explained_variance_, explained_variance_ratio_, n_components_
        As in :class:`LatentGaussian`.
    prior_ : LatentSpherical
    posterior_ : MatrixBingham
    beta_ : float
        As in :class:`LatentGaussian` (adapted models only).
    """

    #: Factor c of the default β = c·α·n / tr Cov̂(Γ_target).
    default_beta_factor = 4.0

    PARAMS = (_LatentSubspace.RANK, _LatentSubspace.ALPHA,
              Param("beta", "float", None, "Posterior: β ≥ 0 of the update (default 4αn / tr Cov̂).", low=0))
    color = "#9467bd"

    def __init__(self, *, rank: int | float = 0.95, tau: float | None = None, logit_scale: float | None = None,
                 alpha: float = 50.0, beta: float | None = None):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.rank = rank
        self.alpha = alpha
        self.beta = beta

    def _check_posterior_params(self, dim: int) -> None:
        super()._check_posterior_params(dim)
        if self.beta is not None:
            check_positive("beta", self.beta, allow_zero=True)

    def _posterior_beta(self, n: int, cov: torch.Tensor) -> float:
        if self.beta is not None:
            return float(self.beta)
        return self.default_beta_factor * float(self.alpha) * n / float(torch.trace(cov))

    def _natural_params(self, X: torch.Tensor) -> torch.Tensor:
        # η depends on the direction of λ only: project λ/‖λ‖, so no norm over- or underflows
        p = self._project(unit_rows(X, "X"))
        zero = row_norms(p) <= torch.finfo(X.dtype).eps
        if bool(zero.any()):
            rows = torch.nonzero(zero).flatten()[:5].tolist()
            raise ValueError(
                f"X rows {rows} project to zero on the latent subspace (Uᵀλ = 0), where the latent "
                "spherical divergence is undefined; drop those rows or use latent_gaussian."
            )
        return unit_rows(p, "X") / self.tau_

    def _embed(self, X: torch.Tensor) -> torch.Tensor:
        r = 1.0 / self.tau_
        scale = math.sqrt(r * float(bessel_ratio(self.n_components_, r)) / 2)
        return self._natural_params(X) * (self.tau_ * scale)

    def _bessel(self, fn, r: torch.Tensor) -> torch.Tensor:
        r_np = r.detach().cpu().double().numpy()
        if r_np.size and np.ptp(r_np) <= 1e-12 * max(1.0, float(r_np.max())):
            values = np.full_like(r_np, fn(self.n_components_, float(r_np[0])))
        else:
            values = np.asarray(fn(self.n_components_, r_np), dtype=np.float64)
        return torch.as_tensor(values, device=r.device).to(r.dtype)

    def _grad(self, eta: torch.Tensor) -> torch.Tensor:
        r = eta.norm(dim=1)
        safe = torch.where(r > 0, r, torch.ones_like(r))
        scale = torch.where(r > 0, self._bessel(bessel_ratio, safe) / safe, torch.full_like(r, 1.0 / self.n_components_))
        return eta * scale[:, None]

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._bessel(log_vmf_normalizer, eta.norm(dim=1)), self._grad(eta)
