"""Why neighbours are neighbours: each item's softmax over the anchors, and a set's coverage.

Under an empirical anchor measure (weights w_i, anchors γ_i, temperature τ) an item λ
sees the anchors through

.. math::

    P(i \\mid \\lambda) = \\frac{w_i \\exp(\\lambda^\\top\\gamma_i/\\tau)}{\\sum_j w_j \\exp(\\lambda^\\top\\gamma_j/\\tau)},

the distribution whose KL divergences give the softmax anchor divergence (Kannan, Park,
Veitch 2026, §3). Two items are close when they put their mass on the same anchors.
:func:`explain` reports, per item, the entropy H = −Σ_i P(i|λ) log P(i|λ), the
effective number of anchors exp(H) (1 when one anchor takes all the mass, N for the
uniform distribution) and the top anchors with their probabilities;
:meth:`Explanation.coverage` summarises a collection: how many items put most of their
mass on a few anchors and which anchors are never any item's top one.

Python::

    import anchordiv as ad
    ex = ad.diagnostics.explain(anchor_set, X, tau=0.05, top=3)
    ex.top_anchors(0)        # [("no pleural effusion", 0.61), ...]
    ex.coverage()            # items concentrated on few anchors, anchors never top
    ad.Softmax(tau=0.05).fit(anchor_set).explain(X)   # the same from a fitted model
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from ._util import check_tau, positive_int
from .anchors import AnchorSet
from .exact import largest_k

__all__ = ["Explanation", "Coverage", "explain"]

#: Bytes of one block of float64 item-anchor log-probabilities.
_BLOCK_BYTES = 64 * 2**20


@dataclass
class Coverage:
    """How a collection uses an anchor set (:meth:`Explanation.coverage`).

    Attributes
    ----------
    n_items, n_anchors : int
    few, mass : int, float
        An item is concentrated when its ``few`` top anchors hold at least ``mass`` of it.
    n_concentrated : int
        Items concentrated on ``few`` anchors.
    top_counts : numpy.ndarray of int, shape (N,)
        For each anchor, the items whose top anchor it is.
    never_top : list
        The anchors (texts, else indices) that are no item's top anchor.
    median_effective : float
        Median effective number of anchors exp(H) over the items.
    """

    n_items: int
    n_anchors: int
    few: int
    mass: float
    n_concentrated: int
    top_counts: np.ndarray
    never_top: list
    median_effective: float

    def summary(self) -> str:
        """One line."""
        shown = ", ".join(map(str, self.never_top[:5])) + (" …" if len(self.never_top) > 5 else "")
        return (f"{self.n_concentrated} of {self.n_items} items put ≥ {self.mass:g} of their mass on ≤ {self.few} "
                f"anchors; median effective number {self.median_effective:.3g} of {self.n_anchors}; "
                f"{len(self.never_top)} anchors never top" + (f" ({shown})" if shown else ""))


@dataclass
class Explanation:
    """Each item's softmax over the anchors, summarised (:func:`explain`).

    Attributes
    ----------
    entropy : numpy.ndarray, shape (n,)
        H = −Σ_i P(i|λ) log P(i|λ), in nats (float64).
    effective_number : numpy.ndarray, shape (n,)
        exp(H), between 1 and N.
    top_indices : numpy.ndarray of int, shape (n, top)
        The anchors of largest probability, most probable first.
    top_probabilities : numpy.ndarray, shape (n, top)
        Their probabilities.
    argmax_counts : numpy.ndarray of int, shape (N,)
        For each anchor, the items whose top anchor it is.
    top_mass : numpy.ndarray, shape (n, top)
        Cumulative probability of the first j + 1 top anchors.
    texts : list of str or None
        The anchor phrases, when known.
    """

    entropy: np.ndarray
    effective_number: np.ndarray
    top_indices: np.ndarray
    top_probabilities: np.ndarray
    argmax_counts: np.ndarray
    texts: list | None = None

    @property
    def top_mass(self) -> np.ndarray:
        return np.cumsum(self.top_probabilities, axis=1)

    def name(self, i: int) -> Any:
        """Anchor ``i`` by its text, else its index."""
        return self.texts[i] if self.texts else int(i)

    def top_anchors(self, item: int, k: int | None = None) -> list[tuple[Any, float]]:
        """``[(anchor, probability)]`` of one item, most probable first."""
        k = self.top_indices.shape[1] if k is None else min(int(k), self.top_indices.shape[1])
        return [(self.name(i), float(p)) for i, p in zip(self.top_indices[item, :k], self.top_probabilities[item, :k])]

    def coverage(self, few: int = 3, mass: float = 0.5) -> Coverage:
        """How many items hold ≥ ``mass`` of their probability on ≤ ``few`` anchors, and which
        anchors are never any item's top one.

        ``few`` is at most the ``top`` the explanation kept.
        """
        few = positive_int(few, "few")
        if few > self.top_indices.shape[1]:
            raise ValueError(f"few = {few} exceeds the {self.top_indices.shape[1]} top anchors kept; call "
                             f"explain(..., top={few}) or lower few.")
        if not 0 < float(mass) <= 1:
            raise ValueError(f"mass must be in (0, 1], got {mass!r}.")
        concentrated = int((self.top_mass[:, few - 1] >= mass).sum())
        never = [self.name(i) for i in np.flatnonzero(self.argmax_counts == 0)]
        return Coverage(int(self.entropy.size), int(self.argmax_counts.size), few, float(mass), concentrated,
                        self.argmax_counts, never, float(np.median(self.effective_number)))

    def to_frame(self) -> Any:
        """A pandas DataFrame: entropy, effective_number, top_anchor_j, top_p_j per item."""
        import pandas as pd

        cols: dict[str, Any] = {"entropy": self.entropy, "effective_number": self.effective_number}
        for j in range(self.top_indices.shape[1]):
            cols[f"top_anchor_{j + 1}"] = [self.name(i) for i in self.top_indices[:, j]]
            cols[f"top_p_{j + 1}"] = self.top_probabilities[:, j]
        return pd.DataFrame(cols)


def _as_tensor(x: Any, name: str) -> torch.Tensor:
    t = x.detach().cpu() if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    t = t.to(torch.float64)
    if t.ndim == 1:
        t = t[None, :]
    if t.ndim != 2 or t.shape[0] == 0:
        raise ValueError(f"{name} must be a non-empty (n, d) array, got shape {tuple(t.shape)}.")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or inf.")
    return t


def explain(anchors: Any, X: Any, tau: float, top: int = 5, texts: Sequence[str] | None = None,
            log_weights: Any = None) -> Explanation:
    """Each item's softmax P(i|λ) ∝ w_i exp(λᵀγ_i/τ) over the anchors, summarised (float64).

    Parameters
    ----------
    anchors : AnchorSet or array-like, shape (N, d)
        The anchor measure (an AnchorSet brings its weights and texts).
    X : array-like or torch.Tensor, shape (n, d) or (d,)
        The items (queries or a whole collection).
    tau : float
        Temperature τ > 0.
    top : int, optional
        Top anchors kept per item (at most N).
    texts : sequence of str, optional
        Anchor phrases (default: the AnchorSet's).
    log_weights : array-like, shape (N,), optional
        log w_i (default: the AnchorSet's weights, else uniform).

    Returns
    -------
    Explanation
    """
    if isinstance(anchors, AnchorSet):
        texts = texts if texts is not None else (list(anchors.texts) if anchors.texts else None)
        if log_weights is None:
            log_weights = anchors.weights.detach().cpu().to(torch.float64).log()
        anchors = anchors.embeddings
    A = _as_tensor(anchors, "anchors")
    Xt = _as_tensor(X, "X")
    if Xt.shape[1] != A.shape[1]:
        raise ValueError(f"X has dimension {Xt.shape[1]} but the anchors have {A.shape[1]}; use one encoder.")
    tau = check_tau(tau)
    N = A.shape[0]
    lw = torch.zeros(N, dtype=torch.float64) if log_weights is None else _as_tensor(log_weights, "log_weights")[0]
    if lw.shape[0] != N:
        raise ValueError(f"log_weights has {lw.shape[0]} entries for {N} anchors.")
    if texts is not None and len(texts) != N:
        raise ValueError(f"texts has {len(texts)} entries for {N} anchors.")
    k = min(positive_int(top, "top"), N)
    step = max(1, _BLOCK_BYTES // (8 * N))
    H, top_i, top_p = [], [], []
    counts = torch.zeros(N, dtype=torch.int64)
    for start in range(0, Xt.shape[0], step):
        logp = torch.log_softmax(Xt[start:start + step] @ A.T / tau + lw, dim=1)
        p = logp.exp()
        H.append(-torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(1))
        vals, idx = largest_k(logp, None, k)
        top_i.append(idx)
        top_p.append(vals.exp())
        counts += torch.bincount(idx[:, 0], minlength=N)
    entropy = torch.cat(H).clamp_min(0).numpy()
    return Explanation(entropy, np.exp(entropy), torch.cat(top_i).numpy(), torch.cat(top_p).numpy(),
                       counts.numpy(), list(texts) if texts is not None else None)
