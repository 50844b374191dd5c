"""anchordiv: context-specific similarity on fixed embeddings with anchor divergences.

Kannan, Park, Veitch (2026), "Anchor Divergence for Semantic Geometry in Contrastive
Learning". A set of text anchors defines a distribution; its cumulant generating
function defines a Bregman geometry on the (unchanged) embedding space.
"""

from . import diagnostics, exact, io, metrics, special
from .exact import search
from .anchors import AnchorSet
from .index import Index
from .models.baselines import Cosine, ImageTextInversion
from .models import (
    MODELS,
    AnchorModel,
    Gaussian,
    GaussianMixture,
    Geometry,
    LatentGaussian,
    LatentSpherical,
    NotFittedError,
    Softmax,
    make_model,
    register_model,
    registry,
)

__version__ = "0.1.0"

__all__ = [
    "AnchorSet", "AnchorModel", "Geometry", "NotFittedError", "Softmax", "Gaussian", "GaussianMixture",
    "LatentGaussian", "LatentSpherical", "Cosine", "ImageTextInversion", "MODELS", "make_model", "register_model", "registry",
    "Index", "diagnostics", "exact", "io", "metrics", "search", "special", "encoders", "integrations",
]

# Imported on first access (``ad.encoders.load(...)``), so that ``import anchordiv`` stays light.
_LAZY_SUBMODULES = ("encoders", "integrations", "anchorsfile", "report", "experiments")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
