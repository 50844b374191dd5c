"""How key and query features are laid out as vectors for an L2 nearest-neighbour index.

Every geometry has the inner-product form ``d(q, g) = o(q) − φ(q)ᵀψ(g)`` (see
:class:`anchordiv.Geometry`). Two layouts turn it into an L2 search:

``euclidean``
    For an :class:`~anchordiv.models.base.EuclideanModel`, ψ(g) = [z_g, ‖z_g‖²] and
    φ(q) = [2 z_q, −1], so the stored vector is z_g, the query vector is z_q and the
    squared L2 distance is the divergence itself.

``augmented``
    For every other geometry, the maximum-inner-product search is reduced to an L2 search
    (Bachrach et al., 2014, "Speeding up the Xbox recommender system using a Euclidean
    transformation for inner-product spaces"): a key is stored as
    x = [ψ(g), √(M² − ‖ψ(g)‖²)], with M ≥ every stored ‖ψ‖, and a query is
    y = [φ(q), 0]. Then ‖y − x‖² = ‖φ‖² + M² − 2 φᵀψ, so the L2 order is the order of
    o(q) − φᵀψ. M is the geometry's analytic bound on ‖ψ‖ for unit-norm inputs
    (:meth:`anchordiv.Geometry.key_norm_bound`), fixed, so that later batches and parallel
    writers agree on it; keys beyond it are refused. A geometry without a bound gets
    ``norm_margin`` times the largest ‖ψ‖ of the first batch, and a later batch with a
    larger norm makes the owner re-augment every stored key with a new M
    (:meth:`VectorLayout.fits`, :meth:`VectorLayout.grow`).

Stored vectors are float32, and ψ is recovered from them exactly (up to that rounding), so
an approximate shortlist can be re-ranked with exact divergences without a second copy.
"""

from __future__ import annotations

import numpy as np
import torch


class VectorLayout:
    """Maps key features ψ and query terms (o, φ) to float32 vectors for an L2 index.

    Parameters
    ----------
    euclidean : bool
        Use the ``euclidean`` layout (the model is a :class:`EuclideanModel`); otherwise
        the ``augmented`` layout.
    feature_dim : int
        Dimension of ψ.
    norm_margin : float
        Factor ≥ 1 applied to the largest key norm when M is (re)set.
    max_norm : float, optional
        The bound M of the augmented layout (None until the first keys are seen).
    max_seen : float, optional
        Largest ‖ψ‖ seen so far.
    """

    def __init__(self, euclidean: bool, feature_dim: int, norm_margin: float = 1.25,
                 max_norm: float | None = None, max_seen: float | None = None, fixed: bool = False):
        self.fixed = bool(fixed)
        self.euclidean = bool(euclidean)
        self.feature_dim = int(feature_dim)
        self.norm_margin = float(norm_margin)
        self.max_norm = max_norm
        self.max_seen = max_seen

    @property
    def vector_dim(self) -> int:
        """Dimension of the stored vectors."""
        return self.feature_dim - 1 if self.euclidean else self.feature_dim + 1

    # ----------------------------------------------------------------- keys
    @staticmethod
    def _norms(psi: torch.Tensor) -> torch.Tensor:
        return psi.to(torch.float64).norm(dim=1)

    def fits(self, psi: torch.Tensor) -> bool:
        """Whether ``psi`` can be stored with the current M (always True for ``euclidean``)."""
        if self.euclidean:
            return True
        if self.max_norm is None:
            return False
        return float(self._norms(psi).max()) <= self.max_norm

    @classmethod
    def for_keys(cls, euclidean: bool, psi: torch.Tensor, norm_margin: float, bound: float | None) -> "VectorLayout":
        """The layout of the first keys: M = ``bound`` when the geometry gives an analytic bound on
        ‖ψ‖ for unit-norm inputs (fixed, so later batches and parallel writers agree), else
        ``norm_margin`` × the largest norm seen."""
        layout = cls(euclidean, psi.shape[1], norm_margin, fixed=bound is not None)
        if euclidean:
            return layout
        if bound is not None:  # the slack covers rounding of ψ computed in float32
            layout.max_norm, layout.max_seen = float(bound) * (1 + 1e-5), 0.0
            layout.check(psi)
        else:
            layout.grow(psi)
        return layout

    def check(self, psi: torch.Tensor) -> None:
        """Raise when a fixed bound M does not hold for ``psi`` (the inputs were not unit-norm)."""
        if self.fixed and not self.fits(psi):
            raise ValueError(
                f"Key features of norm {float(self._norms(psi).max()):.6g} exceed the bound M = {self.max_norm:.6g} "
                "that this geometry guarantees for unit-norm embeddings; normalise the vectors "
                "(X / ‖X‖, as CLIP-like encoders do) before adding them to an approximate index."
            )

    def grow(self, psi: torch.Tensor) -> None:
        """Set M to ``norm_margin`` × the largest norm among stored keys and ``psi``."""
        if self.euclidean:
            return
        largest = float(self._norms(psi).max())
        if self.max_seen is not None:
            largest = max(largest, self.max_seen)
        self.max_seen = largest
        self.max_norm = self.norm_margin * largest if largest > 0 else 1.0

    def keys(self, psi: torch.Tensor) -> np.ndarray:
        """Stored vectors (n, vector_dim), float32, C-contiguous, for key features ``psi``."""
        if self.euclidean:
            out = psi[:, :-1]
        else:
            if not self.fits(psi):
                raise ValueError("Key norms exceed the bound M of the augmented layout; call grow() first.")
            norms = self._norms(psi)
            self.max_seen = max(float(norms.max()), self.max_seen or 0.0)
            # written into one float32 array: no float64 copy of the block
            out = torch.empty(psi.shape[0], psi.shape[1] + 1, dtype=torch.float32)
            out[:, :-1] = psi.detach()
            out[:, -1] = (self.max_norm ** 2 - norms ** 2).clamp_min(0).sqrt()
        return np.ascontiguousarray(out.detach().to(torch.float32).cpu().numpy())

    def unpack(self, vectors: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Key features ψ (float32 tensor) recovered from stored vectors."""
        v = torch.as_tensor(np.asarray(vectors, dtype=np.float32) if not isinstance(vectors, torch.Tensor) else vectors)
        v = v.to(torch.float32)
        if self.euclidean:
            return torch.cat([v, (v * v).sum(-1, keepdim=True)], dim=-1)
        return v[..., :-1]

    # -------------------------------------------------------------- queries
    def queries(self, phi: torch.Tensor) -> np.ndarray:
        """Query vectors (n, vector_dim), float32, for query features ``phi``."""
        if self.euclidean:
            out = phi[:, :-1] / 2  # φ = [2 z, −1]; halving is exact in binary floating point
        else:
            out = torch.cat([phi, torch.zeros_like(phi[:, :1])], dim=1)
        return np.ascontiguousarray(out.detach().to(torch.float32).cpu().numpy())

    def l2_squared(self, distances: torch.Tensor, offsets: torch.Tensor, y: np.ndarray) -> np.ndarray:
        """‖y − x‖² of query vectors ``y`` to the keys at exact ``distances`` o(q) − φᵀψ, (n, m):
        the distance itself for ``euclidean``, ‖y‖² + M² − 2(o − d) for ``augmented``."""
        d = distances.detach().to(torch.float64).cpu().numpy()
        if self.euclidean:
            return d
        o = offsets.detach().to(torch.float64).cpu().numpy()[:, None]
        return (y.astype(np.float64) ** 2).sum(1)[:, None] + self.max_norm ** 2 - 2 * (o - d)

    # ---------------------------------------------------------------- state
    def state(self) -> dict:
        """Plain-data description, the inverse of :meth:`from_state`."""
        return {"euclidean": self.euclidean, "feature_dim": self.feature_dim, "norm_margin": self.norm_margin,
                "max_norm": self.max_norm, "max_seen": self.max_seen, "fixed": self.fixed}

    @classmethod
    def from_state(cls, state: dict) -> "VectorLayout":
        return cls(**{"fixed": False, **state})
