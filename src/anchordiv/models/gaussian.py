"""Gaussian anchor model (paper §3, App. B.2, C)."""

from __future__ import annotations

import torch

from ..anchors import AnchorSet
import math

from .base import EuclideanModel, weighted_mean_cov


class Gaussian(EuclideanModel):
    """Gaussian anchor distribution q = N(μ, Σ) fitted by maximum likelihood.

    .. math::

        \\kappa(\\eta) = \\mu^\\top\\eta + \\tfrac12 \\eta^\\top\\Sigma\\eta, \\qquad
        \\nabla\\kappa(\\eta) = \\mu + \\Sigma\\eta,

        d(\\lambda_1\\|\\lambda_2) = \\frac{1}{2\\tau^2}(\\lambda_1-\\lambda_2)^\\top\\Sigma(\\lambda_1-\\lambda_2).

    Reference: Kannan, Park, Veitch (2026), Prop. 6 (eq. B.13) and eq. C.1–C.2
    (μ̂ = mean, Σ̂ = (1/n) scatter; weighted when the anchor set is weighted).

    The divergence is ‖z(λ1) − z(λ2)‖² with z(λ) = Σ^{1/2}λ/(τ√2), so search is L2 search
    on z (:meth:`euclidean_embedding`).

    Attributes
    ----------
    mean_ : torch.Tensor (d,)
    covariance_ : torch.Tensor (d, d)
    """

    min_anchors = 2

    def _fit(self, anchors: AnchorSet) -> None:
        X = anchors.embeddings.to(torch.float64)
        self.mean_, self.covariance_ = weighted_mean_cov(X, anchors.weights)

    def _flops_per_row(self) -> float:
        return 2.0 * self.dim_ ** 2

    def _grad(self, eta: torch.Tensor) -> torch.Tensor:
        return self._cast("mean_", eta) + eta @ self._cast("covariance_", eta)

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self._cast("mean_", eta)
        s_eta = eta @ self._cast("covariance_", eta)
        return eta @ mean + 0.5 * (eta * s_eta).sum(1), mean + s_eta

    def _derived(self, name: str) -> torch.Tensor:
        if name == "derived:sqrt_cov":
            values, vectors = torch.linalg.eigh(self.covariance_)
            return vectors * values.clamp_min(0).sqrt()
        return super()._derived(name)

    def _embed(self, X: torch.Tensor) -> torch.Tensor:
        return X @ self._cast("derived:sqrt_cov", X) / (self.tau_ * math.sqrt(2))
