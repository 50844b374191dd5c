"""Posterior anchor models: priors from broad anchors, updates from target anchors (paper §4, App. D).

A parametric anchor model is fitted to broad anchors; the fit sets the hyperparameters of a
prior over the model parameters (an empirical-Bayes step), and a few target anchors update
that prior. The adapted model is the posterior summary θ̂, and its geometry is the ordinary
anchor divergence of q_θ̂ (Definition 5). This module holds the updates shared by the models:

- :class:`NormalInverseWishart` and :func:`niw_update` (Gaussian, App. D.2; per mixture
  component, App. D.5);
- :class:`MatrixBingham` (latent Gaussian, App. D.3; latent spherical, App. D.4);
- :func:`dirichlet_update` (mixture weights, App. D.5);
- :func:`resolve_prior` and :func:`target_counts`, used by ``AnchorModel.fit(target, prior=...)``.

A weighted target :class:`~anchordiv.AnchorSet` with n anchors of weights w_i (Σ w_i = 1)
enters every update as n target anchors in which anchor i counts n·w_i times: the counts
that the updates use are c_i = n·w_i, so a uniform set gives c_i = 1.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..anchors import AnchorSet
from ..linalg import symmetric_eigh
from .base import AnchorModel, Geometry, NotFittedError, prepare_anchors

__all__ = [
    "NormalInverseWishart", "niw_update", "MatrixBingham", "dirichlet_update",
    "resolve_prior", "target_counts", "niw_hyperparameters", "PosteriorMixin",
]


@dataclass(frozen=True)
class NormalInverseWishart:
    """A Normal–Inverse-Wishart distribution over (μ, Σ), or a batch of M independent ones.

    .. math::

        \\Sigma \\sim \\mathcal{IW}(\\Psi, \\nu), \\qquad
        \\mu \\mid \\Sigma \\sim \\mathcal N\\!\\left(m, \\tfrac{1}{\\kappa}\\Sigma\\right).

    Attributes
    ----------
    kappa : torch.Tensor, shape () or (M,)
        κ, the prior strength on the mean (in pseudo-observations).
    nu : torch.Tensor, shape () or (M,)
        ν > d − 1, the degrees of freedom of the inverse Wishart.
    mean : torch.Tensor, shape (d,) or (M, d)
        m, the location of μ.
    scale : torch.Tensor, shape (d, d) or (M, d, d)
        Ψ, the scale matrix of the inverse Wishart.
    """

    kappa: torch.Tensor
    nu: torch.Tensor
    mean: torch.Tensor
    scale: torch.Tensor

    @property
    def dim(self) -> int:
        """Dimension d."""
        return int(self.mean.shape[-1])

    @classmethod
    def from_estimate(cls, mean: torch.Tensor, covariance: torch.Tensor, kappa0: float, nu0: float
                      ) -> "NormalInverseWishart":
        """The empirical-Bayes prior centred on a broad fit (App. D.2 step 2, D.5 step 2).

        .. math::

            \\mu_0 = \\hat\\mu_\\mathrm{broad}, \\qquad
            \\Psi_0 = (\\nu_0 - d - 1)\\,\\hat\\Sigma_\\mathrm{broad},

        so that the prior mean of Σ, Ψ0/(ν0 − d − 1), is the broad covariance. ``mean`` is
        (d,) or (M, d) and ``covariance`` (d, d) or (M, d, d); ``kappa0`` > 0 and
        ``nu0`` > d + 1 are shared by the batch.
        """
        mean = mean.to(torch.float64)
        covariance = covariance.to(torch.float64)
        d = int(mean.shape[-1])
        if not float(nu0) > d + 1:
            raise ValueError(f"nu0={nu0} must be > d + 1 = {d + 1} for the prior mean of Σ to exist.")
        if not float(kappa0) > 0:
            raise ValueError(f"kappa0={kappa0} must be > 0.")
        batch = mean.shape[:-1]
        kappa = torch.full(batch, float(kappa0), dtype=torch.float64, device=mean.device)
        nu = torch.full(batch, float(nu0), dtype=torch.float64, device=mean.device)
        return cls(kappa, nu, mean, (float(nu0) - d - 1) * covariance)

    def covariance(self, summary: str = "mean") -> torch.Tensor:
        """Point estimate of Σ: ``"mean"`` (posterior mean) or ``"mode"`` (joint MAP of (μ, Σ)).

        .. math::

            \\hat\\Sigma_\\mathrm{mean} = \\frac{\\Psi}{\\nu - d - 1}\\ (\\nu > d + 1), \\qquad
            \\hat\\Sigma_\\mathrm{mode} = \\frac{\\Psi}{\\nu + d + 2}.

        The mode maximises the joint density
        :math:`p(\\mu, \\Sigma) \\propto |\\Sigma|^{-(\\nu + d + 2)/2}
        \\exp(-\\tfrac12\\operatorname{tr}(\\Psi\\Sigma^{-1})
        - \\tfrac\\kappa2(\\mu - m)^\\top\\Sigma^{-1}(\\mu - m))`, at μ = m (the exponent
        collects ν + d + 1 from the inverse Wishart and 1 from the normal on μ). The mean of
        μ and its mode are both m.
        """
        d = self.dim
        if summary == "mean":
            if bool((self.nu <= d + 1).any()):
                raise ValueError(f"The posterior mean of Σ needs ν > d + 1 = {d + 1}, got ν = {self.nu.tolist()}.")
            denom = self.nu - d - 1
        elif summary == "mode":
            denom = self.nu + d + 2
        else:
            raise ValueError(f"summary must be 'mean' or 'mode', got {summary!r}.")
        return self.scale / denom[..., None, None]

    def to(self, device: Any) -> "NormalInverseWishart":
        """A copy on ``device``."""
        return NormalInverseWishart(*(t.to(device) for t in (self.kappa, self.nu, self.mean, self.scale)))


def niw_update(prior: NormalInverseWishart, X: torch.Tensor, counts: torch.Tensor | None = None
               ) -> NormalInverseWishart:
    """Conjugate Normal–Inverse-Wishart update with (weighted) observations (App. D.2 step 3).

    With counts c_i ≥ 0 (the number of times row x_i is observed; soft counts r_im for a
    batch of mixture components, App. D.5 step 3), N = Σ c_i,
    :math:`\\bar x = \\frac1N\\sum_i c_i x_i` and
    :math:`S = \\sum_i c_i (x_i - \\bar x)(x_i - \\bar x)^\\top`:

    .. math::

        \\kappa_n = \\kappa_0 + N, \\quad \\nu_n = \\nu_0 + N, \\quad
        \\mu_n = \\frac{\\kappa_0\\mu_0 + N\\bar x}{\\kappa_0 + N},

        \\Psi_n = \\Psi_0 + S + \\frac{\\kappa_0 N}{\\kappa_0 + N}(\\bar x - \\mu_0)(\\bar x - \\mu_0)^\\top.

    A prior (or mixture component) with N = 0, including zero rows, is returned unchanged.

    Parameters
    ----------
    prior : NormalInverseWishart
        A single prior (``mean`` of shape (d,)) or a batch of M (``mean`` of shape (M, d)).
    X : torch.Tensor, shape (n, d)
        Observations; n may be 0.
    counts : torch.Tensor, shape (n,) for a single prior or (n, M) for a batch, optional
        Non-negative counts; each row counts once when omitted (single prior only).

    Returns
    -------
    NormalInverseWishart
        The posterior, with the prior's batch shape.
    """
    dtype, device = prior.mean.dtype, prior.mean.device
    batched = prior.mean.ndim == 2
    d = prior.dim
    if X.ndim != 2 or X.shape[1] != d:
        raise ValueError(f"X must have shape (n, {d}), got {tuple(X.shape)}.")
    X = X.to(dtype)
    n = X.shape[0]
    if counts is None:
        if batched:
            raise ValueError("A batch of priors needs counts of shape (n, M), one column per component.")
        counts = torch.ones(n, dtype=dtype, device=device)
    c = counts.to(dtype)
    M = prior.mean.shape[0] if batched else 1
    expected = (n, M) if batched else (n,)
    if tuple(c.shape) != expected:
        raise ValueError(f"counts must have shape {expected}, got {tuple(c.shape)}.")
    if not bool(torch.isfinite(c).all()) or bool((c < 0).any()):
        raise ValueError("counts must be finite and non-negative.")
    c = c.reshape(n, M)
    kappa0, nu0 = prior.kappa.reshape(M), prior.nu.reshape(M)
    mu0, psi0 = prior.mean.reshape(M, d), prior.scale.reshape(M, d, d)

    N = c.sum(0)
    means, scales = mu0.clone(), psi0.clone()
    for m in range(M):
        Nm = float(N[m])
        if Nm <= 0:
            continue
        xbar = (c[:, m] @ X) / Nm
        diff = X - xbar
        S = (diff * c[:, m:m + 1]).T @ diff
        dev = xbar - mu0[m]
        k0 = float(kappa0[m])
        means[m] = (k0 * mu0[m] + Nm * xbar) / (k0 + Nm)
        psi = psi0[m] + S + (k0 * Nm / (k0 + Nm)) * torch.outer(dev, dev)
        scales[m] = 0.5 * (psi + psi.T)
    shape = prior.kappa.shape
    return NormalInverseWishart(
        (kappa0 + N).reshape(shape), (nu0 + N).reshape(shape),
        means.reshape(prior.mean.shape), scales.reshape(prior.scale.shape),
    )


@dataclass(frozen=True)
class MatrixBingham:
    """Matrix Bingham distribution on the Stiefel manifold, p(U | A) ∝ exp(tr(UᵀAU)).

    Used as the prior and (posterior-like) update of the latent subspace (App. D.3, D.4).

    Attributes
    ----------
    parameter : torch.Tensor, shape (d, d)
        The symmetric parameter matrix A.
    """

    parameter: torch.Tensor

    @classmethod
    def from_subspace(cls, components: torch.Tensor, alpha: float) -> "MatrixBingham":
        """The prior centred on a broad subspace: A = α U_broad U_broadᵀ (App. D.3 step 2).

        ``components`` is U_broadᵀ, of shape (k, d) with orthonormal rows; α ≥ 0.
        """
        if not float(alpha) >= 0:
            raise ValueError(f"alpha={alpha} must be >= 0.")
        U = components.to(torch.float64)
        return cls(float(alpha) * (U.T @ U))

    def update(self, covariance: torch.Tensor, beta: float) -> "MatrixBingham":
        """A_post = A + β Cov̂(Γ_target) (App. D.3 step 3, D.4), with β ≥ 0."""
        if not float(beta) >= 0:
            raise ValueError(f"beta={beta} must be >= 0.")
        A = self.parameter + float(beta) * covariance.to(self.parameter.dtype)
        return replace(self, parameter=0.5 * (A + A.T))

    def mode(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """MAP subspace: argmax over U ∈ St(d, k) of tr(UᵀAU), the top-k eigenvectors of A.

        Returns (components (k, d), all eigenvalues of A in descending order). The subspace
        is unique when the k-th and (k+1)-th eigenvalues differ.
        """
        d = self.parameter.shape[0]
        if not 1 <= int(k) <= d:
            raise ValueError(f"k={k} must be in [1, {d}].")
        values, vectors = symmetric_eigh(self.parameter)
        values, vectors = values.flip(0), vectors.flip(1)
        return vectors[:, : int(k)].T.clone(memory_format=torch.contiguous_format), values  # no view of all d

    def to(self, device: Any) -> "MatrixBingham":
        """A copy on ``device``."""
        return MatrixBingham(self.parameter.to(device))


def dirichlet_update(alpha: float | torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Conjugate Dirichlet update of mixture weights: α'_m = α_m + N_m (App. D.5 step 3)."""
    return torch.as_tensor(alpha, dtype=torch.float64, device=counts.device) + counts.to(torch.float64)


def target_counts(target: AnchorSet) -> tuple[torch.Tensor, torch.Tensor]:
    """(X, c): the target anchors in float64 and their counts c_i = n·w_i (Σ c_i = n)."""
    X = target.embeddings.to(torch.float64)
    return X, target.weights.to(torch.float64) * len(target)


def niw_hyperparameters(kappa0: Any, nu0: Any, dim: int) -> tuple[float, float]:
    """(κ0, ν0) of a Normal–Inverse-Wishart prior, checked: κ0 > 0, ν0 > d + 1 (default d + 20, App. E.5)."""
    kappa0 = check_positive("kappa0", kappa0)
    value = dim + 20.0 if nu0 is None else check_positive("nu0", nu0)
    if not value > dim + 1:
        raise ValueError(f"nu0={nu0} must be > d + 1 = {dim + 1}; the default None means d + 20.")
    return kappa0, value


def resolve_prior(model: AnchorModel, prior: Any, target: AnchorSet) -> tuple[AnchorModel, Any]:
    """The fitted broad model behind ``prior``, checked against ``model`` and ``target``.

    ``prior`` is a broad :class:`AnchorSet` or (N, d) array, fitted here with a clone of
    ``model``'s parameters, or an already fitted model of the same class (whose parameters
    listed in ``model._prior_shared_params`` must equal ``model``'s; its temperature is not
    used, since the updates read only the fitted distribution). ``prior`` may be ``model``
    itself, whose current fit then becomes the prior. Returns the prior and the checked
    adaptation hyperparameters (``model._check_posterior_params``, run once). Raises a
    ``ValueError`` for another model class, a dimension or device mismatch, too few target
    anchors, or bad adaptation hyperparameters, before any broad fit is run.
    """
    name = type(model).__name__
    if not hasattr(model, "_fit_posterior"):
        raise ValueError(f"{name} takes no prior.")
    needed = int(getattr(model, "min_target_anchors", 1))
    if len(target) < needed:
        raise ValueError(
            f"{name}'s posterior update needs at least {needed} target anchors with positive weight, "
            f"got {len(target)}; {model._min_target_reason}"
        )
    hyper = model._check_posterior_params(target.dim)
    if isinstance(prior, Geometry):
        if prior is model:
            prior = copy.copy(model)  # refit in place: the current fit becomes the prior
        if type(prior) is not type(model):
            raise ValueError(
                f"The prior is a fitted {type(prior).__name__} but this model is a {name}; pass a "
                f"{name} fitted on the broad anchors, or the broad AnchorSet itself."
            )
        if not prior._is_fitted():
            raise NotFittedError(
                f"The prior {name} is not fitted; fit it on the broad anchors first, or pass the broad AnchorSet."
            )
        for param in getattr(model, "_prior_shared_params", ()):
            if getattr(prior, param) != getattr(model, param):
                raise ValueError(
                    f"{param}={getattr(model, param)!r} differs from the prior's {param}={getattr(prior, param)!r}; "
                    f"the broad fit fixes {param}, so give this model the prior's value."
                )
    else:
        if isinstance(prior, AnchorSet):
            broad = prior
        else:
            try:
                broad = AnchorSet(prior)
            except ValueError as exc:
                raise ValueError(f"prior must be an AnchorSet, an (N, d) array or a fitted {name}: {exc}") from None
        if broad.dim != target.dim:
            raise ValueError(
                f"The broad anchors have dimension {broad.dim} but the target anchors have dimension {target.dim}."
            )
        if broad.device != target.device:
            raise ValueError(f"The broad anchors are on {broad.device} but the target anchors on {target.device}.")
        prior = type(model)(**model.get_params()).fit(broad)
    if prior.dim_ != target.dim:
        raise ValueError(
            f"The prior {name} has dimension {prior.dim_} but the target anchors have dimension {target.dim}."
        )
    if prior.device != target.device:
        raise ValueError(f"The prior {name} is on {prior.device} but the target anchors on {target.device}.")
    return prior, hyper


def check_positive(name: str, value: Any, allow_zero: bool = False) -> float:
    """``value`` as a float, raising a ``ValueError`` unless it is finite and > 0 (or ≥ 0)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}.") from None
    ok = v >= 0 if allow_zero else v > 0
    if isinstance(value, bool) or not ok or v != v or v == float("inf"):
        raise ValueError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {value!r}.")
    return v


class PosteriorMixin:
    """The models that accept ``fit(target, prior=broad)`` (paper §4, App. D).

    With ``prior``, ``anchors`` are the target anchors: ``prior`` is a broad
    :class:`AnchorSet` or (N, d) array, fitted with a clone of this model's parameters, or an
    already fitted model of the same class. The broad fit sets the prior, the target anchors
    update it, and the posterior summary becomes this model's fitted parameters; ``prior_``
    holds the broad model. Each model documents its update.

    Subclasses implement ``_check_posterior_params(d)`` (returns the checked
    hyperparameters) and ``_fit_posterior(target, prior, hyper)``, and list in
    ``_posterior_attributes`` the fitted attributes that only an adapted model has.
    """

    #: Fewest target anchors the posterior update needs.
    min_target_anchors: int = 1
    #: Why (completes the error message).
    _min_target_reason: str = ""
    #: Parameters a fitted prior must share with the model.
    _prior_shared_params: tuple = ()
    #: Fitted attributes of an adapted model (removed by a plain fit).
    _posterior_attributes: tuple = ("prior_", "posterior_")

    @classmethod
    def tags(cls):
        return replace(super().tags(), accepts_prior=True)

    def fit(self, anchors: Any, prior: Any = None):
        """Fit to ``anchors``, or with ``prior`` adapt the broad prior to them as target anchors."""
        for name in self._posterior_attributes:
            self.__dict__.pop(name, None)
        if prior is None:
            return super().fit(anchors)
        target = prepare_anchors(anchors, type(self).__name__)
        prior, hyper = resolve_prior(self, prior, target)
        target = self._begin_fit(target, 1)
        self._fit_posterior(target, prior, hyper)
        self.prior_ = prior
        return self._end_fit(target)

    def to(self, device: Any):
        """Move fitted tensors, the prior and the posterior summaries to ``device``; returns self."""
        super().to(device)
        for name in self._posterior_attributes:
            value = getattr(self, name, None)
            if value is not None and hasattr(value, "to"):
                setattr(self, name, value.to(device))
        return self
