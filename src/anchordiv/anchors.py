"""Anchor sets: the (weighted) empirical anchor measure q = Σ_i w_i δ_{γ_i}.

Kannan, Park, Veitch (2026), §2 and §5.2. An anchor set is a finite sample of text
embeddings γ_i with non-negative weights w_i (uniform by default). A mixture
q_p = Σ_j p_j q_j of several sets is again a weighted anchor set.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ._backend import as_tensor, positive_int
from ._util import EmbeddingRows
from .linalg import unit_rows


class AnchorSet(EmbeddingRows):
    """A weighted set of anchor embeddings.

    Parameters
    ----------
    embeddings : array-like of shape (N, d)
        Anchor embeddings γ_i (numpy array or torch tensor). Usually unit-norm text
        embeddings of a contrastive model.
    texts : sequence of str, optional
        The anchor phrases, one per row.
    weights : array-like of shape (N,), optional
        Non-negative weights w_i, normalised to sum to 1. Uniform when omitted.

    Notes
    -----
    The anchor measure is :math:`q = \\sum_i w_i \\delta_{\\gamma_i}`; its cumulant
    generating function :math:`\\kappa(\\eta) = \\log \\sum_i w_i \\exp(\\eta^\\top\\gamma_i)`
    defines the softmax anchor divergence (paper eq. 2.2).

    Examples
    --------
    >>> import numpy as np, anchordiv as ad
    >>> A = ad.AnchorSet(np.eye(3), texts=["a", "b", "c"])
    >>> len(A), A.dim
    (3, 3)
    """

    def __init__(self, embeddings: Any, texts: Sequence[str] | None = None, weights: Any = None):
        emb, kind = as_tensor(embeddings, "embeddings")
        self.embeddings: torch.Tensor = emb
        self._is_numpy = kind.is_numpy
        n = emb.shape[0]
        if texts is not None:
            texts = list(texts)
            if len(texts) != n:
                raise ValueError(f"texts has {len(texts)} entries but embeddings has {n} rows; pass one text per anchor.")
        self.texts: list[str] | None = texts
        if weights is None:
            w = torch.full((n,), 1.0 / n, dtype=torch.float64, device=emb.device)
        else:
            w, _ = as_tensor(weights, "weights", ndim=1, device=emb.device)
            w = w.to(torch.float64)
            if w.shape[0] != n:
                raise ValueError(f"weights has {w.shape[0]} entries but embeddings has {n} rows; pass one weight per anchor.")
            if bool((w < 0).any()):
                raise ValueError("weights must be non-negative; got a negative weight.")
            total = float(w.sum())
            if total <= 0:
                raise ValueError("weights are all zero; give at least one anchor positive weight.")
            if total == float("inf"):
                raise ValueError("weights sum to more than the largest float64 (the sum overflows); "
                                 "divide them by a common factor (only their ratios matter).")
            w = w / total
        self.weights: torch.Tensor = w

    @classmethod
    def from_texts(cls, texts: Sequence[str], encoder: Any, weights: Any = None) -> "AnchorSet":
        """Anchors written by hand: ``texts`` embedded by ``encoder`` (an
        :class:`anchordiv.encoders.Encoder`, anything with ``encode_text``, or a spec such as
        ``"minilm"`` loaded with :func:`anchordiv.encoders.load`), with optional ``weights``.

        Blank texts and repeats are errors naming them (each anchor is one distinct phrase).
        """
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise ValueError("texts must be a list of anchor phrases, e.g. ['a photo of a husky', 'a photo of a beagle'].")
        texts = list(texts)
        if not texts:
            raise ValueError("texts is empty; write at least one anchor phrase.")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"texts[{i}] is {t!r}; every anchor must be a non-blank string.")
        texts = [t.strip() for t in texts]
        seen: dict[str, int] = {}
        for i, t in enumerate(texts):
            if t in seen:
                raise ValueError(f"texts[{i}] repeats texts[{seen[t]}] ({t!r}); give each anchor once "
                                 "(weights= sets how much each counts).")
            seen[t] = i
        if isinstance(encoder, str):
            from . import encoders

            encoder = encoders.load(encoder)
        if not callable(getattr(encoder, "encode_text", None)):
            raise ValueError(f"encoder must be an encoder with encode_text (or a spec such as 'minilm'), "
                             f"got {type(encoder).__name__}.")
        return cls(np.asarray(encoder.encode_text(texts)), texts=texts, weights=weights)

    # ------------------------------------------------------------------ basics
    @property
    def device(self) -> torch.device:
        return self.embeddings.device

    def __repr__(self) -> str:
        uniform = bool(torch.allclose(self.weights, self.weights.new_full(self.weights.shape, 1.0 / len(self))))
        w = "uniform" if uniform else "weighted"
        return f"AnchorSet(n={len(self)}, dim={self.dim}, {w}{', with texts' if self.texts else ''})"

    def _take(self, idx: torch.Tensor, weights: torch.Tensor) -> "AnchorSet":
        texts = [self.texts[i] for i in idx.tolist()] if self.texts is not None else None
        return AnchorSet(self.embeddings[idx], texts=texts, weights=weights)

    def support(self) -> "AnchorSet":
        """The anchors with positive weight (a zero-weight anchor carries no mass)."""
        keep = torch.nonzero(self.weights > 0).flatten()
        if keep.numel() == len(self):
            return self
        return self._take(keep, self.weights[keep])

    def normalized(self) -> "AnchorSet":
        """A copy with every embedding scaled to unit ℓ2 norm."""
        return AnchorSet(unit_rows(self.embeddings, "embeddings"), texts=self.texts, weights=self.weights)

    def subsample(self, n: int, seed: int | None = 0) -> "AnchorSet":
        """Draw ``n`` anchors uniformly without replacement, reproducibly for a given ``seed``.

        The kept anchors keep their relative weights (renormalised).
        """
        n = positive_int(n, "n")
        if n > len(self):
            raise ValueError(f"n={n} exceeds the {len(self)} anchors available; pass n <= {len(self)}.")
        g = torch.Generator().manual_seed(0 if seed is None else int(seed))
        idx = torch.randperm(len(self), generator=g)[:n].sort().values.to(self.device)
        w = self.weights[idx]
        if float(w.sum()) <= 0:
            w = torch.ones_like(w)
        return self._take(idx, w)

    # ---------------------------------------------------------------- mixtures
    @classmethod
    def mixture(cls, sets: Sequence["AnchorSet"], proportions: Sequence[float]) -> "AnchorSet":
        """The weighted empirical measure q = Σ_j p_j q_j (paper §5.2).

        Each set contributes total mass p_j, spread by its own weights. Proportions are
        non-negative and normalised to sum to 1.
        """
        sets = list(sets)
        if not sets:
            raise ValueError("sets is empty; pass at least one AnchorSet.")
        if any(not isinstance(s, AnchorSet) for s in sets):
            raise ValueError("sets must contain AnchorSet objects.")
        p = np.asarray(proportions, dtype=np.float64)
        if p.ndim != 1 or p.shape[0] != len(sets):
            raise ValueError(f"proportions must have one entry per set ({len(sets)}), got shape {p.shape}.")
        if not np.all(np.isfinite(p)) or np.any(p < 0):
            raise ValueError("proportions must be finite and non-negative.")
        if p.sum() <= 0:
            raise ValueError("proportions are all zero; give at least one set positive mass.")
        p = p / p.sum()
        dims = {s.dim for s in sets}
        if len(dims) != 1:
            raise ValueError(f"all anchor sets must have the same dimension, got {sorted(dims)}.")
        devices = {s.device for s in sets}
        if len(devices) != 1:
            raise ValueError(f"all anchor sets must be on one device, got {sorted(map(str, devices))}.")
        dtype = torch.float64 if any(s.embeddings.dtype == torch.float64 for s in sets) else torch.float32
        emb = torch.cat([s.embeddings.to(dtype) for s in sets])
        w = torch.cat([pj * s.weights for pj, s in zip(p, sets)])
        texts = None
        if all(s.texts is not None for s in sets):
            texts = [t for s in sets for t in s.texts]
        return cls(emb, texts=texts, weights=w)
