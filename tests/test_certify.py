"""Certificates of exactness for approximate indexes: never a false "certified"."""

from __future__ import annotations

import numpy as np
import pytest

import anchordiv as ad
from anchordiv.index import _certify
from anchordiv.testing import assert_topk_up_to_rounding, float32_rounding, topk_up_to_rounding

faiss = pytest.importorskip("faiss")
pytestmark = pytest.mark.numeric


def _clustered(rng, centres, n, spread):
    x = centres[rng.integers(len(centres), size=n)] + rng.normal(size=(n, centres.shape[1])) * spread
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(64, 8))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    return (_clustered(rng, centres, 256, 0.1), _clustered(rng, centres, 6000, 0.02),
            _clustered(rng, centres, 200, 0.02))


MODELS = {
    "cosine": lambda A: ad.Cosine(),
    "gaussian": lambda A: ad.Gaussian(tau=0.1).fit(ad.AnchorSet(A)),
    "softmax": lambda A: ad.Softmax(tau=0.1).fit(ad.AnchorSet(A)),
}
INDEXES = [("flat", {}), ("ivf", {"nlist": 64, "nprobe": 1}), ("ivf", {"nlist": 64, "nprobe": 4}),
           ("hnsw", {"M": 8, "ef_search": 16})]


@pytest.mark.parametrize("index_type,params", INDEXES, ids=["flat", "ivf1", "ivf4", "hnsw"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_certified_queries_are_exact_and_fallback_makes_all_exact(data, name, index_type, params):
    A, G, Q = data
    model = MODELS[name](A)
    exact = ad.Index(model)
    exact.add(G)
    d_exact, i_exact = exact.search(Q, 10)
    index = ad.Index(model, "faiss", index_type=index_type, shortlist=16, candidates="features", **params)
    index.add(G)
    d, i, certified = index.search(Q, 10, certify=True, fallback=False)
    assert certified.dtype == bool and certified.shape == (len(Q),)
    assert topk_up_to_rounding(model, Q[certified], G, i[certified], d[certified]).all()  # never a false "certified"
    if index_type == "hnsw":
        assert not certified.any()
    if index_type == "flat" or (name != "softmax" and params.get("nprobe") == 4):
        assert certified.mean() > 0.5  # the bounds are tight enough to be of use here
    d2, i2, certified2 = index.search(Q, 10, certify=True)
    assert np.array_equal(certified2, certified)
    assert np.array_equal(i2[certified], i[certified]) and np.array_equal(d2[certified], d[certified])
    assert_topk_up_to_rounding(model, Q, G, i2, d2)  # the others searched again exactly
    assert_topk_up_to_rounding(model, Q, G, i_exact, d_exact)


@pytest.mark.parametrize("name,candidates", [("softmax", "embedding"), ("gmm", "auto")])
def test_embedding_candidates_and_routed_mixtures_certify_nothing_and_fall_back_exactly(data, name, candidates):
    """Embedding candidates bound nothing; routed lists of a mixture neither (it declares no
    FeatureBound; routed softmax certificates: test_index_certify_routed)."""
    A, G, Q = data
    model = ad.make_model(name, tau=0.1).fit(ad.AnchorSet(A))
    index = ad.Index(model, "faiss", index_type="ivf", nlist=64, candidates=candidates)
    # "auto": routed lists for an anchor model without a Euclidean embedding
    assert index.params["candidates"] == ("routed" if candidates == "auto" else candidates)
    index.add(G)
    d, i, certified = index.search(Q, 10, certify=True)
    assert not certified.any()
    assert_topk_up_to_rounding(model, Q, G, i, d)


def test_certify_with_exclusions_and_on_the_exact_backend(data):
    A, G, Q = data
    model = MODELS["gaussian"](A)
    exact = ad.Index(model)
    exact.add(G)
    # each query excludes its nearest key, which would otherwise lead its top 5
    D64 = np.asarray(model.pairwise(Q.astype(np.float64), G.astype(np.float64)))
    own, D = D64.argmin(1), np.sort(D64, axis=1)
    clear = D[:, 5] - D[:, 4] > float32_rounding(model, Q, G)  # then a top 5 without it is not one with it
    assert clear.mean() > 0.5
    _, i_exact = exact.search(Q, 5, exclude=own)
    d, i, certified = exact.search(Q, 5, exclude=own, certify=True)
    assert certified.all() and np.array_equal(i, i_exact)  # the same computation, certified
    assert_topk_up_to_rounding(model, Q, G, i, d, exclude=own[:, None])
    index = ad.Index(model, "faiss", index_type="ivf", nlist=64, nprobe=1)
    index.add(G)
    d, i, certified = index.search(Q, 5, exclude=own, certify=True)
    assert not (i == own[:, None]).any()
    assert_topk_up_to_rounding(model, Q, G, i, d, exclude=own[:, None])
    assert not topk_up_to_rounding(model, Q[clear], G, i[clear]).any()  # not a top 5 of all keys


def test_unprobed_bound_is_below_every_true_distance():
    """The list bounds against a float64 brute force over the keys of the lists not probed."""
    rng = np.random.default_rng(1)
    for augmented in (False, True):
        x = rng.normal(size=(3000, 6))
        if augmented:  # keys padded to one norm M, queries with a zero pad coordinate
            M = np.linalg.norm(x, axis=1).max() * 1.1
            x = np.hstack([x, np.sqrt(M ** 2 - (x ** 2).sum(1))[:, None]])
        x = x.astype(np.float32)
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(x.shape[1]), x.shape[1], 16)
        index.train(x)
        index.add(x)
        y = rng.normal(size=(50, x.shape[1])) * 2
        if augmented:
            y[:, -1] = 0
        centroids = np.asarray(index.quantizer.reconstruct_n(0, 16)).astype(np.float64)
        radii = _certify.list_radii(index, 6)
        _, probed = index.quantizer.search(y.astype(np.float32), 3)
        bound = _certify.unprobed_bound(y, centroids, radii, probed, M if augmented else None)
        _, assign = index.quantizer.search(x, 1)
        true = ((y[:, None, :] - x[None].astype(np.float64)) ** 2).sum(-1)
        unprobed = ~(assign[:, 0][None, :] == probed[:, :, None]).any(1)
        assert np.all(bound <= np.where(unprobed, true, np.inf).min(1) + 1e-9)
        assert np.isfinite(bound).all() and (bound > 0).any()


def test_scanned_bound_and_slack():
    dist = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 0.0]])
    ids = np.array([[4, 5, 6], [4, 5, -1]])
    assert np.array_equal(_certify.scanned_bound(dist, ids), [3.0, np.inf])
    slack = _certify.rounding_slack(10, np.array([1.0, 2.0]))
    np.testing.assert_allclose(slack, 4 * 12 * 2.0 ** -24 * np.array([1.0, 4.0]))
    assert np.array_equal(_certify.certified(np.array([1.0, 1.0]), np.array([1.0 + 1e-3, 1.0]), slack), [True, False])


def test_ivf_lists_are_sized_for_the_whole_streamed_batch(data):
    """A batch streamed in small blocks trains ⌊4√n⌋-style lists for all of it, not for its first block."""
    from anchordiv.index._faiss import default_nlist

    A, G, _ = data
    model = MODELS["softmax"](A)
    index = ad.Index(model, "faiss", index_type="ivf", memory_budget=2**20)
    index.add(G)
    assert index._backend.nlist == default_nlist(len(G)) == 153
    assert index._backend.index.ntotal == len(G) and len(index) == len(G)
    d, i = index.search(G[:5], 1)
    assert np.array_equal(i[:, 0], np.arange(5))


@pytest.mark.parametrize("index_type", ["flat", "ivf"])
def test_certify_with_an_allow_list_is_exact_among_the_allowed(data, index_type):
    A, G, Q = data
    model = MODELS["gaussian"](A)
    allowed = np.arange(0, len(G), 3)
    index = ad.Index(model, "faiss", index_type=index_type, **({"nlist": 64, "nprobe": 2} if index_type == "ivf" else {}))
    index.add(G)
    d, i, certified = index.search(Q, 5, filter=allowed, certify=True)
    assert np.isin(i, allowed).all()
    assert_topk_up_to_rounding(model, Q, G, i, d, allowed=allowed)
    assert certified.dtype == bool and (certified.any() if index_type == "flat" else not certified.any())
