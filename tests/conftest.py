import numpy as np
import pytest


#: Small-data parameters of every geometry in the registry, shared by the search and index tests.
GEOMETRY_PARAMS = {
    "softmax": dict(tau=0.05),
    "gaussian": dict(tau=0.05),
    "gmm": dict(tau=0.05, n_components=2),
    "latent_gaussian": dict(tau=0.05, rank=4),
    "latent_spherical": dict(tau=0.05, rank=4),
    "cosine": {},
    "iti": {},
}


def unit_rows(rng, n, d, center=None, spread=1.0):
    """Random unit vectors, optionally concentrated around ``center``."""
    X = rng.normal(size=(n, d)) * spread
    if center is not None:
        X = X + center
    return X / np.linalg.norm(X, axis=1, keepdims=True)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def data(rng):
    """Anchors, queries and gallery in float64 with a shared dominant direction (CLIP-like cone)."""
    d = 12
    center = rng.normal(size=d) * 1.5
    anchors = unit_rows(rng, 60, d, center)
    Q = unit_rows(rng, 7, d, center)
    G = unit_rows(rng, 9, d, center)
    return anchors, Q, G

