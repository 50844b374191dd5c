"""What a context of the service is, and the contexts written by hand that it keeps.

A :class:`ContextKey` is (geometry, anchor selection, τ, model parameters, symmetric) and, for
a context written by hand, its anchor texts (and weights). Its name is ``MODEL:SETS`` for the
anchors file's sets (``softmax:breeds:0.7,places:0.3``) and ``typed:DIGEST`` for written
anchors, where the set ``typed`` stands for them in a mixture with the file's sets.

:class:`WrittenContexts` keeps the written contexts of a service: their keys by name, the
embedded anchors (embedded once), and a JSON file of texts and parameters written
atomically after each change, from which a restarted service knows them again (and builds
each on its first use).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._util import atomic_write
from ..anchors import AnchorSet
from .schemas import MAX_ANCHOR_CHARS, MAX_ANCHORS

#: The set name of the written anchors in a selection (``typed:0.6,breeds:0.4``).
TYPED = "typed"
#: Prefix of a written context's name.
TYPED_PREFIX = "typed:"
#: Format of the file of written contexts.
FORMAT, VERSION = "anchordiv.contexts", 1
#: Name of that file in the service's state folder.
STATE_FILE = "contexts.json"


def anchors_spec(selection: tuple[tuple[str, float], ...]) -> str | None:
    """``breeds`` for one set, ``breeds:0.7,places:0.3`` for several, None for none."""
    if not selection:
        return None
    if len(selection) == 1:
        return selection[0][0]
    return ",".join(f"{n}:{p:g}" for n, p in selection)


@dataclass(frozen=True)
class ContextKey:
    """What defines one context (see the module doc)."""

    model: str
    selection: tuple[tuple[str, float], ...]
    tau: float | None
    params: tuple[tuple[str, Any], ...]
    symmetric: bool
    written: tuple[str, ...] = ()
    weights: tuple[float, ...] | None = None

    @property
    def anchors(self) -> str | None:
        """The canonical anchors spec, e.g. ``breeds``, ``breeds:0.7,places:0.3`` or ``typed``."""
        return anchors_spec(self.selection)

    def spec(self) -> dict:
        """The key as plain JSON values (what the file of written contexts keeps)."""
        return {"anchors": list(self.written), "weights": None if self.weights is None else list(self.weights),
                "sets": self.anchors, "model": self.model, "tau": self.tau, "params": dict(self.params),
                "symmetric": self.symmetric}

    @property
    def name(self) -> str:
        """``MODEL``, ``MODEL:ANCHORS`` (the clip-retrieval index name), or ``typed:DIGEST`` for written anchors."""
        if self.written:
            digest = hashlib.sha256(json.dumps(self.spec(), sort_keys=True).encode()).hexdigest()[:12]
            return TYPED_PREFIX + digest
        return self.model if self.anchors is None else f"{self.model}:{self.anchors}"


class WrittenContexts:
    """The written contexts of a service (see the module doc).

    Parameters
    ----------
    folder : path, optional
        Where ``contexts.json`` is kept (created when needed); None keeps nothing on disk.
    encoder : str or None
        The encoder's name: a file written with another encoder is not read.
    limit : int
        Most written contexts kept.
    """

    def __init__(self, folder: str | os.PathLike | None, encoder: str | None, limit: int):
        self.path = None if folder is None else Path(folder) / STATE_FILE
        self.encoder, self.limit = encoder, int(limit)
        self.keys: dict[str, ContextKey] = {}
        self._anchors: dict[str, AnchorSet] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            self._read()

    def __contains__(self, name: str) -> bool:
        return name in self.keys

    def names(self) -> list[str]:
        return list(self.keys)

    def add(self, key: ContextKey, anchors: AnchorSet) -> bool:
        """Keep ``key`` with its embedded written ``anchors``; whether it is new. A full store is a
        ``ValueError`` naming the limit."""
        with self._lock:
            name = key.name
            new = name not in self.keys
            if new and len(self.keys) >= self.limit:
                raise ValueError(f"this service keeps at most {self.limit} written contexts; DELETE "
                                 "/api/contexts/NAME one that is no longer needed")
            self.keys[name], self._anchors[name] = key, anchors
            if new:
                self._write()
            return new

    def remove(self, name: str) -> bool:
        with self._lock:
            if self.keys.pop(name, None) is None:
                return False
            self._anchors.pop(name, None)
            self._write()
            return True

    def anchors(self, key: ContextKey, encoder: Any) -> AnchorSet:
        """The written anchors of ``key``, embedded by ``encoder`` on first use."""
        name = key.name
        with self._lock:
            found = self._anchors.get(name)
        if found is None:
            found = AnchorSet.from_texts(list(key.written), encoder, weights=key.weights)
            with self._lock:
                self._anchors[name] = found
        return found

    # ------------------------------------------------------------------ file
    def _write(self) -> None:
        if self.path is None:
            return
        body = {"format": FORMAT, "version": VERSION, "encoder": self.encoder,
                "contexts": [{"name": n, **k.spec()} for n, k in self.keys.items()]}
        data = json.dumps(body, indent=1, ensure_ascii=False).encode("utf-8")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda fh: fh.write(data), advice="start the service with another --state folder")

    def _read(self) -> None:
        try:
            body = json.loads(self.path.read_text(encoding="utf-8"))
            if body.get("format") != FORMAT or body.get("version") != VERSION:
                raise ValueError(f"not a {FORMAT} file of version {VERSION}")
            if body.get("encoder") != self.encoder:
                warnings.warn(f"{self.path}: written contexts of encoder {body.get('encoder')!r}, not "
                              f"{self.encoder!r}, are not restored")
                return
            for entry in body["contexts"][: self.limit]:
                key = key_from_spec(entry)
                if key.name != entry.get("name"):
                    raise ValueError(f"the context {entry.get('name')!r} does not match its parameters")
                self.keys[key.name] = key
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            self.keys.clear()
            warnings.warn(f"{self.path}: cannot restore the written contexts ({exc}); starting without them")


def key_from_spec(entry: dict) -> ContextKey:
    """A :class:`ContextKey` from :meth:`ContextKey.spec`'s JSON (a ``ValueError`` when malformed)."""
    texts = entry["anchors"]
    if not isinstance(texts, list) or not texts or len(texts) > MAX_ANCHORS or \
            not all(isinstance(t, str) and 0 < len(t) <= MAX_ANCHOR_CHARS for t in texts):
        raise ValueError(f"anchors must be a list of 1 to {MAX_ANCHORS} strings of at most {MAX_ANCHOR_CHARS} "
                         "characters")
    weights = entry.get("weights")
    sets = entry.get("sets") or TYPED
    selection = []
    for part in str(sets).split(","):
        name, _, p = part.rpartition(":")
        selection.append((name, float(p)) if name else (part, 1.0))
    tau = entry.get("tau")
    return ContextKey(str(entry["model"]), tuple(selection), None if tau is None else float(tau),
                      tuple(sorted(dict(entry.get("params") or {}).items())), bool(entry.get("symmetric", True)),
                      tuple(texts), None if weights is None else tuple(float(w) for w in weights))


__all__ = ["ContextKey", "WrittenContexts", "TYPED", "TYPED_PREFIX", "anchors_spec", "key_from_spec"]
