"""Index files: geometry (de)serialisation, atomic writes, checked reads.

A file is one ``torch.save`` of plain data (tensors, numbers, strings, lists, dicts), read
back with ``torch.load(weights_only=True)``, so loading a file never runs code from it.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from typing import Any

import numpy as np
import torch

from ..models import registry
from ..models.base import Geometry

FORMAT = "anchordiv.Index"
VERSION = 1


# ------------------------------------------------------------------- geometry
def _plain(value: Any, where: str) -> Any:
    """``value`` as data that ``torch.load(weights_only=True)`` reads, or a ``ValueError``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, torch.device):
        return {"__device__": str(value)}
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, (list, tuple)):
        out = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return out if isinstance(value, list) else {"__tuple__": out}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise ValueError(f"Cannot save {where} of type {type(value).__name__}; an index file holds tensors, numbers and strings.")


def _unplain(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_unplain(v, device) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__device__"}:
            return device
        if set(value) == {"__tuple__"}:
            return tuple(_unplain(v, device) for v in value["__tuple__"])
        return {k: _unplain(v, device) for k, v in value.items()}
    return value


def geometry_to_dict(model: Geometry) -> dict:
    """Registry name, class path, constructor parameters and fitted state of ``model``."""
    cls = type(model)
    name = next((n for n, c in registry().items() if c is cls), None)
    state = {k: v for k, v in vars(model).items() if k != "_cast_cache"}
    return {
        "name": name,
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "params": _plain(model.get_params(), "model parameter"),
        "state": _plain(state, "model attribute"),
    }


def geometry_from_dict(data: dict, device: torch.device, source: str) -> Geometry:
    """Rebuild the geometry saved by :func:`geometry_to_dict` on ``device``."""
    try:
        name, path, params, state = data["name"], data["class"], data["params"], data["state"]
    except (KeyError, TypeError):
        raise ValueError(f"{source!r} is corrupt: its model record is incomplete.") from None
    if name is not None:
        table = registry()
        if name not in table:
            raise ValueError(f"{source!r} holds a model {name!r} that this version of anchordiv does not know.")
        cls = table[name]
    else:
        module, _, qualname = str(path).partition(":")
        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            raise ValueError(f"{source!r} holds a model of class {path!r}, which cannot be imported here.") from None
        if not (isinstance(obj, type) and issubclass(obj, Geometry)):
            raise ValueError(f"{source!r} names {path!r} as its model, which is not an anchordiv geometry.")
        cls = obj
    params = _unplain(params, device)
    try:
        model = cls(**params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source!r}: cannot rebuild {cls.__name__} from its saved parameters ({exc}).") from None
    model.__dict__.update(_unplain(state, device))
    if "device_" in model.__dict__:
        model.device_ = device
    model.__dict__.pop("_cast_cache", None)
    return model


# ------------------------------------------------------------------ files
def atomic_save(payload: dict, path: str | os.PathLike) -> None:
    """Write ``payload`` to ``path`` through a temporary file in the same folder.

    The file at ``path`` is replaced only once the new one is completely written and
    synced, so a failure leaves the previous file as it was.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Cannot save the index to {path!r}: folder {folder!r} does not exist.")
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = os.stat(path).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable where the platform allows it
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def read_payload(path: str | os.PathLike) -> dict:
    """The payload of an index file, or ``FileNotFoundError`` / ``ValueError`` naming ``path``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No index file at {path!r}.")
    if not os.path.isfile(path):
        raise ValueError(f"{path!r} is not a file; pass the path of a file written by Index.save.")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(
            f"{path!r} is not a readable anchordiv index file (corrupt, truncated or of another format): {exc}"
        ) from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not an anchordiv index file (no {FORMAT!r} header).")
    if payload.get("version") != VERSION:
        raise ValueError(
            f"{path!r} is an index file of format version {payload.get('version')!r}; "
            f"this anchordiv reads version {VERSION}."
        )
    return payload
