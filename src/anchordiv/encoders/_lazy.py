"""An encoder loaded on first use, shared by the commands of one process."""

from __future__ import annotations

from typing import Any

from ._base import check_batch_size, resolve_device

#: Loaded encoders, keyed by (spec, device), for the life of the process.
_LOADED: dict[tuple, Any] = {}


class LazyEncoder:
    """An encoder that is loaded on first use; its ``name`` (the spec) is known at once.

    Parameters
    ----------
    spec : str
        Encoder spec for :func:`anchordiv.encoders.load`.
    device : str, optional
        Device to run on.
    batch_size : int, optional
        Items per forward pass.

    Notes
    -----
    Loaded encoders are kept for the life of the process, keyed by spec and device, so
    repeated commands in one process load a model once.
    """

    def __init__(self, spec: str, device: str | None = None, batch_size: int | None = None):
        self.name = spec
        self._device = device
        self._batch_size = batch_size

    @property
    def loaded(self) -> Any:
        """The underlying encoder (loaded now if needed)."""
        from . import load

        key = (self.name, str(resolve_device(self._device)))
        if key not in _LOADED:
            _LOADED[key] = load(self.name, device=key[1])
        enc = _LOADED[key]
        if self._batch_size is not None:
            enc.batch_size = check_batch_size(self._batch_size)
        return enc

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.loaded, attr)
