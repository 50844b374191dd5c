"""The faster of torch's and numpy's GEMM for a product shape, chosen once per shape at run time.

On some CPUs the BLAS behind torch and the one behind numpy differ by a factor of two on the
same product (on AMD CPUs, torch's MKL trails numpy's OpenBLAS; on others the reverse), and
the order can change with the shape. :func:`matmul_t` times both on the first product of a
shape class (a few milliseconds) and uses the faster from then on. :func:`using` makes another
process (a Dask worker building part of a context) take the same choices, so that its products
round as this process's do.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import torch

#: Rows of the trial product that decides a shape class.
TRIAL_ROWS = 4096
_CHOICE: dict[tuple, str] = {}
_LOCK = threading.Lock()
_GIVEN = threading.local()  # choices given by :func:`using`, per thread


def _numpy_ok(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.device.type == "cpu" and b.device.type == "cpu" and a.dtype == b.dtype
            and a.dtype in (torch.float32, torch.float64) and not (a.requires_grad or b.requires_grad))


def _torch_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b.T, out=out)


def _numpy_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    np.matmul(a.numpy(), b.numpy().T, out=out.numpy())
    return out


_KERNELS = {"torch": _torch_mm, "numpy": _numpy_mm}


def _choose(key: tuple, a: torch.Tensor, b: torch.Tensor) -> str:
    trial = a[:TRIAL_ROWS].contiguous()
    out = trial.new_empty(trial.shape[0], b.shape[0])
    best = {}
    for name, kernel in _KERNELS.items():
        kernel(trial, b, out)  # warm-up
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            kernel(trial, b, out)
            times.append(time.perf_counter() - t0)
        best[name] = min(times)
    return min(best, key=best.get)


def matmul_t(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b.T`` (a: n × k, b: m × k) by the faster of torch and numpy for this shape class
    (k, m, dtype; chosen on first use), into ``out`` when given; torch for anything numpy cannot take
    (other devices, autograd, other dtypes, non-contiguous operands)."""
    if out is None:
        out = a.new_empty(a.shape[0], b.shape[0])
    if not (_numpy_ok(a, b) and a.is_contiguous() and b.is_contiguous() and out.is_contiguous()):
        return torch.mm(a, b.T, out=out)
    key = (a.shape[1], b.shape[0], a.dtype, torch.get_num_threads())
    choice = (getattr(_GIVEN, "choices", None) or {}).get(key[:3]) or _CHOICE.get(key)
    if choice is None:
        with _LOCK:
            choice = _CHOICE.get(key) or _choose(key, a, b)
            _CHOICE[key] = choice
    return _KERNELS[choice](a, b, out)


def choices() -> dict[tuple, str]:
    """The library chosen for each shape class so far: ``{(k, m, dtype, threads): "torch" | "numpy"}``."""
    return dict(_CHOICE)


def given_choices() -> dict:
    """This process's choices at its own thread count, for :func:`using` elsewhere:
    ``{"threads": t, "libraries": {(k, m, dtype): library}}``."""
    threads = torch.get_num_threads()
    return {"threads": threads, "libraries": {key[:3]: lib for key, lib in _CHOICE.items() if key[3] == threads}}


@contextlib.contextmanager
def using(given: dict):
    """Within the block, take the libraries of ``given`` (:func:`given_choices` of another process) for their
    shape classes instead of timing them here, in this thread. Where numpy is taken, its BLAS runs with
    ``given["threads"]`` threads (process-wide, for the block): OpenBLAS splits a product, and so rounds
    it, by its threads. torch's CPU GEMM splits rows and columns only, which leaves each sum's order as
    it is, so its threads are left alone."""
    libraries = dict(given.get("libraries", {}))
    before = getattr(_GIVEN, "choices", None)
    _GIVEN.choices = libraries
    try:
        if "numpy" in libraries.values():
            from threadpoolctl import threadpool_limits

            with threadpool_limits(limits=int(given["threads"]), user_api="blas"):
                yield
        else:
            yield
    finally:
        _GIVEN.choices = before
