"""Well-conditioned feature maps: float64 results unchanged, float32 signs and top-10 order kept."""

import warnings

import numpy as np
import pytest
import torch

import anchordiv as ad


def clustered(rng, n, d, centres, radius=0.6):
    X = centres[rng.integers(0, len(centres), n)] + rng.normal(size=(n, d)) * radius / np.sqrt(d)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(4)
    d = 48
    centres = rng.normal(size=(12, d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    return {"few": clustered(rng, 18, d, centres, 0.3), "many": clustered(rng, 200, d, centres, 0.5),
            "Q": clustered(rng, 120, d, centres), "G": clustered(rng, 1500, d, centres)}


def eta_form(model, Q, G):
    """½(η_q − η_g)ᵀ(∇κ_q − ∇κ_g) in float64 (eq. F.1), independently of the feature maps."""
    eq, eg = np.asarray(model.natural_params(Q)), np.asarray(model.natural_params(G))
    gq, gg = np.asarray(model.grad_cgf(eq)), np.asarray(model.grad_cgf(eg))
    return 0.5 * ((eq * gq).sum(1)[:, None] + (eg * gg).sum(1)[None] - eq @ gg.T - gq @ eg.T)


def agreement(D64, idx, k=10):
    """Share of float64's top-k found, counting a swap within 1e-6 (relative) of the k-th as a tie."""
    ref = np.argsort(D64, axis=1, kind="stable")[:, :k]
    kth = np.take_along_axis(D64, ref[:, -1:], 1)[:, 0]
    hits = 0
    for r in range(len(D64)):
        extra = list(set(idx[r]) - set(ref[r]))
        hits += k - len(extra) + int((np.abs(D64[r, extra] - kth[r]) <= 1e-6 * abs(kth[r])).sum())
    return hits / (k * len(D64))


@pytest.mark.parametrize("anchors", ["few", "many"])
@pytest.mark.parametrize("name", ["softmax", "gmm"])
def test_float64_features_equal_eq_f1(data, anchors, name):
    params = {"gmm": dict(n_components=3)}.get(name, {})
    m = ad.make_model(name, tau=0.05, **params).fit(data[anchors])
    Q, G = data["Q"][:20], data["G"][:50]
    D = m.pairwise(Q, G)
    np.testing.assert_allclose(D, eta_form(m, Q, G), rtol=1e-9, atol=1e-9 * np.abs(D).max())
    expected = "probabilities" if (name == "softmax" and anchors == "few") else None
    assert getattr(m, "feature_space_", None) in (expected, "embedding" if name == "softmax" else None)


@pytest.mark.parametrize("anchors,tau", [("few", 0.01), ("few", 1e-3), ("many", 0.05), ("many", 0.01)])
def test_float32_keeps_signs_and_top10(data, tau, anchors):
    A, Q, G = data[anchors], data["Q"], data["G"]
    ref = ad.Softmax(tau=tau).fit(A).pairwise(Q, G)
    m32 = ad.Softmax(tau=tau).fit(A.astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        D32 = m32.pairwise(Q.astype(np.float32), G.astype(np.float32))
        _, idx = m32.search(Q.astype(np.float32), G.astype(np.float32), k=10)
    scale = np.abs(ref).max(axis=1, keepdims=True)
    assert not (D32 < -1e-6 * scale).any()
    assert agreement(ref, idx) >= 0.999


def test_unresolvable_float32_falls_back_to_float64_with_a_warning(data):
    m = ad.Softmax(tau=1e-3).fit(data["few"].astype(np.float32))
    G = data["G"][:200].astype(np.float32)
    with pytest.warns(RuntimeWarning, match="cannot resolve these softmax divergences.*float64"):
        psi = m.key_features(G)
    assert psi.dtype == np.float32  # results keep the input's dtype
    with pytest.warns(RuntimeWarning):
        index = ad.Index(m).add(G)
    assert index._backend.dtype == torch.float64  # the exact backend keeps the float64 features
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a well-resolved case stays silent and in float32
        ad.Softmax(tau=0.05).fit(data["few"].astype(np.float32)).key_features(G)


@pytest.mark.parametrize("tau,flat_agreement", [(0.05, 0.98), (0.01, 0.91)])
def test_probability_features_are_balanced_for_float32_indexes(data, tau, flat_agreement):
    """N ≤ d: the blocks a·p and log p / a keep key norms near √(2‖log p‖) instead of ‖log p‖,
    within the analytic bound, so a float32 flat L2 index over them finds most of the float64
    top-10 (unbalanced, 0.915 and 0.887 here). Its misses are near-duplicates whose divergence
    (≈ 1e-6) is below the resolution of float32 squared distances of size ‖y‖² + M²."""
    pytest.importorskip("faiss")
    m = ad.Softmax(tau=tau).fit(data["few"].astype(np.float32))
    assert m.feature_space_ == "probabilities"
    G, Q = data["G"].astype(np.float32), data["Q"].astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        psi = np.asarray(m.key_features(G), dtype=np.float64)
        logits = data["G"] @ data["few"].T / tau  # uniform weights: log P = logits − logsumexp
        top = logits.max(1, keepdims=True)
        logp = logits - top - np.log(np.exp(logits - top).sum(1, keepdims=True))
        a = m.feature_scale_
        np.testing.assert_allclose(psi[:, :18], logp / a, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(psi[:, 18:36], np.exp(logp) * a, rtol=1e-5, atol=1e-6)
        assert np.linalg.norm(psi, axis=1).max() <= m.key_norm_bound()
        assert np.linalg.norm(psi, axis=1).max() < 0.5 * np.linalg.norm(logp, axis=1).max()
        flat = ad.Index(m, "faiss", index_type="flat").add(G)
        _, got = flat.search(Q, 10)
    assert agreement(ad.Softmax(tau=tau).fit(data["few"]).pairwise(data["Q"], data["G"]), got) >= flat_agreement
