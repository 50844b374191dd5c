import numpy as np
import pytest
import torch


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


@pytest.fixture(autouse=True)
def _torch_threads():
    torch.manual_seed(0)
    yield
