"""Adapters to other libraries; each submodule is imported on first access.

``pml``
    :func:`anchordiv.integrations.pml.knn_func`: exact anchordiv search as the
    ``knn_func`` of pytorch-metric-learning's ``AccuracyCalculator``.

No adapter imports its library: they only follow its calling conventions.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = ("pml",)

__all__ = list(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
