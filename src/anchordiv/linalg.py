"""Linear algebra shared by the models: row norms and directions at any scale, symmetric
eigendecomposition and weighted moments."""

from __future__ import annotations

import torch
from threadpoolctl import threadpool_limits

from ._backend import row_chunks


def _scaled_rows(X: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(X/m, m) with m_i = max_j |x_ij| (1 for an all-zero row): rows of X/m lie in [−1, 1] with
    an entry ±1, so no square of them overflows or underflows."""
    m = X.abs().amax(dim=1, keepdim=True)
    m = torch.where(m > 0, m, torch.ones_like(m))
    return X / m, m


def row_norms(X: torch.Tensor) -> torch.Tensor:
    """‖x_i‖ = m_i‖x_i/m_i‖ (m_i = max_j |x_ij|) in float64: exact for every finite row, however
    large or small (a plain float32 norm overflows above about 1.8e19 and underflows below 1e-19)."""
    Y, m = _scaled_rows(X.to(torch.float64))
    return torch.linalg.vector_norm(Y, dim=1) * m[:, 0]


def unit_rows(X: torch.Tensor, name: str) -> torch.Tensor:
    """x_i/‖x_i‖ computed as y_i/‖y_i‖ with y_i = x_i/max_j |x_ij|, in the dtype of ``X``: correct
    for every finite non-zero row, of norm 1e-44 or 1e38. An all-zero row is a ``ValueError``."""
    Y, _ = _scaled_rows(X)
    norms = torch.linalg.vector_norm(Y, dim=1, keepdim=True)
    if not bool(norms.all()):
        rows = torch.nonzero(norms[:, 0] == 0).flatten()[:5].tolist()
        raise ValueError(f"{name} contains an all-zero row (rows {rows}), which has no direction; drop it.")
    return Y / norms


def symmetric_eigh(A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh`` (ascending eigenvalues), on one OpenMP thread on CPU.

    A d×d eigenproblem is latency-bound and LAPACK's multi-threaded solver is far slower
    on it than one thread (benchmarks/results/eigh.md). The limit is set with
    ``threadpoolctl.threadpool_limits`` for the calling thread and restored afterwards:
    ``torch.get_num_threads()`` of the caller and of every other thread is unchanged.
    """
    if A.device.type != "cpu":
        return torch.linalg.eigh(A)
    with threadpool_limits(limits=1, user_api="openmp"):
        return torch.linalg.eigh(A)


def weighted_mean_cov(X: torch.Tensor, w: torch.Tensor, chunk: int = 16384) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted mean and (1/n, MLE) covariance Σ_i w_i (x_i − μ)(x_i − μ)ᵀ, w summing to 1.

    Streams over row chunks: each chunk's scatter is a GEMM in the dtype of ``X`` (float32
    data stays float32) accumulated in float64, so no float64 copy of the anchors is made.
    Returns float64 tensors. Raises a ``ValueError`` when the anchors have (numerically)
    zero variance.
    """
    w = w.to(torch.float64)
    mean = torch.zeros(X.shape[1], dtype=torch.float64, device=X.device)
    for sl in row_chunks(X.shape[0], chunk):
        mean += w[sl] @ X[sl].to(torch.float64)
    cov = torch.zeros(X.shape[1], X.shape[1], dtype=torch.float64, device=X.device)
    scale = 0.0
    center = mean.to(X.dtype)
    for sl in row_chunks(X.shape[0], chunk):
        D = X[sl] - center
        cov += ((D * w[sl, None].to(X.dtype)).T @ D).to(torch.float64)
        scale += float(w[sl] @ (X[sl] * X[sl]).sum(1).to(torch.float64))
    if float(torch.trace(cov)) <= 1e-12 * max(scale, torch.finfo(torch.float64).tiny):
        raise ValueError("The anchors have zero variance (all identical); a covariance needs at least 2 distinct anchors.")
    return mean, cov
