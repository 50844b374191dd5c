"""Softmax anchor divergence: the empirical anchor measure (paper §2, Table 1)."""

from __future__ import annotations

import torch

from ..anchors import AnchorSet
from .base import AnchorModel


ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


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
    statistics stream over the anchors in chunks of ``anchor_chunk`` with a running
    log-sum-exp, so memory does not grow with the number of anchors N beyond the anchors
    themselves. Reference: Kannan, Park, Veitch (2026), §2, eq. 2.2 and App. F.4.

    Parameters
    ----------
    tau, logit_scale : float
        Temperature, or its inverse. Give exactly one.
    anchor_chunk : int, default 8192
        Anchors processed per step of the running log-sum-exp.

    Attributes
    ----------
    anchors_ : torch.Tensor (N, d)
        The anchors with positive weight (not copied).
    log_weights_ : torch.Tensor (N,)
        log w_i (float64).
    """

    def __init__(self, tau: float | None = None, logit_scale: float | None = None, anchor_chunk: int = 8192):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.anchor_chunk = anchor_chunk

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

    def _flops_per_row(self) -> float:
        return 4.0 * self.n_anchors_ * self.dim_

    def _grad(self, eta: torch.Tensor) -> torch.Tensor:
        # On accelerators ∇κ alone is one fused attention call; on CPU the chunked
        # log-sum-exp below is as fast (measured) and also bounds memory.
        if eta.device.type != "cpu" and eta.dtype in ATTENTION_DTYPES:
            return attention_grad(eta, self.anchors_, self._cast("log_weights_", eta), self._uniform)
        return self._cgf_and_grad(eta)[1]

    def _cgf_and_grad(self, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = eta.shape[0]
        running_max = eta.new_full((n,), -torch.inf)
        total = eta.new_zeros(n)
        acc = eta.new_zeros(n, self.dim_)
        log_w = self._cast("log_weights_", eta)
        step = max(1, int(self.anchor_chunk))
        for start in range(0, self.n_anchors_, step):
            gamma = self.anchors_[start:start + step].to(eta.dtype)
            logits = torch.addmm(log_w[start:start + step], eta, gamma.T)
            new_max = torch.maximum(running_max, logits.max(dim=1).values)
            rescale = torch.exp(running_max - new_max)
            p = torch.exp(logits - new_max[:, None])
            total = total * rescale + p.sum(dim=1)
            acc = torch.addmm(acc * rescale[:, None], p, gamma)
            running_max = new_max
        return running_max + total.log(), acc / total[:, None]
