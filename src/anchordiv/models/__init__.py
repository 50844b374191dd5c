"""Anchor-distribution models and the name registry shared by the Python API, the CLI and index files."""

from __future__ import annotations

import threading
import warnings
from typing import Any, Sequence

from .base import AnchorModel, Geometry, NotFittedError, Tags, temperature
from .baselines import Cosine, ImageTextInversion
from .gaussian import Gaussian
from .latent import LatentGaussian, LatentSpherical
from .mixture import GaussianMixture
from .params import Param, check_declaration, declared_params
from .softmax import Softmax

#: Anchor models by registry name.
MODELS = {
    "softmax": Softmax,
    "gaussian": Gaussian,
    "gmm": GaussianMixture,
    "latent_gaussian": LatentGaussian,
    "latent_spherical": LatentSpherical,
}

#: The entry-point group of geometry plug-ins: ``NAME = "package.module:Class"``.
ENTRY_POINT_GROUP = "anchordiv.models"

#: Geometries registered by users with :func:`register_model` or found as entry points.
_USER_MODELS: dict[str, type] = {}
_PLUGINS_LOADED = _PLUGINS_LOADING = False
_PLUGINS_LOCK = threading.RLock()


def _baselines():
    return {"cosine": Cosine, "iti": ImageTextInversion}


def load_plugins(reload: bool = False) -> dict[str, type]:
    """Register the geometries of the entry-point group ``anchordiv.models`` (done once, on the first
    registry lookup). A plug-in that fails to load, or whose name is taken, is skipped with a
    warning naming it. Returns the geometries registered by this call."""
    global _PLUGINS_LOADED, _PLUGINS_LOADING
    if _PLUGINS_LOADED and not reload:
        return {}
    with _PLUGINS_LOCK:  # other threads wait; a plug-in that looks up the registry while loading does not recurse
        if _PLUGINS_LOADING or (_PLUGINS_LOADED and not reload):
            return {}
        _PLUGINS_LOADING = True
        try:
            return _load_entry_points()
        finally:
            _PLUGINS_LOADING, _PLUGINS_LOADED = False, True


def _load_entry_points() -> dict[str, type]:
    from importlib.metadata import entry_points

    found: dict[str, type] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        where = f"{ep.name} = {ep.value}"
        try:
            cls = ep.load()
            if ep.name in _table() and _table()[ep.name] is cls:
                continue
            register_model(ep.name, cls)
        except Exception as exc:  # a broken plug-in must not break anchordiv
            warnings.warn(f"anchordiv: skipped the geometry plug-in {where!r} (entry point group "
                          f"{ENTRY_POINT_GROUP}): {type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)
            continue
        found[ep.name] = cls
    return found


def _table() -> dict:
    return {**MODELS, **_baselines(), **_USER_MODELS}


def registry() -> dict:
    """All geometries by name: the anchor models, the baselines ``cosine`` and ``iti``, those
    added with :func:`register_model` and those of installed plug-ins (entry-point group
    ``anchordiv.models``, loaded on the first call)."""
    load_plugins()
    return _table()


def register_model(name: str, cls: type) -> type:
    """Register a geometry class under ``name`` so that ``make_model``, the command line, the
    experiments and ``Index.load`` know it.

    Index files name their model by registry name only, and loading never imports
    anything a file names; a file holding a user's own geometry therefore loads only in
    a process that registered that class first (an installed plug-in is registered on the
    first registry lookup). ``cls.PARAMS`` must declare only arguments of its constructor.
    Returns ``cls`` (usable as a decorator factory's result). Re-registering the same class
    under its name is a no-op.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_model: name must be an identifier such as 'my_model', got {name!r}.")
    if not (isinstance(cls, type) and issubclass(cls, Geometry)):
        raise TypeError(
            f"register_model: cls must be a subclass of ad.Geometry (or ad.AnchorModel), got {cls!r}."
        )
    current = _table().get(name)
    if current is not None and current is not cls:
        raise ValueError(
            f"register_model: the name {name!r} is already taken by {current.__module__}.{current.__qualname__}; "
            "choose another name."
        )
    check_declaration(cls)
    _USER_MODELS[name] = cls
    return cls


def model_params(name: str) -> dict[str, Param]:
    """The declared parameters of geometry ``name`` by parameter name (:class:`Param`), without
    the temperature; e.g. ``model_params("gmm")["n_components"].default == 4``.

    A constructor argument that the class does not declare is listed with a kind inferred from
    its default.
    """
    return declared_params(_lookup(name))


def models_taking(param: str) -> tuple[str, ...]:
    """Registry names of the geometries that declare the parameter ``param``."""
    return tuple(n for n in registry() if param in model_params(n))


def _lookup(name: str) -> type:
    table = registry()
    if name not in table:
        raise ValueError(
            f"Unknown model {name!r}; choose one of {', '.join(table)}, "
            "or register your own geometry class with ad.register_model(name, cls)."
        )
    return table[name]


def model_names(*, builtin: bool = False, **tags: bool) -> tuple[str, ...]:
    """Registry names whose :class:`Tags` match, e.g. ``model_names(takes_temperature=True)``;
    ``builtin=True`` lists only anchordiv's own geometries (and loads no plug-in)."""
    unknown = set(tags) - set(Tags.__dataclass_fields__)
    if unknown:
        raise ValueError(f"Unknown tag(s) {sorted(unknown)}; tags are {', '.join(Tags.__dataclass_fields__)}.")
    table = {**MODELS, **_baselines()} if builtin else registry()
    return tuple(n for n, c in table.items() if all(getattr(c.tags(), t) == v for t, v in tags.items()))


def model_name(cls: type) -> str | None:
    """The registry name of geometry class ``cls``, or None when it is not registered."""
    return next((n for n, c in registry().items() if c is cls), None)


def default_tau(models: Sequence[str], tau: Any = None, *fallbacks: Any) -> float | None:
    """The temperature for ``models``: ``tau``, else the first fallback that is not None.

    A fallback is a value (a collection's recorded τ) or a zero-argument callable (an
    encoder's τ, read only when needed). Returns None when no model takes a temperature;
    raises a ``ValueError`` when one does and none is known.
    """
    takes = [m for m in models if m in model_names(takes_temperature=True)]
    if not takes:
        return None
    for value in (tau, *fallbacks):
        value = value() if callable(value) else value
        if value is not None:
            return temperature(value)
    raise ValueError(
        f"{', '.join(takes)} need{'s' if len(takes) == 1 else ''} a temperature: pass tau (--tau), "
        "or use a collection or encoder that records one."
    )


def make_model(name: str, **params) -> Geometry:
    """Build a geometry from its registry name, e.g. ``make_model("gmm", n_components=8, tau=0.01)``.

    Names: ``softmax``, ``gaussian``, ``gmm``, ``latent_gaussian``, ``latent_spherical``,
    the baselines ``cosine`` and ``iti`` (which take no parameters), any name added
    with :func:`register_model` and any installed plug-in. The parameters of each are
    :func:`model_params`.
    """
    cls = _lookup(name)
    try:
        return cls(**params)
    except TypeError as exc:
        raise ValueError(f"Bad parameters for model {name!r}: {exc}") from None


__all__ = [
    "AnchorModel", "Geometry", "NotFittedError", "Softmax", "Gaussian", "GaussianMixture",
    "LatentGaussian", "LatentSpherical", "MODELS", "Param", "Tags", "registry", "register_model", "model_name",
    "model_names", "model_params", "models_taking", "make_model", "default_tau", "temperature", "load_plugins",
    "ENTRY_POINT_GROUP",
]
