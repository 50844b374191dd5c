"""Routed IVF certificates (softmax's co-coercivity bound) against a float64 brute force, and the
defaults of the approximate indexes on clustered data: recall, ef_search="auto"."""

from __future__ import annotations

import numpy as np
import pytest

import anchordiv as ad
from anchordiv.index import _certify
from anchordiv.testing import assert_topk_up_to_rounding, recall_up_to_rounding, topk_up_to_rounding

from test_certify import _clustered

faiss = pytest.importorskip("faiss")
pytestmark = pytest.mark.numeric


@pytest.fixture(scope="module")
def clustered():
    """Anchors, keys and queries unit(c + ε), ε ~ N(0, I)·0.8/√d (the benchmarks' generator)."""
    rng = np.random.default_rng(29)
    centres = rng.normal(size=(150, 48))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    return tuple(_clustered(rng, centres, n, 0.8 / np.sqrt(48)) for n in (300, 12_000, 200))


@pytest.mark.parametrize("n_anchors,tau", [(300, 0.01), (300, 0.05), (24, 0.01)],
                         ids=["embedding-0.01", "embedding-0.05", "probabilities-0.01"])
def test_feature_bound_is_below_the_float64_divergence(n_anchors, tau):
    """d_sym(q, g) ≥ w‖u(q) − u(g)‖² on every pair, near and far, with non-uniform weights."""
    rng = np.random.default_rng(3)
    d = 32
    A = rng.normal(size=(n_anchors, d))
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    X = np.vstack([A[:20] + 0.05 * rng.normal(size=(20, d)), rng.normal(size=(180, d))])
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    model = ad.Softmax(tau=tau).fit(ad.AnchorSet(A, weights=rng.uniform(0.2, 1.0, n_anchors)))
    assert model.feature_space_ == ("probabilities" if n_anchors <= d else "embedding")
    bound = model.feature_bound()
    _, phi = model.query_terms(X)
    psi = model.key_terms(X)
    u_q, u_g = bound.queries(phi), bound.keys(psi)
    lower = bound.weight * ((u_q[:, None, :] - u_g[None]) ** 2).sum(-1)
    D = np.asarray(model.pairwise(X, X))
    assert (lower <= D + 1e-12 * (1 + np.abs(D))).all()
    assert (lower[D > 1e-6] / D[D > 1e-6]).max() > 0.05  # and it is not vacuous
    assert model.feature_bound(symmetric=False) is None
    assert ad.make_model("gmm", tau=tau).fit(A).feature_bound() is None  # no such bound known


def test_ball_bounds_are_below_every_member_of_each_group():
    rng = np.random.default_rng(5)
    u_keys = rng.normal(size=(3000, 16))
    groups = rng.integers(40, size=3000)
    groups[groups == 7] = 8  # an empty group
    centroids, radii = _certify.group_balls(lambda: ((s, u_keys[s:s + 512]) for s in range(0, 3000, 512)), groups, 40)
    assert radii[7] == 0
    u = np.vstack([rng.normal(size=(20, 16)), centroids[:5]])  # queries inside balls too
    weight, error = 0.7, 1e-4
    bound = _certify.ball_bounds(u, centroids, radii, weight, error)
    true = weight * ((u[:, None, :] - u_keys[None]) ** 2).sum(-1)
    for g in set(range(40)) - {7}:
        assert (bound[:, g] <= true[:, groups == g].min(1)).all()
    assert (bound > 0).any() and (bound[20:, :5].diagonal() == 0).all()


@pytest.mark.parametrize("tau", [0.01, 0.05])
def test_routed_softmax_certificates_equal_the_float64_brute_force(clustered, tau, monkeypatch):
    """Every certified query's result is a float64 top-10 (up to rounding ties); most are certified at
    τ = 0.01; the second round certifies queries the first did not; fallback makes every row exact."""
    from anchordiv.index import _faiss

    A, G, Q = clustered
    model = ad.Softmax(tau=tau).fit(ad.AnchorSet(A))
    index = ad.Index(model, "faiss", index_type="ivf")
    index.add(G)
    assert index.params["candidates"] == "routed"
    d, i, certified = index.search(Q, 10, certify=True, fallback=False)
    assert topk_up_to_rounding(model, Q[certified], G, i[certified], d[certified]).all()  # never a false "certified"
    if tau == 0.01:
        assert certified.mean() > 0.5
    d2, i2, certified2 = index.search(Q, 10, certify=True)
    assert np.array_equal(certified2, certified) and np.array_equal(i2[certified], i[certified])
    assert_topk_up_to_rounding(model, Q, G, i2, d2)
    monkeypatch.setattr(_faiss, "SECOND_ROUND_SHARE", 0.0)  # the first round alone
    _, i1, first = index.search(Q, 10, certify=True, fallback=False)
    assert topk_up_to_rounding(model, Q[first], G, i1[first]).all()
    assert (first <= certified).all() and (tau != 0.01 or certified.sum() > first.sum())


def test_routed_certificates_hold_with_an_allow_list_and_exclusions(clustered):
    A, G, Q = clustered
    model = ad.Softmax(tau=0.01).fit(ad.AnchorSet(A))
    index = ad.Index(model, "faiss", index_type="ivf").add(G)
    allowed = np.arange(0, len(G), 2)
    d, i, certified = index.search(Q, 5, filter=allowed, certify=True, fallback=False)
    assert np.isin(i, allowed).all() and certified.any()
    assert topk_up_to_rounding(model, Q[certified], G, i[certified], d[certified], allowed=allowed).all()
    own = i[:, 0]
    d, i, certified = index.search(Q, 5, exclude=own, certify=True, fallback=False)
    assert not (i == own[:, None]).any() and certified.any()
    assert topk_up_to_rounding(model, Q[certified], G, i[certified], d[certified], exclude=own[certified, None]).all()


@pytest.mark.parametrize("name", ["softmax", "gmm"])
@pytest.mark.parametrize("index_type", ["hnsw", "ivf"])
def test_defaults_reach_the_recall_target_on_clustered_data(clustered, name, index_type):
    """softmax τ = 0.05 and GMM with every default: recall@10 ≥ 0.99 against the float64 top-10."""
    A, G, Q = clustered
    model = ad.make_model(name, tau=0.05).fit(ad.AnchorSet(A))
    index = ad.Index(model, "faiss", index_type=index_type).add(G)
    _, i = index.search(Q, 10)
    assert recall_up_to_rounding(model, Q, G, i) >= 0.99


def test_hnsw_ef_search_auto_is_tuned_kept_and_saved(clustered, tmp_path):
    from anchordiv.index._faiss import EF_SEARCH_LADDER

    A, G, Q = clustered
    model = ad.Softmax(tau=0.05).fit(ad.AnchorSet(A))
    index = ad.Index(model, "faiss", index_type="hnsw", M=16).add(G[:6000])
    backend = index._backend
    assert index.params["ef_search"] == "auto" and backend.tuned_ef_search in EF_SEARCH_LADDER
    assert backend.tuned_at == 6000 and backend.ef_search == backend.tuned_ef_search
    index.add(G[6000:8000])  # +33 %: kept
    assert backend.tuned_at == 6000
    index.add(G[8000:])  # 12,000 ≥ 1.5 × 6,000: tuned again
    assert backend.tuned_at == 12_000
    index.save(tmp_path / "h.index")
    loaded = ad.Index.load(tmp_path / "h.index")
    assert loaded._backend.tuned_ef_search == backend.tuned_ef_search
    fixed = ad.Index(model, "faiss", index_type="hnsw", M=16, ef_search=40).add(G[:2000])
    assert fixed._backend.tuned_ef_search is None and fixed._backend.ef_search == 40


def test_the_brute_force_check_catches_an_unsound_bound(clustered, monkeypatch):
    """Bounds inflated 100× certify queries whose results are not exact, and the float64 check
    used above sees it: a check that would let an unsound certificate pass is no check."""
    from anchordiv.index import _faiss

    A, G, Q = clustered
    model = ad.Softmax(tau=0.01).fit(ad.AnchorSet(A))
    index = ad.Index(model, "faiss", index_type="ivf", nprobe=1).add(G)
    real = _certify.ball_bounds
    monkeypatch.setattr(_faiss._certify, "ball_bounds", lambda *a: 100 * real(*a))
    monkeypatch.setattr(_faiss, "SECOND_ROUND_SHARE", 0.0)
    d, i, certified = index.search(Q, 10, certify=True, fallback=False)
    assert not topk_up_to_rounding(model, Q[certified], G, i[certified], d[certified]).all()
