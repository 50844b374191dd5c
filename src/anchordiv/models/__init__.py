"""Anchor-distribution models and the name registry shared by the Python API, the CLI and index files."""

from __future__ import annotations

from typing import Any, Sequence

from .base import AnchorModel, Geometry, NotFittedError, Tags, temperature
from .gaussian import Gaussian
from .latent import LatentGaussian, LatentSpherical
from .mixture import GaussianMixture
from .softmax import Softmax

#: Anchor models by registry name.
MODELS = {
    "softmax": Softmax,
    "gaussian": Gaussian,
    "gmm": GaussianMixture,
    "latent_gaussian": LatentGaussian,
    "latent_spherical": LatentSpherical,
}

#: Geometries registered by users with :func:`register_model`.
_USER_MODELS: dict[str, type] = {}


def _baselines():
    from ..baselines import Cosine, ImageTextInversion

    return {"cosine": Cosine, "iti": ImageTextInversion}


def registry() -> dict:
    """All geometries by name: the anchor models, the baselines ``cosine`` and ``iti``, and
    those added with :func:`register_model`."""
    return {**MODELS, **_baselines(), **_USER_MODELS}


def register_model(name: str, cls: type) -> type:
    """Register a geometry class under ``name`` so that ``make_model`` and ``Index.load`` know it.

    Index files name their model by registry name only, and loading never imports
    anything a file names; a file holding a user's own geometry therefore loads only in
    a process that registered that class first. Returns ``cls`` (usable as a decorator
    factory's result). Re-registering the same class under its name is a no-op.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_model: name must be an identifier such as 'my_model', got {name!r}.")
    if not (isinstance(cls, type) and issubclass(cls, Geometry)):
        raise TypeError(
            f"register_model: cls must be a subclass of ad.Geometry (or ad.AnchorModel), got {cls!r}."
        )
    current = registry().get(name)
    if current is not None and current is not cls:
        raise ValueError(
            f"register_model: the name {name!r} is already taken by {current.__module__}.{current.__qualname__}; "
            "choose another name."
        )
    _USER_MODELS[name] = cls
    return cls


def model_names(**tags: bool) -> tuple[str, ...]:
    """Registry names whose :class:`Tags` match, e.g. ``model_names(takes_temperature=True)``."""
    unknown = set(tags) - set(Tags.__dataclass_fields__)
    if unknown:
        raise ValueError(f"Unknown tag(s) {sorted(unknown)}; tags are {', '.join(Tags.__dataclass_fields__)}.")
    return tuple(n for n, c in registry().items() if all(getattr(c.tags(), t) == v for t, v in tags.items()))


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
    the baselines ``cosine`` and ``iti`` (which take no parameters), and any name added
    with :func:`register_model`.
    """
    table = registry()
    if name not in table:
        raise ValueError(
            f"Unknown model {name!r}; choose one of {', '.join(table)}, "
            "or register your own geometry class with ad.register_model(name, cls)."
        )
    try:
        return table[name](**params)
    except TypeError as exc:
        raise ValueError(f"Bad parameters for model {name!r}: {exc}") from None


__all__ = [
    "AnchorModel", "Geometry", "NotFittedError", "Softmax", "Gaussian", "GaussianMixture",
    "LatentGaussian", "LatentSpherical", "MODELS", "Tags", "registry", "register_model", "model_name",
    "model_names", "make_model", "default_tau", "temperature",
]
