"""Input checks and the row-block driver shared by the metrics."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._util import positive_int

# Number of matrix elements processed at once by the vectorised AP kernel.
# The kernel keeps roughly ten temporaries of this size (about 80 bytes per
# element in total), so the default uses a few hundred MiB at most.  The
# ranking kernels (recall@k, ..., nDCG) keep about twice as many and use half.
DEFAULT_BLOCK_ELEMENTS = 1 << 22


def to_numpy(x: Any, name: str) -> np.ndarray:
    """Convert ``x`` to a NumPy array; torch tensors go through the CPU."""
    if hasattr(x, "detach") and hasattr(x, "cpu") and hasattr(x, "numpy"):
        t = x.detach().cpu()
        # NumPy has no bfloat16; widen reduced-precision floats (exactly).
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()
        x = t.numpy()
    try:
        return np.asarray(x)
    except Exception as exc:  # pragma: no cover - exotic inputs
        raise ValueError(f"`{name}` could not be converted to an array: {exc}") from exc


def check_distances(distances: Any) -> np.ndarray:
    """Distances as an array of shape (G,) or (Q, G): real, non-empty, without NaN."""
    d = to_numpy(distances, "distances")
    if d.ndim not in (1, 2):
        raise ValueError(
            f"`distances` must be 1-D (G,) or 2-D (Q, G); got shape {d.shape}"
        )
    if d.size == 0:
        raise ValueError(f"`distances` is empty (shape {d.shape})")
    if d.dtype == bool or not (
        np.issubdtype(d.dtype, np.integer) or np.issubdtype(d.dtype, np.floating)
    ):
        raise ValueError(
            f"`distances` must hold real numbers (integer or float); got dtype {d.dtype}"
        )
    if np.issubdtype(d.dtype, np.floating) and np.isnan(d).any():
        raise ValueError(
            f"`distances` contains {int(np.isnan(d).sum())} NaN value(s)"
        )
    return d


def check_binary(x: Any, name: str) -> np.ndarray:
    """Return a boolean copy/view of a boolean or 0/1 array."""
    a = to_numpy(x, name)
    if a.dtype == bool:
        return a
    if not (
        np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
    ):
        raise ValueError(f"`{name}` must be boolean or 0/1 numeric; got dtype {a.dtype}")
    ok = (a == 0) | (a == 1)
    if not ok.all():
        bad = a[~ok].ravel()[:5]
        raise ValueError(
            f"`{name}` must be boolean or contain only 0 and 1; found e.g. {bad.tolist()}"
        )
    return a == 1


def check_relevant(relevant: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Binary relevance of the given shape, as booleans."""
    r = check_binary(relevant, "relevant")
    if r.shape != shape:
        raise ValueError(
            f"`relevant` must have the same shape as `distances` {shape}; got {r.shape}"
        )
    return r


def check_batch_size(batch_size: int | None, n_cols: int,
                     block_elements: int = DEFAULT_BLOCK_ELEMENTS) -> int:
    """Rows per block: ``batch_size``, or ``max(1, block_elements // n_cols)`` when None."""
    batch_size = positive_int(batch_size, "`batch_size`", allow_none=True)
    return max(1, block_elements // max(n_cols, 1)) if batch_size is None else batch_size


def as_rows(d: np.ndarray, rel: np.ndarray, exclude_self: bool) -> tuple[np.ndarray, np.ndarray, bool]:
    """One query's row (G,) as a (1, G) matrix; returns ``(d, rel, was_1d)``."""
    if d.ndim != 1:
        return d, rel, False
    if exclude_self:
        raise ValueError("`exclude_self=True` needs a square 2-D `distances`; got a 1-D array")
    return d[None, :], rel[None, :], True


def drop_diagonal(block: np.ndarray, row_start: int) -> np.ndarray:
    """Remove entry (i, row_start + i) from each row of ``block`` (n, G)."""
    n, g = block.shape
    keep = np.ones((n, g), dtype=bool)
    keep[np.arange(n), np.arange(row_start, row_start + n)] = False
    return block[keep].reshape(n, g - 1)


def check_square(shape: tuple[int, ...]) -> None:
    """``exclude_self`` needs a square matrix (Q == G) with at least 2 items."""
    if shape[0] != shape[1]:
        raise ValueError(
            f"`exclude_self=True` needs a square `distances` (Q == G); got shape {shape}"
        )
    if shape[1] < 2:
        raise ValueError(
            f"`exclude_self=True` needs at least 2 items; `distances` has shape {shape}"
        )


def rowwise(
    kernel: Any, d: np.ndarray, rel: np.ndarray, exclude_self: bool, batch_size: int | None,
    block_elements: int = DEFAULT_BLOCK_ELEMENTS,
) -> np.ndarray:
    """Apply ``kernel(d_rows, rel_rows) -> (n,)`` to blocks of rows of ``d`` (Q, G).

    With ``exclude_self`` the diagonal pair is removed from each row first.  Without a
    ``batch_size``, a block holds about ``block_elements`` matrix elements.
    """
    q, g = d.shape
    if exclude_self:
        check_square(d.shape)
    rows = check_batch_size(batch_size, g, block_elements)
    out = np.empty(q, dtype=np.float64)
    for start in range(0, q, rows):
        stop = min(start + rows, q)
        dc, rc = d[start:stop], rel[start:stop]
        if exclude_self:
            dc, rc = drop_diagonal(dc, start), drop_diagonal(rc, start)
        out[start:stop] = kernel(dc, rc)
    return out


def check_grades(relevance: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Graded relevance as float64: boolean or real, finite and >= 0."""
    a = to_numpy(relevance, "relevance")
    if a.dtype != bool and not (
        np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)
    ):
        raise ValueError(f"`relevance` must be boolean or real-valued; got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(
            f"`relevance` must have the same shape as `distances` {shape}; got {a.shape}"
        )
    a = a.astype(np.float64)
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        raise ValueError(
            "`relevance` must hold finite grades >= 0; found e.g. "
            f"{a[bad].ravel()[:5].tolist()}"
        )
    return a


def check_k(k: Any, name: str = "`k`") -> int:
    """A cutoff: a positive integer."""
    return positive_int(k, name)
