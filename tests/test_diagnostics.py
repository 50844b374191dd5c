"""Anchor diagnostics (anchordiv.diagnostics) against an independent float64 computation."""

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv.diagnostics import explain


def _brute(A, w, X, tau):
    """P(i|x) ∝ w_i exp(xᵀa_i/τ) in float64 numpy, its entropy and its order."""
    L = X.astype(np.float64) @ A.astype(np.float64).T / tau + np.log(w)
    L -= L.max(1, keepdims=True)
    P = np.exp(L) / np.exp(L).sum(1, keepdims=True)
    H = -np.sum(np.where(P > 0, P * np.log(np.where(P > 0, P, 1)), 0), axis=1)
    return P, H


@pytest.fixture
def setup():
    rng = np.random.default_rng(3)
    A = rng.normal(size=(7, 5))
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    X = rng.normal(size=(40, 5))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    w = rng.uniform(0.5, 2.0, size=7)
    texts = [f"anchor {i}" for i in range(7)]
    return A, X, w / w.sum(), texts


def test_probabilities_entropy_and_top_anchors_match_float64(setup):
    A, X, w, texts = setup
    tau = 0.07
    S = ad.AnchorSet(A.astype(np.float32), texts=texts, weights=w)
    ex = explain(S, X, tau=tau, top=3)
    P, H = _brute(S.embeddings.numpy(), S.weights.double().numpy(), X, tau)
    np.testing.assert_allclose(ex.entropy, H, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ex.effective_number, np.exp(H), rtol=1e-10)
    order = np.argsort(-P, axis=1)[:, :3]
    np.testing.assert_array_equal(ex.top_indices, order)
    np.testing.assert_allclose(ex.top_probabilities, np.take_along_axis(P, order, 1), rtol=1e-10, atol=1e-14)
    assert ex.top_anchors(0) == [(texts[i], pytest.approx(P[0, i], rel=1e-10)) for i in order[0]]
    assert (1 <= ex.effective_number).all() and (ex.effective_number <= 7 + 1e-9).all()
    # coverage: concentrated items and anchors that are never any item's top one
    cov = ex.coverage(few=2, mass=0.6)
    top2 = np.sort(P, axis=1)[:, ::-1][:, :2].sum(1)
    assert cov.n_concentrated == int((top2 >= 0.6).sum())
    counts = np.bincount(P.argmax(1), minlength=7)
    np.testing.assert_array_equal(cov.top_counts, counts)
    assert cov.never_top == [texts[i] for i in np.flatnonzero(counts == 0)]
    assert cov.median_effective == pytest.approx(float(np.median(np.exp(H))))
    assert f"{cov.n_concentrated} of 40 items" in cov.summary()
    frame = ex.to_frame()
    assert list(frame.columns[:4]) == ["entropy", "effective_number", "top_anchor_1", "top_p_1"]


def test_limits_and_model_explain(setup):
    A, X, w, texts = setup
    # one dominant anchor: entropy → 0, effective number → 1; equal logits: log N
    ex = explain(np.vstack([X[0], -X[0]]), X[:1], tau=1e-3, top=2)
    assert ex.entropy[0] == pytest.approx(0.0, abs=1e-12) and ex.effective_number[0] == pytest.approx(1.0)
    ex = explain(A, np.zeros((1, 5)), tau=0.1, top=7)
    assert ex.entropy[0] == pytest.approx(np.log(7), rel=1e-12)
    # a fitted softmax model explains with its own anchors, weights, texts and τ
    S = ad.AnchorSet(A, texts=texts, weights=w)
    m = ad.Softmax(tau=0.05).fit(S)
    a, b = m.explain(torch.as_tensor(X), top=2), explain(S, X, tau=0.05, top=2)
    np.testing.assert_allclose(a.entropy, b.entropy, rtol=1e-12)
    assert a.top_anchors(3) == b.top_anchors(3)
    with pytest.raises(ValueError, match="keeps no anchors"):
        ad.Gaussian(tau=0.05).fit(S).explain(X)
    with pytest.raises(ValueError, match="tau must be"):
        explain(S, X, tau=0)
    with pytest.raises(ValueError, match="dimension 3"):
        explain(S, X[:, :3], tau=0.1)
    with pytest.raises(ValueError, match="few = 4 exceeds"):
        explain(S, X, tau=0.1, top=3).coverage(few=4)
