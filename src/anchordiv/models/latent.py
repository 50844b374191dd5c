"""Latent low-rank anchor models: latent Gaussian and latent spherical (paper §3, App. B.3, B.4, C)."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from ..anchors import AnchorSet
from ..special import bessel_ratio, log_vmf_normalizer
import math

from .base import EuclideanModel, weighted_mean_cov


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
    eigenvalues, eigenvectors = torch.linalg.eigh(cov)
    eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)
    if float(eigenvalues.clamp_min(0).sum()) <= 0:
        raise ValueError("The anchors have zero variance (all identical); a subspace needs at least 2 distinct anchors.")
    k = select_rank(eigenvalues, rank, cov.shape[0])
    return eigenvectors[:, :k].T.contiguous(), eigenvalues, k


class _LatentSubspace(EuclideanModel):
    """Shared fit of the latent models: U = top-k eigenvectors of the anchor covariance (eq. C.3)."""

    min_anchors = 2

    def __init__(self, rank: int | float = 0.95, tau: float | None = None, logit_scale: float | None = None):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.rank = rank

    def _fit(self, anchors: AnchorSet) -> None:
        X = anchors.embeddings.to(torch.float64)
        self.mean_, cov = weighted_mean_cov(X, anchors.weights)
        self._set_subspace(*principal_subspace(cov, self.rank))

    def _set_subspace(self, components: torch.Tensor, eigenvalues: torch.Tensor, k: int) -> None:
        self.components_ = components
        self.n_components_ = k
        total = eigenvalues.clamp_min(0).sum()
        self.explained_variance_ = eigenvalues[:k].clamp_min(0)
        self.explained_variance_ratio_ = self.explained_variance_ / total
        self._reset_cache()

    @property
    def natural_dim_(self) -> int:
        return self.n_components_

    def _flops_per_row(self) -> float:
        return 2.0 * self.dim_ * self.n_components_

    def _project(self, X: torch.Tensor) -> torch.Tensor:
        return X @ self._cast("components_", X).T


class LatentGaussian(_LatentSubspace):
    """Latent Gaussian anchor model: z ~ N(0, I_k) realised as γ = μ + Uz.

    .. math::

        \\eta(\\lambda) = U^\\top\\lambda/\\tau, \\quad \\kappa(\\eta) = \\tfrac12\\|\\eta\\|^2, \\quad
        d(\\lambda_1\\|\\lambda_2) = \\frac{1}{2\\tau^2}\\|U^\\top(\\lambda_1-\\lambda_2)\\|^2.

    Reference: Kannan, Park, Veitch (2026), Prop. 7 (eq. B.24), App. C.

    Parameters
    ----------
    rank : int or float, default 0.95
        k, or the smallest k whose eigenvalues explain this fraction of the anchor variance.
    tau, logit_scale : float
        Temperature, or its inverse. Give exactly one.

    Attributes
    ----------
    components_ : torch.Tensor (k, d)
        Uᵀ: the top-k eigenvectors of the anchor covariance, as rows.
    mean_, explained_variance_, explained_variance_ratio_, n_components_
    """

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

    Parameters and attributes are those of :class:`LatentGaussian`.
    """

    def _natural_params(self, X: torch.Tensor) -> torch.Tensor:
        p = self._project(X)
        norm = p.norm(dim=1, keepdim=True)
        zero = (norm <= torch.finfo(X.dtype).eps * X.norm(dim=1, keepdim=True)).flatten()
        if bool(zero.any()):
            rows = torch.nonzero(zero).flatten()[:5].tolist()
            raise ValueError(
                f"X rows {rows} project to zero on the latent subspace (Uᵀλ = 0), where the latent "
                "spherical divergence is undefined; drop those rows or use latent_gaussian."
            )
        return p / (norm * self.tau_)

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
