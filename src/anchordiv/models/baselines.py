"""Reference geometries: cosine and image–text inversion (paper §5.1, App. E.3).

Both follow the conventions of the anchor models: lower means closer, ``pairwise`` and
the feature-map contract ``pairwise = query_offsets[:, None] - query_features @ key_features.T``.
They need no temperature.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from .._backend import as_tensor
from ..linalg import unit_rows
from .base import Geometry, prepare_anchors


class Cosine(Geometry):
    """Cosine distance 1 − cos(q, g): the fixed, task-agnostic geometry.

    Rows are scaled to unit norm by :func:`anchordiv.linalg.unit_rows`, so any finite non-zero
    vector has a direction, however large or small its norm.

    ``fit`` is accepted (and ignored) so that every geometry can be used the same way.
    The ``symmetric`` flag is accepted and has no effect: cosine is symmetric.
    """

    color = "#7f7f7f"

    @classmethod
    def tags(cls):
        return replace(super().tags(), similarity="cosine")

    def __init__(self):
        pass

    def fit(self, anchors: Any = None, prior: Any = None) -> "Cosine":
        return self

    def _is_fitted(self) -> bool:
        return True

    def _input(self, X: Any, name: str):
        return as_tensor(X, name, device=None)

    def key_norm_bound(self, symmetric: bool = True) -> float:
        return 1.0  # ψ is the unit vector of g, whatever its norm

    def _query_terms(self, Q, symmetric):
        return Q.new_ones(Q.shape[0]), unit_rows(Q, "Q")

    def _key_terms(self, G, symmetric):
        return unit_rows(G, "G")

    def _divergence(self, X, Y):
        if X.shape[1] != Y.shape[1]:
            raise ValueError(f"X has dimension {X.shape[1]} but Y has {Y.shape[1]}.")
        return 1 - (unit_rows(X, "X") * unit_rows(Y, "Y")).sum(1)

    def pairwise(self, Q: Any, G: Any, symmetric: bool = True) -> Any:
        q, _ = as_tensor(Q, "Q")
        g, _ = as_tensor(G, "G")
        if q.shape[1] != g.shape[1]:
            raise ValueError(f"Q has dimension {q.shape[1]} but G has {g.shape[1]}; use one encoder for both.")
        return super().pairwise(Q, G, symmetric)


class ImageTextInversion(Geometry):
    """Image–text inversion (ITI): predict the query's anchor, then rank by that text proxy.

    .. math::

        i^\\star(q) = \\arg\\max_i \\lambda_q^\\top\\gamma_i, \\qquad
        \\mathrm{pairwise}(q, g) = -\\gamma_{i^\\star(q)}^\\top \\lambda_g.

    Embeddings are expected unit-norm (then this is minus the cosine similarity to the
    proxy). The geometry is asymmetric by construction; ``symmetric`` has no effect.
    Reference: Kannan, Park, Veitch (2026), App. E.3 (eq. E.1–E.3).

    Attributes
    ----------
    anchors_ : torch.Tensor (N, d)
    """

    anchor_batch_size: int = 8192
    color = "#8c564b"

    @classmethod
    def tags(cls):
        return replace(super().tags(), needs_anchors=True, similarity="iti")

    def __init__(self):
        pass

    def fit(self, anchors: Any, prior: Any = None) -> "ImageTextInversion":
        if prior is not None:
            raise ValueError("ImageTextInversion takes no prior.")
        anchors = prepare_anchors(anchors, type(self).__name__)
        self.anchors_ = anchors.embeddings
        self.n_anchors_ = len(anchors)
        self.device_ = anchors.device
        self.dim_ = anchors.dim
        return self

    def proxy_index(self, Q: Any) -> Any:
        """i*(q): the index of the best-matching anchor for each query."""
        q, kind = self._input(Q, "Q")
        idx = self._proxy_index(q)
        return idx.cpu().numpy() if kind.is_numpy else idx

    def _proxy_index(self, Q: torch.Tensor) -> torch.Tensor:
        best = Q.new_full((Q.shape[0],), -torch.inf)
        idx = torch.zeros(Q.shape[0], dtype=torch.long, device=Q.device)
        for start in range(0, self.n_anchors_, self.anchor_batch_size):
            scores = Q @ self.anchors_[start:start + self.anchor_batch_size].to(Q.dtype).T
            value, arg = scores.max(dim=1)
            better = value > best
            best = torch.where(better, value, best)
            idx = torch.where(better, arg + start, idx)
        return idx

    def key_norm_bound(self, symmetric: bool = True) -> float:
        return self.INPUT_NORM  # ψ(g) = g

    def _query_terms(self, Q, symmetric):
        return Q.new_zeros(Q.shape[0]), self.anchors_[self._proxy_index(Q)].to(Q.dtype)

    def _key_terms(self, G, symmetric):
        return G

    def _divergence(self, X, Y):
        return -(self.anchors_[self._proxy_index(X)].to(X.dtype) * Y).sum(1)
