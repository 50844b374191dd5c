"""Softmax κ(η) and ∇κ(η) against a brute-force float64 log-sum-exp over all anchors."""

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv.models import softmax as softmax_module

pytestmark = pytest.mark.numeric

N, D = 50, 16
TAU = 1e-3


def unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def brute_force(eta, anchors, weights):
    """κ = log Σ_i w_i exp(ηᵀγ_i) and ∇κ = Σ_i softmax_i γ_i, in numpy float64, all anchors at once."""
    eta, anchors = np.asarray(eta, np.float64), np.asarray(anchors, np.float64)
    w = np.asarray(weights, np.float64) / np.sum(weights)
    with np.errstate(divide="ignore"):
        logits = eta @ anchors.T + np.log(w)[None, :]
    top = logits.max(axis=1, keepdims=True)
    kappa = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    p = np.exp(logits - kappa[:, None])
    return kappa, p @ anchors


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    anchors = unit(rng.standard_normal((N, D)))
    X = unit(rng.standard_normal((23, D)))
    weights = rng.dirichlet(np.full(N, 0.3))
    weights[3] = 0.0                                   # a zero-weight anchor carries no mass
    return anchors, X, weights


def fit(anchors, weights, chunk, tau=TAU):
    measure = ad.AnchorSet(anchors, weights=weights)
    params = {} if chunk is None else {"anchor_batch_size": chunk}       # None: the default chunk
    return ad.Softmax(tau=tau, **params).fit(measure)


@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
@pytest.mark.parametrize("chunk", [1, 7, N, N + 13, None])
@pytest.mark.parametrize("row_block", [None, 5])
def test_float64_matches_brute_force(data, monkeypatch, weighted, chunk, row_block):
    anchors, X, weights = data
    w = weights if weighted else np.ones(N)
    if row_block is not None:                                      # several row blocks, the last partial
        monkeypatch.setattr(softmax_module, "ROW_BLOCK", row_block)
    model = fit(anchors, w if weighted else None, chunk)
    eta = X / TAU
    kappa, grad = model.cgf(eta), model.grad_cgf(eta)
    ref_kappa, ref_grad = brute_force(eta, anchors, w)
    assert kappa.dtype == np.float64 and grad.dtype == np.float64
    assert kappa.shape == (X.shape[0],) and grad.shape == X.shape
    assert np.isfinite(kappa).all() and np.isfinite(grad).all()
    np.testing.assert_allclose(kappa, ref_kappa, rtol=1e-12, atol=0)
    np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=1e-12)
    # the tilted mean of unit anchors lies in their convex hull: norm at most 1
    assert (np.linalg.norm(grad, axis=1) <= 1 + 1e-12).all()


@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
@pytest.mark.parametrize("chunk", [1, 7, N + 13])
def test_float32_within_rounding(data, weighted, chunk):
    anchors, X, weights = data
    w = weights if weighted else np.ones(N)
    model = fit(anchors.astype(np.float32), w if weighted else None, chunk)
    eta = (X / TAU).astype(np.float32)
    kappa, grad = model.cgf(eta), model.grad_cgf(eta)
    assert kappa.dtype == np.float32 and grad.dtype == np.float32
    assert np.isfinite(kappa).all() and np.isfinite(grad).all()
    ref_kappa, ref_grad = brute_force(eta, anchors.astype(np.float32), w)
    # logits of size |η| = 1/τ = 1000 carry an absolute float32 rounding of ≈ 1e-4
    np.testing.assert_allclose(kappa, ref_kappa, rtol=1e-6, atol=0)
    np.testing.assert_allclose(grad, ref_grad, rtol=0, atol=1e-4)


def test_float64_rows_with_float32_anchors(data):
    """Float64 η against float32 anchors: each chunk is cast, the result is exact in float64."""
    anchors, X, weights = data
    anchors32 = torch.from_numpy(anchors.astype(np.float32))
    model = ad.Softmax(tau=TAU, anchor_batch_size=7).fit(ad.AnchorSet(anchors32, weights=weights))
    eta = torch.from_numpy(X / TAU)
    kappa, grad = model.cgf(eta), model.grad_cgf(eta)
    assert kappa.dtype == torch.float64 and grad.dtype == torch.float64
    ref_kappa, ref_grad = brute_force(eta.numpy(), anchors32.double().numpy(), weights)
    np.testing.assert_allclose(kappa.numpy(), ref_kappa, rtol=1e-12, atol=0)
    np.testing.assert_allclose(grad.numpy(), ref_grad, rtol=0, atol=1e-12)


def test_chunkings_agree_on_the_features(data, monkeypatch):
    """query_features (η, ∇κ) do not depend on the anchor chunk or the row block."""
    anchors, X, weights = data
    ref = fit(anchors, weights, N).query_features(X, symmetric=False)
    monkeypatch.setattr(softmax_module, "ROW_BLOCK", 4)
    for chunk in (1, 7, 3 * N):
        out = fit(anchors, weights, chunk).query_features(X, symmetric=False)
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_single_row_and_single_anchor():
    gamma = np.array([[0.6, 0.8]])
    model = ad.Softmax(tau=TAU).fit(gamma)
    eta = np.array([[3.0, -4.0]]) / TAU
    np.testing.assert_allclose(model.cgf(eta), eta @ gamma.T[:, 0], rtol=1e-15)
    np.testing.assert_allclose(model.grad_cgf(eta), gamma, rtol=1e-15)


def test_anchors_are_not_copied():
    anchors = torch.from_numpy(unit(np.random.default_rng(1).standard_normal((N, D))).astype(np.float32))
    model = ad.Softmax(tau=TAU).fit(anchors)
    assert model.anchors_.data_ptr() == anchors.data_ptr()
    weighted = ad.Softmax(tau=TAU).fit(ad.AnchorSet(anchors, weights=np.linspace(1, 2, N)))
    assert weighted.anchors_.data_ptr() == anchors.data_ptr()
