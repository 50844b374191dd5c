"""Index files: geometry (de)serialisation, atomic writes, checked reads.

A file is one ``torch.save`` of plain data (tensors, numbers, strings, lists, dicts), read
back with ``torch.load(weights_only=True)``, so loading a file never runs code from it.
Every part of it (header, model, ids, stored vectors) carries a SHA-256 digest written at
save and checked at load, so a damaged file is refused instead of giving other neighbours.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import warnings
from typing import Any

import numpy as np
import torch

from .._util import atomic_write
from ..models import model_name, registry
from ..models.base import Geometry

FORMAT = "anchordiv.Index"
#: 3: SHA-256 digests of every part (version 2 files have none and load with a warning;
#: version 1 files hold η-unit features and are refused).
VERSION = 3
#: The oldest version read: its files hold the same data, without digests.
UNSEALED_VERSION = 2
#: Key of the digests in a payload.
DIGESTS = "sha256"
#: The parts of a payload that are digested, with the payload keys each covers and its name in messages.
PARTS = {
    "header": (("format", "version", "backend", "symmetric", "params", "dim"), "header (backend, parameters, dimension)"),
    "model": (("model",), "model"),
    "ids": (("ids",), "ids"),
    "store": (("store",), "stored vectors"),
}


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


# ------------------------------------------------------------------ digests
def _feed(h: Any, value: Any) -> None:
    """Feed ``value`` (plain payload data) to ``h`` in one unambiguous byte form."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        t = (t if t.device.type == "cpu" else t.cpu()).contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    elif isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        for key in sorted(value, key=repr):
            _feed(h, key)
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        for v in value:
            _feed(h, v)
    elif isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        h.update(f"S{len(data)}:".encode() + data)
    elif value is None or isinstance(value, (bool, int)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
    elif isinstance(value, float):
        h.update(f"F{value.hex()};".encode())
    elif isinstance(value, torch.dtype):
        h.update(f"Y{value};".encode())
    elif isinstance(value, np.generic):
        _feed(h, value.item())
    else:
        raise ValueError(f"cannot digest a value of type {type(value).__name__} in an index payload")


def part_digests(payload: dict) -> dict[str, str]:
    """SHA-256 (hex) of each part of ``payload`` named in :data:`PARTS`."""
    out = {}
    for part, (keys, _) in PARTS.items():
        h = hashlib.sha256()
        for key in keys:
            _feed(h, key)
            _feed(h, payload.get(key))
        out[part] = h.hexdigest()
    return out


def seal(payload: dict) -> dict:
    """Record the digests of ``payload``'s parts in it (under :data:`DIGESTS`); returns ``payload``."""
    payload[DIGESTS] = part_digests(payload)
    return payload


def fingerprint(payload: dict) -> str:
    """One SHA-256 (hex) of a sealed payload's part digests: the identity of an index file's content."""
    h = hashlib.sha256()
    _feed(h, {part: payload[DIGESTS][part] for part in PARTS})
    return h.hexdigest()


def check_digests(payload: dict, path: str) -> None:
    """Raise a ``ValueError`` naming ``path`` and the part when a digest of ``payload`` does not match."""
    recorded = payload.get(DIGESTS)
    if not isinstance(recorded, dict) or not all(isinstance(recorded.get(p), str) for p in PARTS):
        raise ValueError(
            f"{path!r} is damaged: it records no SHA-256 digests of its parts, which every index file of "
            f"format version {VERSION} has. Restore it from a copy, or rebuild the index from its collection."
        )
    try:
        actual = part_digests(payload)
    except ValueError:
        actual = {}
    for part, (_, name) in PARTS.items():
        if actual.get(part) != recorded[part]:
            raise ValueError(
                f"{path!r} is damaged: the SHA-256 digest of its {name} differs from the one recorded when it "
                "was saved (a flipped bit, a partial copy or an edit). Restore it from a copy, or rebuild the "
                "index from its collection."
            )


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
    """The payload of an index file with its digests checked, or ``FileNotFoundError`` /
    ``ValueError`` naming ``path``. A file of format version 2 (before digests) loads with a
    ``UserWarning``; its digests are computed from what was read."""
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
    version = payload.get("version")
    if version == UNSEALED_VERSION:
        warnings.warn(
            f"{path!r} was written by an older anchordiv (format version {UNSEALED_VERSION}), which records no "
            "integrity digests, so damage to it cannot be detected; save it again to add them "
            "(ad.Index.load(path).save(path)), or rebuild it with `anchordiv index build`.",
            UserWarning, stacklevel=3)
        try:
            return seal(payload)
        except ValueError:
            raise ValueError(f"{path!r} is corrupt: it holds data an index file cannot hold; rebuild the index "
                             "from its collection.") from None
    if version != VERSION:
        raise ValueError(
            f"{path!r} is an index file of format version {version!r}; "
            f"this anchordiv reads version {VERSION} (and {UNSEALED_VERSION}): rebuild the index from its "
            "collection (ad.Index(...).add(...) or `anchordiv index build`)."
        )
    check_digests(payload, path)
    return payload
