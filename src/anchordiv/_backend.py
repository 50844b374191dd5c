"""Array handling shared by every geometry: numpy in -> numpy out, torch in -> torch out.

Inputs are converted to torch tensors for compute. Floating dtypes float32 and float64 are
kept; float16, bfloat16 and integers are computed in float32 and results come back in
float32 (half precision overflows: a divergence at τ = 1e-3 exceeds float16's 65504).
Tensors are never moved between devices silently.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._util import positive_int  # noqa: F401  (re-exported: the geometries and backends use it)

_COMPUTE_DTYPES = (torch.float32, torch.float64)


@dataclass(frozen=True)
class Kind:
    """How to hand a result back: as numpy or torch, in which dtype."""

    is_numpy: bool
    dtype: torch.dtype

    def out(self, t: torch.Tensor) -> Any:
        if t.dtype != self.dtype:
            t = t.to(self.dtype)
        if self.is_numpy:
            return (t.detach() if t.requires_grad else t).cpu().numpy()
        return t


def as_tensor(x: Any, name: str, *, ndim: int | None = 2, device: torch.device | None = None,
              check_finite: bool = True) -> tuple[torch.Tensor, Kind]:
    """Convert ``x`` to a compute tensor and remember how to return results.

    Raises a ``ValueError`` naming ``name`` for wrong rank, empty input, or NaN/inf.
    ``device`` is where numpy input goes; a torch input on another device is an error.
    """
    if isinstance(x, torch.Tensor):
        t = x.detach() if x.requires_grad else x
        kind = Kind(False, t.dtype if t.dtype in _COMPUTE_DTYPES else torch.float32)
        if device is not None and t.device != torch.device(device):
            raise ValueError(
                f"{name} is on {t.device} but the model is on {device}; "
                f"move one of them, e.g. model.to({str(t.device)!r}) or {name}.to({str(device)!r})."
            )
    else:
        try:
            arr = np.asarray(x)
        except Exception as exc:  # pragma: no cover - exotic inputs
            raise ValueError(f"{name} must be a numpy array or torch tensor, got {type(x).__name__}.") from exc
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}.")
        if arr.dtype == np.float64:
            out_dtype = torch.float64
        else:
            out_dtype = torch.float32
        t = torch.from_numpy(np.ascontiguousarray(arr))
        if device is not None:
            t = t.to(device)
        kind = Kind(True, out_dtype)
    if t.dtype not in _COMPUTE_DTYPES:
        t = t.to(torch.float32)
    if ndim is not None and t.ndim != ndim:
        shape = tuple(t.shape)
        hint = f" (for a single vector use {name}[None, :])" if ndim == 2 and t.ndim == 1 else ""
        raise ValueError(f"{name} must be a {ndim}-D array, got shape {shape}{hint}.")
    if t.numel() == 0 and t.ndim >= 1 and t.shape[0] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(t.shape)}); pass at least one row.")
    if check_finite and not all_finite(t):
        bad = int((~torch.isfinite(t)).any(dim=-1).sum()) if t.ndim > 1 else int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} contains NaN or inf in {bad} row(s); clean or drop them before calling.")
    return t, kind


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite: one summing pass (NaN or inf make the sum
    non-finite), and the elementwise test only when the sum overflowed or was NaN."""
    if t.numel() == 0:
        return True
    if math.isfinite(t.sum().item()):
        return True
    return bool(torch.isfinite(t).all())


#: Fitted tensors converted to another dtype, by id of the tensor while it lives (see :func:`in_dtype`).
_CONVERTED: dict[int, tuple[weakref.ref, dict]] = {}


def in_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t.to(dtype)`` for a long-lived tensor (a fitted parameter): converted once per version
    of ``t`` and reused, instead of on every call (a d × d map takes longer to convert than to
    apply to one query)."""
    if t.dtype == dtype:
        return t
    if t.requires_grad or t.is_inference():  # a graph to keep, or no version counter to check
        return t.to(dtype)
    key = id(t)
    entry = _CONVERTED.get(key)
    if entry is None or entry[0]() is not t:
        entry = _CONVERTED[key] = (weakref.ref(t, lambda _, key=key: _CONVERTED.pop(key, None)), {})
    copies = entry[1]
    hit = copies.get(dtype)
    if hit is None or hit[0] != t._version:
        hit = copies[dtype] = (t._version, t.to(dtype))
    return hit[1]


def concat(parts: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """``torch.cat(parts, dim)``, without the copy when there is one part."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def check_dim(t: torch.Tensor, dim: int, name: str) -> None:
    """Raise a clear error when ``t`` does not have ``dim`` columns."""
    if t.shape[-1] != dim:
        raise ValueError(
            f"{name} has dimension {t.shape[-1]} but the model was fitted on dimension {dim}; "
            "embed queries, gallery and anchors with the same encoder."
        )


def row_chunks(n: int, chunk: int):
    """Yield slices of ``range(n)`` of length ``chunk``."""
    chunk = max(1, int(chunk))
    for start in range(0, n, chunk):
        yield slice(start, min(n, start + chunk))
