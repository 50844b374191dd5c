"""The backends of :class:`anchordiv.Index` by name: built-ins, :func:`register_backend` and plug-ins.

A plug-in package declares its backend class as an entry point of the group
``anchordiv.backends``::

    # pyproject.toml of the plug-in
    [project.entry-points."anchordiv.backends"]
    numpy_flat = "my_package.backend:NumpyBackend"

Entry points are loaded on the first lookup of a backend name (and again when a name is
not found, so that a package installed later in the process is seen). A plug-in that
fails to load gives a ``RuntimeWarning`` naming it and is skipped.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from importlib import metadata
from typing import Iterator

from ._common import Backend
from ._exact import ExactBackend
from ._faiss import FaissBackend
from ._milvus import MilvusBackend

#: Entry-point group of backend plug-ins.
ENTRY_POINT_GROUP = "anchordiv.backends"
#: Methods every backend implements (the others have working defaults in :class:`Backend`).
REQUIRED = ("add", "delete", "search", "key_blocks", "state", "restore")

_BUILT_IN: dict[str, type[Backend]] = {b.name: b for b in (ExactBackend, FaissBackend, MilvusBackend)}
_REGISTERED: dict[str, type[Backend]] = dict(_BUILT_IN)
_SEEN: set[tuple[str, str]] = set()  # entry points already loaded (or found broken): (name, value)
_discovered = False


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Register a :class:`~anchordiv.index.Backend` subclass under its ``name``, for
    ``Index(model, backend=name)``, ``Index.load``, ``build_index`` and the CLI's ``--backend``.

    Returns ``cls``, so it also serves as a class decorator. Registering the same class
    again is a no-op.
    """
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"register_backend: cls must be a subclass of anchordiv.index.Backend, got {cls!r}.")
    name = cls.name
    if not isinstance(name, str) or not name.replace("-", "_").isidentifier():
        raise ValueError(f"register_backend: {cls.__qualname__}.name must be a name such as 'my_backend', "
                         f"got {name!r}; set the class attribute name.")
    missing = missing_methods(cls)
    if missing:
        raise TypeError(f"register_backend: {cls.__qualname__} does not implement {', '.join(missing)}; "
                        "every backend defines these methods (see anchordiv.index.Backend).")
    current = _REGISTERED.get(name)
    if current is not None and current is not cls:
        raise ValueError(f"register_backend: the name {name!r} is already taken by "
                         f"{current.__module__}.{current.__qualname__}; choose another name.")
    _REGISTERED[name] = cls
    return cls


def missing_methods(cls: type) -> list[str]:
    """The methods of :data:`REQUIRED` that ``cls`` inherits from :class:`Backend` unimplemented."""
    return [m for m in REQUIRED if inspect.getattr_static(cls, m) is inspect.getattr_static(Backend, m)]


def discover() -> None:
    """Load the backend plug-ins declared as ``anchordiv.backends`` entry points not loaded yet."""
    global _discovered
    _discovered = True
    try:
        points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as exc:  # a damaged distribution on sys.path
        warnings.warn(f"anchordiv could not list its backend plug-ins ({exc}); none is loaded.", RuntimeWarning,
                      stacklevel=3)
        return
    for point in points:
        key = (point.name, point.value)
        if key in _SEEN:
            continue
        _SEEN.add(key)
        try:
            cls = point.load()
            if getattr(cls, "name", None) != point.name:
                raise ValueError(f"the entry point is named {point.name!r} but the class's name is "
                                 f"{getattr(cls, 'name', None)!r}; give both the same name")
            register_backend(cls)
        except Exception as exc:
            warnings.warn(f"anchordiv backend plug-in {point.name!r} ({point.value}) could not be loaded and is "
                          f"skipped: {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=3)


def backend_class(name: str) -> type[Backend]:
    """The backend class registered under ``name`` (plug-ins included), or a ``ValueError`` listing the names."""
    if not _discovered or (isinstance(name, str) and name not in _REGISTERED):
        discover()
    if not isinstance(name, str) or name not in _REGISTERED:
        raise ValueError(f"Unknown backend {name!r}; choose one of {', '.join(_REGISTERED)} "
                         "(or register one with anchordiv.index.register_backend).")
    return _REGISTERED[name]


def backend_names() -> tuple[str, ...]:
    """Names of every backend: built-ins, registered classes and plug-ins."""
    if not _discovered:
        discover()
    return tuple(_REGISTERED)


class _Registry(Mapping):
    """Read-only view of the backends by name (plug-ins are loaded on first use)."""

    def __getitem__(self, name: str) -> type[Backend]:
        try:
            return backend_class(name)
        except ValueError:
            raise KeyError(name) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and _lookup_quietly(name)

    def __iter__(self) -> Iterator[str]:
        return iter(backend_names())

    def __len__(self) -> int:
        return len(backend_names())

    def __repr__(self) -> str:
        return f"BACKENDS({', '.join(backend_names())})"


def _lookup_quietly(name: str) -> bool:
    try:
        backend_class(name)
    except ValueError:
        return False
    return True


#: Backends by name (a read-only view of the registry, plug-ins included).
BACKENDS: Mapping[str, type[Backend]] = _Registry()


def backend_choice():
    """A ``click.Choice`` of the backend names, read from the registry whenever it is used (so
    plug-ins and backends registered after the CLI was imported count)."""
    import click

    class BackendChoice(click.Choice):
        def __init__(self) -> None:
            super().__init__((), case_sensitive=True)

        @property
        def choices(self) -> tuple[str, ...]:
            return backend_names()

        @choices.setter
        def choices(self, value) -> None:
            pass

    return BackendChoice()


__all__ = ["BACKENDS", "ENTRY_POINT_GROUP", "register_backend", "backend_class", "backend_names", "discover",
           "backend_choice"]
