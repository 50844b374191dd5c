"""Gaussian mixture anchor model (paper §3, App. B.5, C, E.5)."""

from __future__ import annotations

import math

import torch

from ..anchors import AnchorSet
from .base import AnchorModel

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


class GaussianMixture(AnchorModel):
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

    Parameters
    ----------
    n_components : int, default 1
        Number of mixture components M (≤ number of anchors).
    seed : int, default 0
        Seed of the k-means++ initialisation.
    tau, logit_scale : float
        Temperature, or its inverse. Give exactly one.
    reg_covar, tol, max_iter : float, float, int
        1e-5, 1e-3 and 200 as in the paper.

    Attributes
    ----------
    weights_ : (M,), means_ : (M, d), covariances_ : (M, d, d)
    n_iter_ : int, converged_ : bool, lower_bound_ : float (mean log-likelihood)
    """

    min_anchors = 2

    def __init__(self, n_components: int = 1, seed: int = 0, tau: float | None = None,
                 logit_scale: float | None = None, reg_covar: float = 1e-5, tol: float = 1e-3,
                 max_iter: int = 200):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.n_components = n_components
        self.seed = seed
        self.reg_covar = reg_covar
        self.tol = tol
        self.max_iter = max_iter

    def _fit(self, anchors: AnchorSet) -> None:
        M = self.n_components
        if isinstance(M, bool) or not isinstance(M, int) or M < 1:
            raise ValueError(f"n_components must be a positive int, got {M!r}.")
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

    def _set_components(self, weights: torch.Tensor, means: torch.Tensor, covs: torch.Tensor) -> None:
        self.weights_, self.means_, self.covariances_ = weights, means, covs
        self.log_weights_ = weights.log()
        self._reset_cache()

    def _flops_per_row(self) -> float:
        return 2.0 * self.n_components * self.dim_ ** 2

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        means = self._cast("means_", eta)
        s_eta = torch.einsum("bd,mde->bme", eta, self._cast("covariances_", eta))
        logits = self._cast("log_weights_", eta) + eta @ means.T + 0.5 * (s_eta * eta[:, None, :]).sum(-1)
        cgf = torch.logsumexp(logits, dim=1)
        resp = torch.exp(logits - cgf[:, None])
        return cgf, resp @ means + (resp[:, :, None] * s_eta).sum(1)
