"""Softmax anchor divergence: the empirical anchor measure (paper §2, Table 1)."""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import torch

from .._backend import concat, in_dtype
from .._gemm import matmul_t
from ..anchors import AnchorSet
from ..linalg import row_norms
from .base import AnchorModel, FeatureBound, require_finite
from .params import Param


ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Rows per block of the streamed log-sum-exp; one (rows × anchor_batch_size) logits buffer is reused.
ROW_BLOCK = 4096
#: λ of the probabilistic rounding bound λ√n·u of a dot product of length n (Higham & Mary 2019).
ROUNDING_LAMBDA = 8.0


def attention_grad(eta: torch.Tensor, anchors: torch.Tensor, log_weights: torch.Tensor, uniform: bool) -> torch.Tensor:
    """∇κ(η) = Σ_i softmax_i(ηᵀγ_i + log w_i) γ_i as fused attention (keys = values = anchors)."""
    gamma = anchors.to(eta.dtype)
    mask = None if uniform else log_weights.to(eta.dtype)[None, :]
    return torch.nn.functional.scaled_dot_product_attention(eta[None], gamma[None], gamma[None], attn_mask=mask, scale=1.0)[0]


class Softmax(AnchorModel):
    """Empirical (weighted) anchor measure; the divergence is a KL of contrastive softmaxes.

    .. math::

        \\kappa(\\eta) = \\log \\sum_i w_i \\exp(\\eta^\\top\\gamma_i), \\qquad
        \\nabla\\kappa(\\eta) = \\sum_i \\mathrm{softmax}_i(\\eta^\\top\\gamma_i + \\log w_i)\\,\\gamma_i,

        d(\\lambda_1\\|\\lambda_2) = \\mathrm{KL}(P(\\cdot|\\lambda_1) \\| P(\\cdot|\\lambda_2)),
        \\quad P(i|\\lambda) \\propto w_i \\exp(\\lambda^\\top\\gamma_i/\\tau).

    ∇κ is attention with keys = values = anchors and log-weights as a logit bias. The
    statistics stream over the anchors in chunks of ``anchor_batch_size`` with a running
    log-sum-exp, in blocks of ``ROW_BLOCK`` rows that reuse one logits buffer, so memory
    does not grow with the number of anchors N beyond the anchors themselves.
    Reference: Kannan, Park, Veitch (2026), §2, eq. 2.2 and App. F.4.

    With N ≤ d anchors the symmetric feature maps use the probabilities themselves,
    d_sym(q, g) = ½ Σ_i (p_q,i − p_g,i)(log p_q,i − log p_g,i) (``feature_space_ =
    "probabilities"``): o(q) = ½ p_qᵀlog p_q, φ(q) = ½[a p_q, log p_q / a, 1],
    ψ(g) = [log p_g / a, a p_g, −p_gᵀlog p_g]. These 2N + 1 features come from float64
    log-probabilities, which keep near one-hot softmaxes (few anchors, small τ) resolvable
    in float32, where differences of ∇κ are not. The scale a (``feature_scale_``, the square
    root of the bound on ‖log p‖ over the bound 1 on ‖p‖) balances the two blocks, so that
    the key norms, and the rounding of float32 L2 indexes built on them, stay small.

    Parameters
    ----------
    tau, logit_scale : float
        Temperature, or its inverse. Give exactly one.
    anchor_batch_size : int, default 1024
        Anchors processed per step of the running log-sum-exp.

    Attributes
    ----------
    anchors_ : torch.Tensor (N, d)
        The anchors with positive weight (not copied).
    log_weights_ : torch.Tensor (N,)
        log w_i (float64).
    feature_scale_ : float
        a of the probability features (N ≤ d only).
    """

    @classmethod
    def tags(cls):
        return replace(super().tags(), nonparametric=True)

    PARAMS = (Param("anchor_batch_size", "int", 1024, "Anchors processed per step of the running log-sum-exp.",
                    low=1),)
    color = "#1f77b4"

    def __init__(self, *, tau: float | None = None, logit_scale: float | None = None, anchor_batch_size: int = 1024):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.anchor_batch_size = anchor_batch_size

    def fit(self, anchors, prior=None) -> "Softmax":
        """Store the anchor measure. Softmax is nonparametric and takes no prior."""
        if prior is not None:
            raise ValueError(
                "Softmax is nonparametric and takes no prior; to combine broad and target anchors "
                "build the measure directly with AnchorSet.mixture([broad, target], [1 - p, p])."
            )
        return super().fit(anchors)

    def _fit(self, anchors: AnchorSet) -> None:
        self.anchors_ = anchors.embeddings
        self.log_weights_ = anchors.weights.log()
        self._uniform = bool((anchors.weights == anchors.weights[0]).all())
        # N ≤ d: the probability form below is both smaller (2N + 1 ≤ 2d + 1) and better
        # conditioned; otherwise the centred λ-unit form of AnchorModel.
        self.feature_space_ = "probabilities" if len(anchors) <= anchors.dim else "embedding"
        if self.feature_space_ == "probabilities":
            self.feature_scale_ = math.sqrt(self._log_prob_bound())

    def _log_prob_bound(self) -> float:
        """A bound on ‖log p‖ for unit-norm inputs: |log p_i| ≤ 2GR/τ − log w_i (G = max‖γ‖,
        R the input norm)."""
        B = 2 * self._grad_norm_bound() * self.INPUT_NORM / self.tau_ - self.log_weights_.to(torch.float64)
        return float(B.norm())

    def _grad_norm_bound(self) -> float:
        return float(row_norms(self.anchors_).max())  # ∇κ lies in the anchors' convex hull

    def key_norm_bound(self, symmetric: bool = True) -> float | None:
        """Probability features: ‖log p‖ ≤ L (:meth:`_log_prob_bound`), ‖p‖ ≤ 1 and
        0 ≤ −pᵀlog p ≤ log N, so ‖ψ‖² ≤ L²/a² + a² + (log N)² = 2L + (log N)²."""
        if not symmetric or self.feature_space_ != "probabilities":
            return super().key_norm_bound(symmetric)
        a, L = self.feature_scale_, self._log_prob_bound()
        return math.sqrt(L ** 2 / a ** 2 + a ** 2 + math.log(self.n_anchors_) ** 2)

    def anchor_logits(self, X: torch.Tensor) -> torch.Tensor:
        """log w_i + λᵀγ_i/τ for every row λ of ``X`` and anchor i (log P(i | λ) up to a per-row
        constant; its argmax is the item's most probable anchor), in the dtype of ``X``."""
        self._check_fitted()
        X = torch.as_tensor(X).to(self.device)
        return torch.addmm(in_dtype(self.log_weights_, X.dtype), X / self.tau_, in_dtype(self.anchors_, X.dtype).T)

    # --------------------------------------------------- probability features
    def _log_probs(self, X: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """log P(i | λ) = log w_i + λᵀγ_i/τ − κ for every anchor, computed in ``dtype`` (float64 by default)."""
        log_w, gamma = self.log_weights_.to(dtype), self.anchors_.to(dtype).contiguous()
        logits = concat([matmul_t(x.to(dtype).contiguous(), gamma).mul_(1 / self.tau_).add_(log_w)
                         for x in (X[sl] for sl in self._chunks(X.shape[0], "softmax"))])
        return logits.sub_(torch.logsumexp(logits, dim=1, keepdim=True))

    def _probability_terms(self, X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(a p, log p / a, pᵀlog p) in the dtype of ``X``, or in float64 with a warning where
        that dtype cannot hold them: the smallest signal, |log P| of the most probable anchor,
        is then below the dtype's smallest normal number."""
        logp = self._log_probs(X)
        p, a = logp.exp(), self.feature_scale_
        dtype = X.dtype
        if dtype != torch.float64 and bool((logp.amax(dim=1).abs() < torch.finfo(dtype).tiny).any()):
            warnings.warn(
                f"{dtype} cannot resolve these softmax divergences at tau={self.tau_:g} (near one-hot "
                "probabilities); computing them in float64. Indexes that store float32 (faiss, milvus) "
                "may misorder such neighbours.", RuntimeWarning, stacklevel=4)
            dtype = torch.float64
        return (a * p).to(dtype), (logp / a).to(dtype), (p * logp).sum(1).to(dtype)

    def _query_terms(self, Q: torch.Tensor, symmetric: bool):
        if not symmetric or self.feature_space_ != "probabilities":
            return super()._query_terms(Q, symmetric)
        # d_sym = ½ Σ_i (p_q,i − p_g,i)(log p_q,i − log p_g,i): the symmetrized KL (Jeffreys)
        p, logp, cross = self._probability_terms(Q)
        return 0.5 * cross, require_finite(0.5 * torch.cat([p, logp, torch.ones_like(p[:, :1])], dim=1), self,
                                           "query features")

    def _key_terms(self, G: torch.Tensor, symmetric: bool) -> torch.Tensor:
        if not symmetric or self.feature_space_ != "probabilities":
            return super()._key_terms(G, symmetric)
        p, logp, cross = self._probability_terms(G)
        return require_finite(torch.cat([logp, p, -cross[:, None]], dim=1), self, "key features")

    def _key_terms_in_dtype(self, G: torch.Tensor, symmetric: bool) -> torch.Tensor:
        """ψ = [log p / a, a p, −pᵀlog p] from one GEMM of logits in the dtype of ``G``, written
        into one buffer (the float64 log-probabilities of :meth:`_key_terms` are skipped)."""
        if not symmetric or self.feature_space_ != "probabilities":
            return super()._key_terms(G, symmetric)
        logp, a, n = self._log_probs(G, G.dtype), self.feature_scale_, self.n_anchors_
        psi = G.new_empty(G.shape[0], 2 * n + 1)
        p = torch.exp(logp, out=psi[:, n:2 * n])
        psi[:, 2 * n] = -(p * logp).sum(1)
        p.mul_(a)
        torch.mul(logp, 1 / a, out=psi[:, :n])
        return require_finite(psi, self, "key features")

    def feature_bound(self, symmetric: bool = True) -> FeatureBound | None:
        """Co-coercivity of ∇κ. Its Jacobian is the covariance of the anchors under P(·|λ), whose variance
        in any direction is at most L = min(max‖γ‖², D²/4) (Popoviciu; D the anchors' diameter,
        :meth:`_diameter_bound`), so ΔηᵀΔ∇κ ≥ ‖Δ∇κ‖²/L and d_sym ≥ ‖Δ∇κ‖²/(2L): u = ∇κ − c (ψ's first
        block; φ's second times 2τ). Probability features: (x − y)(log x − log y) ≥ (x − y)²
        on [0, 1], so d_sym ≥ ½‖Δp‖²: u = a p (ψ's second block; φ's first times 2), w = 1/(2a²).
        ``error``: the float32 rounding of u: the relative error e + 2u of each p_i
        (:meth:`key_error_bound`) and λ√N·u of the sum Σ p_i γ_i."""
        if not symmetric:
            return None
        n, d, u = self.n_anchors_, self.dim_, torch.finfo(torch.float32).eps / 2
        error = self._log_prob_error(torch.float32) + (2 + ROUNDING_LAMBDA * math.sqrt(n)) * u  # p_i, then Σ p_i γ_i
        if self.feature_space_ == "probabilities":
            a = self.feature_scale_
            return FeatureBound(slice(n, 2 * n), slice(0, n), 2.0, 0.5 / a ** 2, error * a)
        G = self._grad_norm_bound()
        lipschitz = min(G ** 2, self._diameter_bound() ** 2 / 4)
        return FeatureBound(slice(0, d), slice(d, 2 * d), 2.0 * self.tau_, 0.5 / lipschitz, error * G)

    def _diameter_bound(self, exact_up_to: int = 8192) -> float:
        """An upper bound on max‖γ_i − γ_j‖: exact (float64, blocked, rounded up) for at most
        ``exact_up_to`` anchors, else twice the largest distance to their mean."""
        gamma = self.anchors_.to(torch.float64)
        if gamma.shape[0] > exact_up_to:
            return 2 * float((gamma - gamma.mean(0)).norm(dim=1).max()) * (1 + 1e-9)
        sq, widest = (gamma * gamma).sum(1), 0.0
        for start in range(0, gamma.shape[0], 1024):
            block = gamma[start:start + 1024]
            dist2 = sq[start:start + 1024, None] + sq[None, :] - 2 * block @ gamma.T
            widest = max(widest, float(dist2.max()))
        return math.sqrt(max(widest, 0.0) + 1e-12 * float(sq.max())) * (1 + 1e-9)

    def _log_prob_error(self, dtype: torch.dtype) -> float:
        """The bound e of :meth:`key_error_bound` on the error of log p_i computed in ``dtype``."""
        u, lam = torch.finfo(dtype).eps / 2, ROUNDING_LAMBDA
        logit = self._grad_norm_bound() * self.INPUT_NORM / self.tau_
        span = logit + float(self.log_weights_.abs().max())
        return 2 * (lam * math.sqrt(self.dim_) * u * logit + 2 * u * span) + (lam * math.sqrt(self.n_anchors_) + 2) * u * 2 * span

    def key_error_bound(self, dtype: torch.dtype, symmetric: bool = True) -> float:
        """In-dtype probability features. With unit roundoff u and the probabilistic bound
        λ√n·u of a length-n dot product (Higham & Mary 2019; λ = :data:`ROUNDING_LAMBDA`, failing
        with probability below 2exp(−λ²/2) ≈ 1e-14 per logit), a logit λᵀγ_i/τ + log w_i is off by
        at most e_l = λ√d·u·RG/τ + 2u·S (S = RG/τ + max|log w|, the largest logit), log p_i by
        e = 2e_l + (λ√N + 2)·u·2S (the log-sum-exp too), p_i by p_i(e + 2u), and ψ = [log p/a, a p,
        −pᵀlog p] by √(N e²/a² + a²(e + 2u)² + ((e + 2u) log N + e)²) (Σ p_i |log p_i| ≤ log N)."""
        if not symmetric or self.feature_space_ != "probabilities" or dtype == torch.float64:
            return 0.0
        u, n, a = torch.finfo(dtype).eps / 2, self.n_anchors_, self.feature_scale_
        e = self._log_prob_error(dtype)
        return math.sqrt(n * e * e / a ** 2 + (a * (e + 2 * u)) ** 2 + ((e + 2 * u) * math.log(n) + e) ** 2)

    def _flops_per_row(self) -> float:
        return 4.0 * self.n_anchors_ * self.dim_

    def _grad(self, eta: torch.Tensor) -> torch.Tensor:
        # On accelerators ∇κ alone is one fused attention call; on CPU the chunked
        # log-sum-exp below is as fast (measured) and also bounds memory.
        if eta.device.type != "cpu" and eta.dtype in ATTENTION_DTYPES:
            return attention_grad(eta, self.anchors_, in_dtype(self.log_weights_, eta.dtype), self._uniform)
        return self._cgf_and_grad(eta)[1]

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # One pass over the anchors with a running max m: per block of rows and chunk of
        # anchors, L = ηΓᵀ (+ log w), m' = max(m, max_i L), then the sum and Σ p_i γ_i
        # are rescaled by exp(m − m') and p = exp(L − m') is added in place. A uniform
        # measure adds its constant log w to κ at the end instead of to every logit.
        n, d = eta.shape
        n_anchors = self.anchors_.shape[0]
        step = min(max(1, int(self.anchor_batch_size)), n_anchors)
        rows = min(ROW_BLOCK, n)
        uniform = getattr(self, "_uniform", False)
        log_w = in_dtype(self.log_weights_, eta.dtype)
        buf = eta.new_empty(rows * step)
        run_max, total, acc = eta.new_empty(n), eta.new_empty(n), eta.new_empty(n, d)
        for start in range(0, n_anchors, step):
            stop = min(start + step, n_anchors)
            gamma = self.anchors_[start:stop].to(eta.dtype)
            bias = None if uniform else log_w[start:stop]
            for r0 in range(0, n, rows):
                r1 = min(r0 + rows, n)
                logits = buf[:(r1 - r0) * (stop - start)].view(r1 - r0, stop - start)
                if bias is None:
                    torch.mm(eta[r0:r1], gamma.T, out=logits)
                else:
                    torch.addmm(bias, eta[r0:r1], gamma.T, out=logits)
                m = run_max[r0:r1]
                if start == 0:
                    torch.amax(logits, dim=1, out=m)
                    logits.sub_(m[:, None]).exp_()
                    torch.sum(logits, dim=1, out=total[r0:r1])
                    torch.mm(logits, gamma, out=acc[r0:r1])
                    continue
                new_max = torch.maximum(m, logits.amax(dim=1))
                rescale = m.sub_(new_max).exp_()
                logits.sub_(new_max[:, None]).exp_()
                total[r0:r1].mul_(rescale).add_(logits.sum(dim=1))
                acc[r0:r1].mul_(rescale[:, None]).addmm_(logits, gamma)
                m.copy_(new_max)
        kappa = total.log().add_(run_max)
        if uniform:
            kappa.add_(log_w[0])
        return kappa, acc.div_(total[:, None])
