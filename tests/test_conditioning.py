"""Well-conditioned feature maps: float64 results unchanged, float32 signs and top-10 order kept."""

import warnings

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv.testing import FLOAT32_EPS, assert_topk_up_to_rounding, float32_rounding, topk_up_to_rounding

pytestmark = pytest.mark.numeric


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
    """float32 divergences are ≥ 0 and the top-10 is float64's, both up to the float32 rounding of
    the conditioned features (with few anchors these τ fall back to float64 features, with a
    warning, and the results are only rounded to float32 at the end); a wrong top-10 (float64's ranks 30–39) is refused for most queries."""
    A, Q, G = data[anchors].astype(np.float32), data["Q"].astype(np.float32), data["G"].astype(np.float32)
    m32 = ad.Softmax(tau=tau).fit(A)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        D32 = m32.pairwise(Q, G)
        dist, idx = m32.search(Q, G, k=10)
        tol = float32_rounding(m32, Q, G)
    assert D32.dtype == np.float32 and idx.shape == (len(Q), 10)
    D64 = np.asarray(m32.pairwise(Q.astype(np.float64), G.astype(np.float64)))
    fallback = [w for w in caught if "computing them in float64" in str(w.message)]
    if anchors == "few":  # unresolvable in float32 at these τ: float64 features, float32 results
        assert fallback
        tol = tol * 2.0 ** -29 + 2 * FLOAT32_EPS * np.abs(np.sort(D64, axis=1)[:, 9])
    else:
        assert not fallback
    assert not (D32 < -tol[:, None]).any()
    assert_topk_up_to_rounding(m32, Q, G, idx, dist, tol=tol)
    wrong = np.argsort(D64, axis=1)[:, 30:40]
    assert topk_up_to_rounding(m32, Q, G, wrong, tol=tol).mean() < 0.5


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


@pytest.mark.parametrize("tau", [0.05, 0.01])
def test_probability_features_are_balanced_for_float32_indexes(data, tau):
    """N ≤ d: the blocks a·p and log p / a keep key norms near √(2‖log p‖) instead of ‖log p‖,
    within the analytic bound, so the float32 squared distances ‖y‖² + M² − 2yᵀx of a flat L2
    index over them resolve divergences that much finer. Its answer is a float64 top-10 up to
    that rounding (misses are near-duplicates whose divergences float32 cannot tell apart);
    the bound is no blanket: an answer missing the true top 30 is refused for most queries."""
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
        dist, got = flat.search(Q, 10)
        M = flat._backend.layout.max_norm
        assert M <= m.key_norm_bound() * (1 + 1e-5)
        tol = float32_rounding(m, Q, G, l2_norm=M)
    assert_topk_up_to_rounding(m, Q, G, got, dist, tol=tol)
    wrong = np.argsort(ad.Softmax(tau=tau).fit(data["few"]).pairwise(data["Q"], data["G"]), axis=1)[:, 30:40]
    assert topk_up_to_rounding(m, Q, G, wrong, tol=tol).mean() < 0.5
