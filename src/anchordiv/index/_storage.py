"""Index files: geometry (de)serialisation, atomic writes, checked reads.

A file is one ``torch.save`` of plain data (tensors, numbers, strings, lists, dicts), read
back with ``torch.load(weights_only=True)``, so loading a file never runs code from it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import torch

from .._util import atomic_write
from ..models import model_name, registry
from ..models.base import Geometry

FORMAT = "anchordiv.Index"
#: 2: symmetric key features in centred λ units (version 1 files hold η-unit features).
VERSION = 2


# ------------------------------------------------------------------- geometry
def _records() -> dict[str, type]:
    """The plain-data records a model may hold (posterior distributions), by name.

    A file names a record by one of these names only; nothing else is ever built from it.
    """
    from ..models.posterior import MatrixBingham, NormalInverseWishart

    return {"NormalInverseWishart": NormalInverseWishart, "MatrixBingham": MatrixBingham}


def _plain(value: Any, where: str) -> Any:
    """``value`` as data that ``torch.load(weights_only=True)`` reads, or a ``ValueError``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Geometry):  # a posterior model's prior_
        return {"__geometry__": geometry_to_dict(value)}
    if type(value).__name__ in _records() and type(value) is _records()[type(value).__name__]:
        fields = {f.name: _plain(getattr(value, f.name), f"{where}.{f.name}") for f in dataclasses.fields(value)}
        return {"__record__": type(value).__name__, "fields": fields}
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


def _unplain(value: Any, device: torch.device, source: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list):
        return [_unplain(v, device, source) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__device__"}:
            return device
        if set(value) == {"__tuple__"}:
            return tuple(_unplain(v, device, source) for v in value["__tuple__"])
        if set(value) == {"__geometry__"}:
            return geometry_from_dict(value["__geometry__"], device, source)
        if set(value) == {"__record__", "fields"}:
            record = _records().get(value["__record__"])
            if record is None or not isinstance(value["fields"], dict):
                raise ValueError(f"{source!r} is corrupt: it holds an unknown record {value['__record__']!r}.")
            try:
                return record(**_unplain(value["fields"], device, source))
            except TypeError:
                raise ValueError(f"{source!r} is corrupt: its {value['__record__']} record is malformed.") from None
        return {k: _unplain(v, device, source) for k, v in value.items()}
    return value


def geometry_to_dict(model: Geometry) -> dict:
    """Registry name, class path, constructor parameters and fitted state of ``model``.

    Only registered geometries can be saved: the file names its model by registry name,
    and :func:`geometry_from_dict` resolves that name through the registry alone. The class
    path is written for information and never used to import anything.
    """
    cls = type(model)
    name = model_name(cls)
    if name is None:
        raise ValueError(
            f"Cannot save a model of class {cls.__module__}.{cls.__qualname__}: it is not registered. "
            "Register it first with ad.register_model('my_model', cls) (also in the process that loads the file)."
        )
    state = dict(vars(model))
    return {
        "name": name,
        "class": f"{cls.__module__}:{cls.__qualname__}",
        "params": _plain(model.get_params(), "model parameter"),
        "state": _plain(state, "model attribute"),
    }


def geometry_from_dict(data: dict, device: torch.device, source: str) -> Geometry:
    """Rebuild the geometry saved by :func:`geometry_to_dict` on ``device``.

    The class comes from the registry by the saved name only; nothing the file names is
    imported. Parameters and state are plain data (tensors, numbers, strings).
    """
    try:
        name, params, state = data["name"], data["params"], data["state"]
    except (KeyError, TypeError):
        raise ValueError(f"{source!r} is corrupt: its model record is incomplete.") from None
    table = registry()
    if not isinstance(name, str) or name not in table:
        saved_class = data.get("class") if isinstance(data, dict) else None
        raise ValueError(
            f"{source!r} holds a model {name!r} (class {saved_class!r}) that is not registered here; "
            "if it is your own geometry, call ad.register_model(name, cls) before Index.load. "
            "Index.load never imports the class a file names."
        )
    cls = table[name]
    if not isinstance(params, dict) or not isinstance(state, dict):
        raise ValueError(f"{source!r} is corrupt: its model parameters or state are malformed.")
    params = _unplain(params, device, source)
    try:
        model = cls(**params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source!r}: cannot rebuild {cls.__name__} from its saved parameters ({exc}).") from None
    model.__dict__.update(_unplain(state, device, source))
    if "device_" in model.__dict__:
        model.device_ = device
    return model


# ------------------------------------------------------------------ files
def atomic_save(payload: dict, path: str | os.PathLike) -> None:
    """Write ``payload`` to ``path`` through a temporary file in the same folder.

    The file at ``path`` is replaced only once the new one is completely written and
    synced, so a failure leaves the previous file as it was. The temporary is
    ``.NAME.PID.RANDOM.tmp``; temporaries of killed saves (their PID has ended) are removed
    by the next save of the same path, and can always be deleted by hand
    (:func:`anchordiv._util.atomic_write`).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Cannot save the index to {path!r}: folder {folder!r} does not exist.")
    atomic_write(path, lambda f: torch.save(payload, f), advice="save the index to another disk")


def read_payload(path: str | os.PathLike) -> dict:
    """The payload of an index file, or ``FileNotFoundError`` / ``ValueError`` naming ``path``."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No index file at {path!r}.")
    if not os.path.isfile(path):
        raise ValueError(f"{path!r} is not a file; pass the path of a file written by Index.save.")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        # torch's own message suggests weights_only=False, which would run code from the
        # file: it is never shown.
        raise ValueError(
            f"{path!r} is not a readable anchordiv index file (corrupt, truncated or of another format); "
            "pass a file written by Index.save."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not an anchordiv index file (no {FORMAT!r} header).")
    if payload.get("version") != VERSION:
        raise ValueError(
            f"{path!r} is an index file of format version {payload.get('version')!r}; "
            f"this anchordiv reads version {VERSION}: rebuild the index from its collection "
            "(ad.Index(...).add(...) or `anchordiv index build`)."
        )
    return payload
