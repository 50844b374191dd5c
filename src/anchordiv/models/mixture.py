"""Gaussian mixture anchor model (paper §3, App. B.5, C, E.5) and its Dirichlet–NIW adaptation (App. D.5)."""

from __future__ import annotations

import math

import torch

from .._backend import in_dtype, positive_int
from ..anchors import AnchorSet
from .base import AnchorModel
from .params import Param
from .posterior import (NormalInverseWishart, PosteriorMixin, check_positive, dirichlet_update, niw_hyperparameters,
                        niw_update, target_counts)

_EPS = torch.finfo(torch.float64).eps


def kmeans_labels(X: torch.Tensor, w: torch.Tensor, n_clusters: int, seed: int, max_iter: int = 100) -> torch.Tensor:
    """Weighted k-means (Lloyd) with k-means++ seeding; returns hard labels.

    Random draws use a CPU generator so that CPU and GPU runs pick the same seeds.
    """
    gen = torch.Generator().manual_seed(int(seed))

    def draw(p: torch.Tensor) -> int:
        p = p.double().cpu()
        if float(p.sum()) <= 0:
            p = w.double().cpu()
        return int(torch.multinomial(p / p.sum(), 1, generator=gen))

    centers = [X[draw(w)]]
    d2 = ((X - centers[0]) ** 2).sum(1)
    for _ in range(1, n_clusters):
        centers.append(X[draw(w * d2)])
        d2 = torch.minimum(d2, ((X - centers[-1]) ** 2).sum(1))
    C = torch.stack(centers)
    labels = None
    for _ in range(max_iter):
        new = torch.cdist(X, C).argmin(1)
        if labels is not None and torch.equal(new, labels):
            break
        labels = new
        onehot = torch.nn.functional.one_hot(labels, n_clusters).to(X.dtype) * w[:, None]
        mass = onehot.sum(0)
        filled = mass > 0
        C = torch.where(filled[:, None], (onehot.T @ X) / mass.clamp_min(_EPS)[:, None], C)
    return labels


def m_step(X: torch.Tensor, w: torch.Tensor, resp: torch.Tensor, reg_covar: float):
    """Weighted M-step: (weights, means, covariances + reg·I, effective counts N_m)."""
    rw = resp * w[:, None]
    nk = rw.sum(0) + 10 * _EPS
    means = (rw.T @ X) / nk[:, None]
    d = X.shape[1]
    covs = torch.empty(resp.shape[1], d, d, dtype=X.dtype, device=X.device)
    eye = torch.eye(d, dtype=X.dtype, device=X.device)
    for m in range(resp.shape[1]):
        diff = X - means[m]
        covs[m] = (diff * rw[:, m:m + 1]).T @ diff / nk[m] + reg_covar * eye
    return nk / nk.sum(), means, covs, nk


def gaussian_log_density(X: torch.Tensor, means: torch.Tensor, covs: torch.Tensor, chunk: int = 16384) -> torch.Tensor:
    """(n, M) matrix of log N(x_i; μ_m, Σ_m), through Cholesky factors."""
    n, d = X.shape
    chol = torch.linalg.cholesky(covs)
    logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    out = torch.empty(n, means.shape[0], dtype=X.dtype, device=X.device)
    for start in range(0, n, chunk):
        x = X[start:start + chunk]
        for m in range(means.shape[0]):
            z = torch.linalg.solve_triangular(chol[m], (x - means[m]).T, upper=False)
            out[start:start + chunk, m] = -0.5 * ((z * z).sum(0) + d * math.log(2 * math.pi) + logdet[m])
    return out


def e_step(X: torch.Tensor, w: torch.Tensor, weights: torch.Tensor, means: torch.Tensor, covs: torch.Tensor):
    """Responsibilities and the weighted mean log-likelihood Σ_i w_i log p(x_i)."""
    log_prob = gaussian_log_density(X, means, covs) + weights.log()
    norm = torch.logsumexp(log_prob, dim=1)
    return torch.exp(log_prob - norm[:, None]), float(w @ norm)


def em(X: torch.Tensor, w: torch.Tensor, resp: torch.Tensor, reg_covar: float, tol: float, max_iter: int):
    """EM for a full-covariance Gaussian mixture from initial responsibilities.

    Stops when the mean log-likelihood improves by less than ``tol`` or after
    ``max_iter`` iterations. Returns (weights, means, covariances, n_iter, converged, ll).
    """
    weights, means, covs, _ = m_step(X, w, resp, reg_covar)
    previous, converged, n_iter, ll = -math.inf, False, 0, -math.inf
    for n_iter in range(1, max_iter + 1):
        resp, ll = e_step(X, w, weights, means, covs)
        weights, means, covs, _ = m_step(X, w, resp, reg_covar)
        if abs(ll - previous) < tol:
            converged = True
            break
        previous = ll
    return weights, means, covs, n_iter, converged, ll


class GaussianMixture(PosteriorMixin, AnchorModel):
    """Gaussian-mixture anchor distribution q = Σ_m π_m N(μ_m, Σ_m), fitted by EM.

    .. math::

        \\kappa(\\eta) = \\log\\sum_m \\pi_m \\exp\\left(\\mu_m^\\top\\eta + \\tfrac12\\eta^\\top\\Sigma_m\\eta\\right),
        \\qquad \\nabla\\kappa(\\eta) = \\sum_m r_m(\\eta)(\\mu_m + \\Sigma_m\\eta),

    with r_m(η) the softmax of the log-sum-exp terms; d(λ1‖λ2) = B_κ(λ2/τ‖λ1/τ).
    EM uses full covariances, weighted k-means with k-means++ seeding for the initial
    labels, ``reg_covar``·I added to every covariance, and stops when the mean
    log-likelihood improves by less than ``tol`` or after ``max_iter`` iterations
    (App. E.5). It runs in float64 torch on the anchors' device.
    Reference: Kannan, Park, Veitch (2026), Prop. 9 (eq. B.47–B.48), App. C, E.5.

    **Posterior adaptation** (``fit(target, prior=broad)``, App. D.5, hyperparameters of
    App. E.5). The broad M-component fit (π_b, μ_b, Σ_b) sets a symmetric Dirichlet prior on
    the weights and an independent NIW prior per component, μ_{0,m} = μ_{b,m},
    Ψ_{0,m} = (ν0 − d − 1)Σ_{b,m}. The responsibilities r_im of the n target anchors under
    the broad mixture are computed once and give soft counts:

    .. math::

        N_m = \\sum_i r_{im}, \\quad
        \\bar\\gamma_m = \\frac1{N_m}\\sum_i r_{im}\\gamma_i, \\quad
        S_m = \\sum_i r_{im}(\\gamma_i - \\bar\\gamma_m)(\\gamma_i - \\bar\\gamma_m)^\\top,

        \\alpha'_m = \\alpha + N_m, \\quad \\kappa'_m = \\kappa_0 + N_m, \\quad \\nu'_m = \\nu_0 + N_m, \\quad
        \\mu'_m = \\frac{\\kappa_0\\mu_{0,m} + N_m\\bar\\gamma_m}{\\kappa_0 + N_m},

        \\Psi'_m = \\Psi_{0,m} + S_m + \\frac{\\kappa_0 N_m}{\\kappa_0 + N_m}
            (\\bar\\gamma_m - \\mu_{0,m})(\\bar\\gamma_m - \\mu_{0,m})^\\top.

    The adapted mixture is the posterior mean: π̂_m = α'_m / Σ_ℓ α'_ℓ, μ̂_m = μ'_m,
    Σ̂_m = Ψ'_m/(ν'_m − d − 1). A component with N_m = 0 keeps its broad mean and covariance
    (and weight α/Σα'). The broad covariances already hold ``reg_covar``·I, so Σ̂_m is
    positive definite without further regularisation. A weighted target of n anchors gives
    anchor i the count n·w_i (r_im becomes n·w_i·r_im). One target anchor suffices.

    Parameters
    ----------
    n_components : int, default 4
        Number of mixture components M (≤ number of anchors; of broad anchors when adapting).
    seed : int, default 0
        Seed of the k-means++ initialisation.
    tau, logit_scale : float
        Temperature, or its inverse. Give exactly one.
    reg_covar, tol, max_iter : float, float, int
        1e-5, 1e-3 and 200 as in the paper.
    dirichlet_alpha : float, default 1
        α > 0, the symmetric Dirichlet concentration (App. E.5).
    kappa0 : float, default 5
        κ0 > 0, shared by the components (App. E.5).
    nu0 : float, optional
        ν0 > d + 1, shared by the components; ``None`` means d + 20 (App. E.5).

    Attributes
    ----------
    weights_ : (M,), means_ : (M, d), covariances_ : (M, d, d)
    n_iter_ : int, converged_ : bool, lower_bound_ : float (mean log-likelihood)
        EM diagnostics; of the broad fit for an adapted model.
    prior_ : GaussianMixture
        The broad fit (adapted models only).
    posterior_ : NormalInverseWishart
        The M component posteriors: ``kappa`` (M,), ``nu`` (M,), ``mean`` (M, d) and
        ``scale`` (M, d, d) hold κ'_m, ν'_m, μ'_m, Ψ'_m (adapted models only).
    concentration_ : torch.Tensor (M,)
        The Dirichlet posterior α'_m = α + N_m (adapted models only).
    """

    min_anchors = 2
    PARAMS = (
        Param("n_components", "int", 4, "Number of mixture components M (at most the number of anchors).",
              low=1, at_most=lambda n_anchors, dim: n_anchors, request_max=64),
        Param("seed", "int", 0, "Seed of the k-means++ initialisation.", low=0, high=2**31 - 1, seed=True),
        Param("reg_covar", "float", 1e-5, "Added to the diagonal of every covariance.", low=0),
        Param("tol", "float", 1e-3, "EM stops when the mean log-likelihood improves by less.", low=0, low_open=True),
        Param("max_iter", "int", 200, "Most EM iterations.", low=1, request_max=1000),
        Param("dirichlet_alpha", "float", 1.0, "Posterior: α > 0, the Dirichlet concentration.", low=0,
              low_open=True),
        Param("kappa0", "float", 5.0, "Posterior: κ0 > 0, shared by the components.", low=0, low_open=True),
        Param("nu0", "float", None, "Posterior: ν0 > d + 1, shared by the components (default d + 20).", low=0,
              low_open=True),
    )
    color = "#2ca02c"
    _prior_shared_params = ("n_components",)
    _posterior_attributes = ("prior_", "posterior_", "concentration_")

    def __init__(self, *, n_components: int = 4, seed: int = 0, tau: float | None = None,
                 logit_scale: float | None = None, reg_covar: float = 1e-5, tol: float = 1e-3,
                 max_iter: int = 200, dirichlet_alpha: float = 1.0, kappa0: float = 5.0,
                 nu0: float | None = None):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.n_components = n_components
        self.seed = seed
        self.reg_covar = reg_covar
        self.tol = tol
        self.max_iter = max_iter
        self.dirichlet_alpha = dirichlet_alpha
        self.kappa0 = kappa0
        self.nu0 = nu0

    def _fit(self, anchors: AnchorSet) -> None:
        M = positive_int(self.n_components, "n_components")
        if M > len(anchors):
            raise ValueError(
                f"n_components={M} exceeds the {len(anchors)} anchors with positive weight; "
                f"use n_components <= {len(anchors)}."
            )
        X = anchors.embeddings.to(torch.float64)
        w = anchors.weights
        labels = kmeans_labels(X, w, M, self.seed)
        resp = torch.nn.functional.one_hot(labels, M).to(X.dtype)
        weights, means, covs, n_iter, converged, ll = em(X, w, resp, self.reg_covar, self.tol, self.max_iter)
        self._set_components(weights, means, covs)
        self.n_iter_, self.converged_, self.lower_bound_ = n_iter, converged, ll

    # -------------------------------------------------------------- posterior
    def _check_posterior_params(self, dim: int) -> tuple[float, float, float]:
        alpha = check_positive("dirichlet_alpha", self.dirichlet_alpha)
        return (alpha, *niw_hyperparameters(self.kappa0, self.nu0, dim))

    def _fit_posterior(self, target: AnchorSet, prior: "GaussianMixture", hyper: tuple[float, float, float]) -> None:
        alpha, kappa0, nu0 = hyper
        X, counts = target_counts(target)
        weights = prior.weights_.to(torch.float64)
        means = prior.means_.to(torch.float64)
        covs = prior.covariances_.to(torch.float64)
        resp, _ = e_step(X, counts, weights, means, covs)
        soft = resp * counts[:, None]
        niw = NormalInverseWishart.from_estimate(means, covs, kappa0, nu0)
        posterior = niw_update(niw, X, soft)
        concentration = dirichlet_update(alpha, soft.sum(0))
        self.posterior_ = posterior
        self.concentration_ = concentration
        self._set_components(concentration / concentration.sum(), posterior.mean, posterior.covariance("mean"))
        self.n_iter_, self.converged_, self.lower_bound_ = prior.n_iter_, prior.converged_, prior.lower_bound_

    def _set_components(self, weights: torch.Tensor, means: torch.Tensor, covs: torch.Tensor) -> None:
        self.weights_, self.means_, self.covariances_ = weights, means, covs
        self.log_weights_ = weights.log()

    def _flops_per_row(self) -> float:
        return 2.0 * self.n_components * self.dim_ ** 2

    def _grad_norm_bound(self) -> float:
        """∇κ = Σ_m r_m(μ_m + Σ_m η) with ‖η‖ ≤ R/τ: max_m ‖μ_m‖ + ‖Σ_m‖₂ R/τ."""
        spectral = torch.linalg.matrix_norm(self.covariances_.to(torch.float64), ord=2)
        return float((self.means_.to(torch.float64).norm(dim=1) + spectral * self.INPUT_NORM / self.tau_).max())

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        means = in_dtype(self.means_, eta.dtype)
        s_eta = torch.einsum("bd,mde->bme", eta, in_dtype(self.covariances_, eta.dtype))
        logits = in_dtype(self.log_weights_, eta.dtype) + eta @ means.T + 0.5 * (s_eta * eta[:, None, :]).sum(-1)
        cgf = torch.logsumexp(logits, dim=1)
        resp = torch.exp(logits - cgf[:, None])
        return cgf, resp @ means + (resp[:, :, None] * s_eta).sum(1)
