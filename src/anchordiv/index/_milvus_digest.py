"""Digests that name what a Milvus collection holds: a fitted model's and an id set's."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from ..models import registry

_MASK = (1 << 64) - 1


def _feed(h: Any, value: Any) -> None:
    """Hash ``value`` deterministically: tensors by their float64 (or int64) values, the rest by repr."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        t = t.to(torch.complex128 if t.is_complex() else torch.float64 if t.is_floating_point() else torch.int64)
        h.update(f"tensor{tuple(t.shape)}{t.dtype}:".encode())
        h.update(t.contiguous().numpy().tobytes())
    elif isinstance(value, dict):
        h.update(b"{")
        for k in sorted(value, key=str):
            _feed(h, str(k))
            _feed(h, value[k])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for v in value:
            _feed(h, v)
        h.update(b"]")
    elif isinstance(value, torch.device):
        h.update(b"device;")  # where a model lives is not what it is
    elif isinstance(value, np.generic):
        _feed(h, value.item())
    elif isinstance(value, float):
        h.update(f"f{float(value)!r};".encode())
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def model_digest(model: Any) -> str:
    """``"<registry name>:<sha256>"`` of a fitted geometry's class, parameters and public fitted attributes.

    Private attributes (caches) and the device are left out, so a model and its
    save/load round trip (on any device) have the same digest.
    """
    cls = type(model)
    name = next((n for n, c in registry().items() if c is cls), f"{cls.__module__}.{cls.__qualname__}")
    h = hashlib.sha256()
    _feed(h, f"{cls.__module__}.{cls.__qualname__}")
    _feed(h, model.get_params())
    _feed(h, {k: v for k, v in vars(model).items() if not k.startswith("_") and k != "device_"})
    return f"{name}:{h.hexdigest()}"


def ids_digest(ids: np.ndarray, previous: str | None = None, removed: bool = False) -> str:
    """Order-independent ``"<count>:<hash>"`` of an id set; ``previous`` is the digest of the ids stored before,
    to which ``ids`` are added (or from which they are ``removed``).

    The hash is the sum modulo 2⁶⁴ of splitmix64(id), so it is updated per batch.
    """
    count, total = (0, 0) if previous is None else (int(previous.split(":")[0]), int(previous.split(":")[1], 16))
    z = np.asarray(ids, dtype=np.int64).view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    sign = -1 if removed else 1
    total = (total + sign * int(z.sum(dtype=np.uint64))) & _MASK
    return f"{count + sign * len(z)}:{total:016x}"


def _short(value: Any) -> Any:
    """A model digest cut to its name and 12 hex digits, for messages."""
    if isinstance(value, str) and ":" in value:
        name, _, digest = value.partition(":")
        return f"{name}:{digest[:12]}…"
    return value
