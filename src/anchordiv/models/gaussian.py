"""Gaussian anchor model (paper §3, App. B.2, C) and its Normal–Inverse-Wishart adaptation (App. D.2)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .._backend import in_dtype
from ..anchors import AnchorSet
from ..linalg import symmetric_eigh, weighted_mean_cov
from .base import EuclideanModel
from .params import Param
from .posterior import NormalInverseWishart, PosteriorMixin, niw_hyperparameters, niw_update, target_counts


class Gaussian(PosteriorMixin, EuclideanModel):
    """Gaussian anchor distribution q = N(μ, Σ) fitted by maximum likelihood.

    .. math::

        \\kappa(\\eta) = \\mu^\\top\\eta + \\tfrac12 \\eta^\\top\\Sigma\\eta, \\qquad
        \\nabla\\kappa(\\eta) = \\mu + \\Sigma\\eta,

        d(\\lambda_1\\|\\lambda_2) = \\frac{1}{2\\tau^2}(\\lambda_1-\\lambda_2)^\\top\\Sigma(\\lambda_1-\\lambda_2).

    Reference: Kannan, Park, Veitch (2026), Prop. 6 (eq. B.13) and eq. C.1–C.2
    (μ̂ = mean, Σ̂ = (1/n) scatter; weighted when the anchor set is weighted).

    The divergence is ‖z(λ1) − z(λ2)‖² with z(λ) = Σ^{1/2}λ/(τ√2), so search is L2 search
    on z (:meth:`euclidean_embedding`).

    **Posterior adaptation** (``fit(target, prior=broad)``, App. D.2, hyperparameters of
    App. E.5). The broad fit (μ_b, Σ_b) centres a Normal–Inverse-Wishart prior,

    .. math::

        \\Sigma \\sim \\mathcal{IW}(\\Psi_0, \\nu_0), \\quad
        \\mu \\mid \\Sigma \\sim \\mathcal N(\\mu_0, \\Sigma/\\kappa_0), \\quad
        \\mu_0 = \\mu_b, \\quad \\Psi_0 = (\\nu_0 - d - 1)\\Sigma_b,

    and the n target anchors (mean γ̄, scatter S) update it conjugately:

    .. math::

        \\kappa_n = \\kappa_0 + n, \\quad \\nu_n = \\nu_0 + n, \\quad
        \\mu_n = \\frac{\\kappa_0\\mu_0 + n\\bar\\gamma}{\\kappa_0 + n}, \\quad
        \\Psi_n = \\Psi_0 + S + \\frac{\\kappa_0 n}{\\kappa_0 + n}(\\bar\\gamma - \\mu_0)(\\bar\\gamma - \\mu_0)^\\top.

    The adapted model is μ̂ = μ_n and Σ̂ = Ψ_n/(ν_n − d − 1) (posterior mean, ``summary="mean"``)
    or Σ̂ = Ψ_n/(ν_n + d + 2) (joint MAP of (μ, Σ), ``summary="mode"``). One target anchor
    suffices (S = 0). A weighted target of n anchors counts anchor i n·w_i times.

    Parameters
    ----------
    tau, logit_scale : float
        Temperature, or its inverse. Give exactly one.
    kappa0 : float, default 5
        κ0 > 0, prior strength on the mean, in target anchors (App. E.5).
    nu0 : float, optional
        ν0 > d + 1, prior strength on the covariance; ``None`` means d + 20 (App. E.5).
    summary : {"mean", "mode"}, default "mean"
        Posterior summary of Σ (see above).

    Attributes
    ----------
    mean_ : torch.Tensor (d,)
    covariance_ : torch.Tensor (d, d)
    covariance_sqrt_ : torch.Tensor (d, d)
        L with L Lᵀ = Σ; the Euclidean embedding is z = Lᵀλ / (τ√2).
    embedding_map_ : torch.Tensor (d, d)
        L / (τ√2), computed once at fit: z = λ · embedding_map_.
    prior_ : Gaussian
        The broad fit (adapted models only).
    posterior_ : NormalInverseWishart
        κ_n, ν_n, μ_n and Ψ_n as ``kappa``, ``nu``, ``mean``, ``scale`` (adapted models only).
    """

    min_anchors = 2
    PARAMS = (
        Param("kappa0", "float", 5.0, "Posterior: κ0 > 0, prior strength on the mean.", low=0, low_open=True),
        Param("nu0", "float", None, "Posterior: ν0 > d + 1, prior strength on the covariance (default d + 20).",
              low=0, low_open=True),
        Param("summary", "choice", "mean", "Posterior summary of Σ.", choices=("mean", "mode")),
    )
    color = "#ff7f0e"

    def __init__(self, *, tau: float | None = None, logit_scale: float | None = None, kappa0: float = 5.0,
                 nu0: float | None = None, summary: str = "mean"):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.kappa0 = kappa0
        self.nu0 = nu0
        self.summary = summary

    @classmethod
    def from_moments(cls, mean: Any, covariance: Any, **params: Any) -> "Gaussian":
        """A fitted model of the anchor distribution N(μ, Σ) given directly, e.g. a population
        Gaussian (Theorem 3); ``params`` as for the constructor (``tau=`` or ``logit_scale=``)."""
        model = cls(**params)
        mean = torch.as_tensor(mean, dtype=torch.float64)
        cov = torch.as_tensor(covariance, dtype=torch.float64, device=mean.device)
        d = mean.shape[-1] if mean.ndim == 1 else -1
        if mean.ndim != 1 or cov.shape != (d, d):
            raise ValueError(f"mean must be (d,) and covariance (d, d), got {tuple(mean.shape)} and {tuple(cov.shape)}.")
        if not torch.allclose(cov, cov.T, rtol=1e-10, atol=1e-12) or float(torch.linalg.eigvalsh(cov).min()) < -1e-12:
            raise ValueError("covariance must be symmetric positive semi-definite.")
        model.tau_, model.n_anchors_, model.device_ = model._resolve_tau(), 0, mean.device
        model._set_moments(mean, cov)
        model.dim_ = d
        return model

    def _fit(self, anchors: AnchorSet) -> None:
        self._set_moments(*weighted_mean_cov(anchors.embeddings, anchors.weights))

    # -------------------------------------------------------------- posterior
    def _check_posterior_params(self, dim: int) -> tuple[float, float]:
        if self.summary not in ("mean", "mode"):
            raise ValueError(f"summary must be 'mean' or 'mode', got {self.summary!r}.")
        return niw_hyperparameters(self.kappa0, self.nu0, dim)

    def _fit_posterior(self, target: AnchorSet, prior: "Gaussian", hyper: tuple[float, float]) -> None:
        kappa0, nu0 = hyper
        X, counts = target_counts(target)
        niw = NormalInverseWishart.from_estimate(prior.mean_, prior.covariance_, kappa0, nu0)
        self.posterior_ = niw_update(niw, X, counts)
        self._set_moments(self.posterior_.mean, self.posterior_.covariance(self.summary))

    # ------------------------------------------------------------------ math
    def _flops_per_row(self) -> float:
        return 2.0 * self.dim_ ** 2

    def _grad(self, eta: torch.Tensor) -> torch.Tensor:
        return in_dtype(self.mean_, eta.dtype) + eta @ in_dtype(self.covariance_, eta.dtype)

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = in_dtype(self.mean_, eta.dtype)
        s_eta = eta @ in_dtype(self.covariance_, eta.dtype)
        return eta @ mean + 0.5 * (eta * s_eta).sum(1), mean + s_eta

    def _set_moments(self, mean: torch.Tensor, covariance: torch.Tensor) -> None:
        """μ, Σ and L with L Lᵀ = Σ (eigenvectors scaled by √eigenvalues), the embedding's map."""
        self.mean_, self.covariance_ = mean, covariance
        values, vectors = symmetric_eigh(covariance)
        self.covariance_sqrt_ = vectors * values.clamp_min(0).sqrt()
        self.embedding_map_ = self.covariance_sqrt_ / (self.tau_ * math.sqrt(2))

    def _embed(self, X: torch.Tensor) -> torch.Tensor:
        return X @ in_dtype(self.embedding_map_, X.dtype)
