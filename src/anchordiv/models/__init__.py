"""Anchor-distribution models and the name registry shared by the Python API and the CLI."""

from __future__ import annotations

from .base import AnchorModel, Geometry, NotFittedError
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


def _baselines():
    from ..baselines import Cosine, ImageTextInversion

    return {"cosine": Cosine, "iti": ImageTextInversion}


def registry() -> dict:
    """All geometries by name: the anchor models and the baselines ``cosine`` and ``iti``."""
    return {**MODELS, **_baselines()}


def make_model(name: str, **params) -> Geometry:
    """Build a geometry from its registry name, e.g. ``make_model("gmm", n_components=8, tau=0.01)``.

    Names: ``softmax``, ``gaussian``, ``gmm``, ``latent_gaussian``, ``latent_spherical``,
    and the baselines ``cosine`` and ``iti`` (which take no parameters).
    """
    table = registry()
    if name not in table:
        raise ValueError(f"Unknown model {name!r}; choose one of {', '.join(table)}.")
    try:
        return table[name](**params)
    except TypeError as exc:
        raise ValueError(f"Bad parameters for model {name!r}: {exc}") from None


__all__ = [
    "AnchorModel", "Geometry", "NotFittedError", "Softmax", "Gaussian", "GaussianMixture",
    "LatentGaussian", "LatentSpherical", "MODELS", "registry", "make_model",
]
