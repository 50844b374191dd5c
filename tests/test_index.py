"""ad.Index: exact, faiss and milvus (milvus-lite and a Milvus server) backends against model.search; persistence; bad input."""

import importlib.util
import os
import sys
import warnings

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv.index import Index
from anchordiv.testing import assert_topk_up_to_rounding, float32_rounding, recall_up_to_rounding

from conftest import GEOMETRY_PARAMS, MILVUS_KINDS, collection_namer, unit_rows

HAS_FAISS = importlib.util.find_spec("faiss") is not None
HAS_MILVUS = importlib.util.find_spec("pymilvus") is not None and importlib.util.find_spec("milvus_lite") is not None
needs_faiss = pytest.mark.skipif(not HAS_FAISS, reason="needs faiss-cpu (pip install faiss-cpu)")
needs_milvus = pytest.mark.skipif(not HAS_MILVUS, reason="needs pymilvus and milvus-lite (pip install pymilvus milvus-lite)")
pytestmark = pytest.mark.numeric

PARAMS = GEOMETRY_PARAMS
ANN_MODELS = ["softmax", "gaussian", "latent_spherical", "cosine"]
N_GALLERY = 60

# exhaustive settings: the approximate index must then return the exact top-k
FAISS_EXHAUSTIVE = {
    "flat": dict(index_type="flat"),
    "hnsw": dict(index_type="hnsw", M=8, ef_construction=64, ef_search=N_GALLERY, shortlist=N_GALLERY),
    "ivf": dict(index_type="ivf", nlist=4, nprobe=4),
}
MILVUS_EXHAUSTIVE = {
    "FLAT": dict(index_type="FLAT"),
    "HNSW": dict(index_type="HNSW", M=8, ef_construction=64, ef_search=N_GALLERY, shortlist=N_GALLERY),
    "IVF_FLAT": dict(index_type="IVF_FLAT", nlist=4, nprobe=4),
}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    d = 10
    center = rng.normal(size=d)
    anchors = unit_rows(rng, 40, d, center)
    G = unit_rows(rng, N_GALLERY, d, center)
    G[17] = G[4]  # a duplicate: a tie broken by insertion order
    Q = np.vstack([unit_rows(rng, 6, d, center), G[4:5]])
    return anchors, Q, G


@pytest.fixture(scope="module")
def data32(data):
    """float32 queries and a gallery without exact duplicates.

    Float32 features of two identical rows can differ in the last bit (BLAS blocking), so
    a duplicate pair is an ordering coin-flip between two float32 computations.
    """
    anchors, Q, G = data
    return Q.astype(np.float32), np.delete(G, 17, axis=0).astype(np.float32)


@pytest.fixture(scope="module")
def models(data):
    anchors = data[0]
    return {name: ad.make_model(name, **p).fit(anchors) for name, p in PARAMS.items()}


new_collection = collection_namer("c")


def milvus_params(milvus, **extra):
    """Backend parameters of a new collection on the Milvus ``milvus`` (connection parameters)."""
    return dict(milvus, collection_name=new_collection(), **extra)


def assert_same_topk(dist, ids, ref_d, ref_i, rtol):
    """Equal to a float64 reference (float64 results only: a float32 one is checked against
    float64 divergences up to its rounding, by ``assert_topk_up_to_rounding``)."""
    np.testing.assert_array_equal(ids, ref_i)
    np.testing.assert_allclose(dist, ref_d, rtol=rtol, atol=rtol * float(np.abs(ref_d).max()))


# ------------------------------------------------------------------ exactness
@pytest.mark.parametrize("name", list(PARAMS))
@pytest.mark.parametrize("symmetric", [True, False])
def test_exact_backend_equals_model_search(name, symmetric, data, models):
    _, Q, G = data
    m = models[name]
    index = Index(m, symmetric=symmetric).add(G[:25]).add(G[25:])
    for k in (1, 6, len(G)):
        ref_d, ref_i = m.search(Q, G, k=k, symmetric=symmetric)
        dist, ids = index.search(Q, k=k)
        assert dist.dtype == np.float64 and ids.dtype == np.int64
        assert_same_topk(dist, ids, ref_d, ref_i, rtol=1e-12)


@needs_faiss
@pytest.mark.parametrize("name", ANN_MODELS)
@pytest.mark.parametrize("index_type", list(FAISS_EXHAUSTIVE))
def test_faiss_exhaustive_is_exact(name, index_type, data32, models):
    Q32, G32 = data32
    m = models[name]
    index = Index(m, "faiss", **FAISS_EXHAUSTIVE[index_type]).add(G32)
    dist, ids = index.search(Q32, k=8)
    assert dist.dtype == np.float32
    assert_topk_up_to_rounding(m, Q32, G32, ids, dist)


# every model and index type on milvus-lite; on the server (slower: seconds per collection), each
# index type and both layouts (augmented, and Euclidean for gaussian) once
MILVUS_EXHAUSTIVE_CASES = [*(("lite", t, name) for t in MILVUS_EXHAUSTIVE for name in ANN_MODELS),
                           ("server", "FLAT", "softmax"), ("server", "HNSW", "gaussian"),
                           ("server", "IVF_FLAT", "latent_spherical")]


@needs_milvus
@pytest.mark.parametrize("kind,index_type,name", MILVUS_EXHAUSTIVE_CASES)
def test_milvus_exhaustive_is_exact(kind, index_type, name, data32, models, request):
    Q32, G32 = data32
    m = models[name]
    milvus = request.getfixturevalue(f"milvus_{kind}")
    index = Index(m, "milvus", **milvus_params(milvus, **MILVUS_EXHAUSTIVE[index_type])).add(G32)
    dist, ids = index.search(Q32, k=8)
    assert_topk_up_to_rounding(m, Q32, G32, ids, dist)


@needs_faiss
def test_faiss_asymmetric_divergence(data32, models):
    Q32, G32 = data32
    m = models["softmax"]
    index = Index(m, "faiss", symmetric=False, index_type="hnsw", ef_search=64, shortlist=N_GALLERY).add(G32)
    dist, ids = index.search(Q32, k=5)
    assert_topk_up_to_rounding(m, Q32, G32, ids, dist, symmetric=False)


# ------------------------------------------------------------- ids and batches
MILVUS_BACKENDS = [pytest.param(f"milvus-{kind}", marks=needs_milvus) for kind in MILVUS_KINDS]
ANN_BACKENDS = [pytest.param("faiss", marks=needs_faiss), *MILVUS_BACKENDS]
BATCH_BACKENDS = ["exact", *ANN_BACKENDS]


def make_index(backend, model, request, **params):
    """An empty index of ``backend`` ("exact", "faiss", "milvus-lite" or "milvus-server")."""
    if backend.startswith("milvus-"):
        params = milvus_params(request.getfixturevalue(backend.replace("-", "_")), **params)
        backend = "milvus"
    return Index(model, backend, **params)


@pytest.mark.parametrize("backend", BATCH_BACKENDS)
def test_batched_adds_equal_one_add_and_user_ids(backend, data32, models, request):
    Q32, G32 = data32
    G = G32
    m = models["softmax"]
    one = make_index(backend, m, request).add(G32)
    batched = make_index(backend, m, request)
    for s in range(0, len(G), 13):
        batched.add(G32[s:s + 13])
    assert len(one) == len(batched) == len(G)
    # key features made batch by batch may differ from one add's in the last bit (BLAS blocking):
    # each answer is checked against the float64 divergences, up to float32 rounding
    d1, i1 = one.search(Q32, k=9)
    d2, i2 = batched.search(Q32, k=9)
    assert_topk_up_to_rounding(m, Q32, G32, i1, d1)
    assert_topk_up_to_rounding(m, Q32, G32, i2, d2)

    user = np.arange(len(G), dtype=np.int64) * 7 + 1000
    named = make_index(backend, m, request).add(G32[:30], ids=user[:30]).add(G32[30:], ids=list(user[30:]))
    d3, i3 = named.search(Q32, k=9)
    assert np.isin(i3, user).all()
    assert_topk_up_to_rounding(m, Q32, G32, (i3 - 1000) // 7, d3)
    np.testing.assert_array_equal(named.ids, user)


def test_default_ids_continue_across_adds(data, models):
    _, Q, G = data
    index = Index(models["gaussian"]).add(G[:10]).add(G[10:20], ids=np.arange(100, 110)).add(G[20:25])
    np.testing.assert_array_equal(index.ids, np.r_[np.arange(10), np.arange(100, 110), np.arange(20, 25)])
    _, ids = index.search(G[12:13], k=1)
    assert ids[0, 0] == 102


def test_torch_in_torch_out(data, models):
    _, Q, G = data
    m = models["softmax"]
    index = Index(m).add(torch.as_tensor(G, dtype=torch.float32))
    dist, ids = index.search(torch.as_tensor(Q, dtype=torch.float32), k=4)
    assert isinstance(dist, torch.Tensor) and dist.dtype == torch.float32
    assert isinstance(ids, torch.Tensor) and ids.dtype == torch.int64
    assert_topk_up_to_rounding(m, Q.astype(np.float32), G.astype(np.float32), ids, dist)
    dist_np, _ = index.search(Q, k=4)
    assert isinstance(dist_np, np.ndarray) and dist_np.dtype == np.float64


@pytest.mark.parametrize("backend", ANN_BACKENDS)
def test_larger_norms_later_reaugment(backend, data32, models, request):
    """Without an analytic bound (asymmetric features), a later batch with larger key norms
    than the first re-augments the stored keys."""
    Q32, G32 = data32
    m = models["softmax"]
    assert m.key_norm_bound(symmetric=False) is None
    G2 = np.vstack([G32[:30], 5 * G32[30:]])
    layout = {"candidates": "features"} if backend == "faiss" else {}  # the padded feature layout
    index = make_index(backend, m, request, symmetric=False, shortlist=N_GALLERY, **layout).add(G2[:30])
    bound = index._backend.layout.max_norm
    index.add(G2[30:])
    assert index._backend.layout.max_norm > 2 * bound
    dist, ids = index.search(Q32, k=10)
    assert_topk_up_to_rounding(m, Q32, G2, ids, dist, symmetric=False)


@pytest.mark.parametrize("backend,name", [
    *(pytest.param(b, name, marks=needs_faiss if b == "faiss" else needs_milvus)
      for b in ("faiss", "milvus-lite") for name in ("softmax", "gmm", "cosine", "iti")),
    pytest.param("milvus-server", "softmax", marks=needs_milvus)])  # the bound is the model's; the server once
def test_fixed_augmentation_constant(backend, name, data32, models, request):
    """M is the geometry's analytic bound: it holds for every unit-norm batch, never changes,
    and keys beyond it (inputs that are not unit-norm) are refused."""
    Q32, G32 = data32
    m = models[name]
    layout = {"candidates": "features"} if backend == "faiss" else {}  # the padded feature layout
    index = make_index(backend, m, request, shortlist=N_GALLERY, **layout).add(G32[:20])
    M = index._backend.layout.max_norm
    assert M == pytest.approx(m.key_norm_bound() * (1 + 1e-5))
    psi = np.asarray(m.key_features(G32))
    assert np.linalg.norm(psi, axis=1).max() <= M
    index.add(G32[20:])
    assert index._backend.layout.max_norm == M
    dist, ids = index.search(Q32, k=10)
    assert_topk_up_to_rounding(m, Q32, G32, ids, dist)
    if name != "cosine":  # cosine normalises its inputs itself
        with pytest.raises(ValueError, match="exceed the bound M.*normalise the vectors"):
            index.add(5 * G32[:3], ids=[900, 901, 902])
        assert len(index) == len(G32)


# ----------------------------------------------------------------- persistence
ROUNDTRIP = [
    ("exact", "gmm", {}),
    ("exact", "cosine", {}),
    pytest.param("faiss", "softmax", dict(index_type="hnsw", M=8), marks=needs_faiss),
    pytest.param("faiss", "latent_spherical", dict(index_type="ivf", nlist=4, nprobe=2), marks=needs_faiss),
    # Milvus builds segment indexes in the background, so an approximate search depends on
    # when it runs; exhaustive settings make the comparison independent of that timing
    *(pytest.param(f"milvus-{kind}", name, params, marks=needs_milvus) for kind in MILVUS_KINDS
      for name, params in (("softmax", dict(index_type="HNSW", ef_search=64, shortlist=N_GALLERY)),
                           ("gaussian", dict(index_type="IVF_FLAT", nlist=4, nprobe=4)))),
]


@pytest.mark.parametrize("backend,name,params", ROUNDTRIP)
def test_save_load_roundtrip(backend, name, params, data, models, request, tmp_path):
    _, Q, G = data
    m = models[name]
    G32 = G.astype(np.float32)
    ids = np.arange(len(G), dtype=np.int64)[::-1] * 3
    index = make_index(backend, m, request, **params).add(G32[:40], ids=ids[:40]).add(G32[40:], ids=ids[40:])
    before = index.search(Q, k=7)
    path = tmp_path / "gallery.index"
    index.save(path)
    loaded = Index.load(path)
    assert type(loaded.model) is type(m) and loaded.model.get_params() == m.get_params()
    assert loaded.backend == backend.split("-")[0] and loaded.symmetric == index.symmetric and len(loaded) == len(index)
    assert {k: v for k, v in loaded.params.items() if k != "token"} == index._backend.saved_params()
    np.testing.assert_array_equal(loaded.ids, index.ids)
    after = loaded.search(Q, k=7)
    np.testing.assert_array_equal(after[1], before[1])
    if backend.startswith("milvus"):  # candidates may come back in another order: same values up to summation order
        np.testing.assert_allclose(after[0], before[0], rtol=1e-6, atol=1e-6 * float(np.abs(before[0]).max()))
    else:
        np.testing.assert_array_equal(after[0], before[0])
    # the loaded model is the fitted model, not a refit
    np.testing.assert_array_equal(loaded.model.pairwise(Q, G), m.pairwise(Q, G))
    # the loaded index keeps working
    loaded.add(G32[:2], ids=[-1, -2])
    assert len(loaded) == len(G) + 2
    assert set(loaded.search(G32[:2], k=3)[1][:, 0]) <= {-1, -2, ids[0], ids[1]}


def test_every_geometry_roundtrips(data, models, tmp_path):
    _, Q, G = data
    for name, m in models.items():
        path = tmp_path / f"{name}.index"
        index = Index(m, symmetric=False).add(G)
        index.save(path)
        loaded = Index.load(path)
        assert type(loaded.model) is type(m) and not loaded.symmetric
        np.testing.assert_array_equal(loaded.model.pairwise(Q, G, symmetric=False), m.pairwise(Q, G, symmetric=False))
        for got, want in zip(loaded.search(Q, k=5), index.search(Q, k=5)):
            np.testing.assert_array_equal(got, want)


@needs_milvus
def test_milvus_save_holds_connection_not_token(data, models, milvus, tmp_path):
    _, Q, G = data
    params = milvus_params(milvus, token=milvus["token"] or "root:Milvus")
    index = Index(models["cosine"], "milvus", **params).add(G)
    index.save(tmp_path / "m.index")
    payload = torch.load(tmp_path / "m.index", weights_only=True)
    assert "token" not in payload["params"] and "Milvus" not in repr(payload)
    assert payload["params"]["uri"] == (milvus["uri"] if "://" in milvus["uri"] else os.path.abspath(milvus["uri"]))
    assert payload["params"]["collection_name"] == params["collection_name"]
    assert "blocks" not in payload["store"] and "index" not in payload["store"]  # the vectors stay in Milvus
    # the saved file no longer matches once the collection changes
    index.add(G[:3], ids=[1000, 1001, 1002])
    with pytest.raises(ValueError, match="m.index.*holds 63 rows"):
        Index.load(tmp_path / "m.index")
    # an existing collection is never silently reused
    with pytest.raises(ValueError, match="already exists"):
        Index(models["cosine"], "milvus", **milvus, collection_name=params["collection_name"])
    fresh = Index(models["cosine"], "milvus", **milvus, collection_name=params["collection_name"], overwrite=True)
    assert len(fresh) == 0


def test_load_missing_file(tmp_path):
    missing = tmp_path / "nope.index"
    with pytest.raises(FileNotFoundError, match="nope.index"):
        Index.load(missing)


def test_load_corrupt_files(tmp_path, data, models):
    _, Q, G = data
    garbage = tmp_path / "garbage.index"
    garbage.write_bytes(b"\x00not an index at all" * 10)
    with pytest.raises(ValueError, match="garbage.index"):
        Index.load(garbage)
    good = tmp_path / "good.index"
    Index(models["softmax"]).add(G).save(good)
    raw = good.read_bytes()
    truncated = tmp_path / "truncated.index"
    truncated.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="truncated.index"):
        Index.load(truncated)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    with pytest.raises(ValueError, match="other.pt.*not an anchordiv index"):
        Index.load(other)
    with pytest.raises(ValueError, match="not a file"):
        Index.load(tmp_path)
    assert good.read_bytes() == raw  # reading never changes a file
    Index.load(good)


def test_failed_save_keeps_previous_file(tmp_path, data, models, monkeypatch):
    _, Q, G = data
    path = tmp_path / "gallery.index"
    index = Index(models["gaussian"]).add(G[:20])
    index.save(path)
    expected = Index.load(path).search(Q, k=3)
    index.add(G[20:])

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        index.save(path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["gallery.index"]  # no temporary file left behind
    restored = Index.load(path)
    assert len(restored) == 20
    got = restored.search(Q, k=3)
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[0], expected[0])


# ------------------------------------------------------------------- bad input
def test_bad_inputs(data, models, tmp_path):
    anchors, Q, G = data
    m = models["softmax"]
    index = Index(m)
    with pytest.raises(ValueError, match="empty"):
        index.search(Q, k=1)
    index.add(G[:10])
    with pytest.raises(ValueError, match="k=11 exceeds the 10"):
        index.search(Q, k=11)
    with pytest.raises(ValueError, match="positive int"):
        index.search(Q, k=0)
    with pytest.raises(ValueError, match="dimension"):
        index.add(G[:2, :5])
    with pytest.raises(ValueError, match="dimension"):
        index.search(Q[:, :5], k=2)
    with pytest.raises(ValueError, match=r"already in the index: \[3\]"):
        index.add(G[10:12], ids=[3, 50])
    with pytest.raises(ValueError, match="Duplicate ids within"):
        index.add(G[10:12], ids=[50, 50])
    with pytest.raises(ValueError, match="1-D sequence of 2"):
        index.add(G[10:12], ids=[50])
    with pytest.raises(ValueError, match="integers"):
        index.add(G[10:12], ids=[50.0, 51.0])
    assert len(index) == 10  # failed adds store nothing
    with pytest.raises(ValueError, match="Unknown backend 'annoy'"):
        Index(m, "annoy")
    with pytest.raises(ValueError, match="Unknown parameter.*nlist"):
        Index(m, "exact", nlist=4)
    with pytest.raises(ad.NotFittedError):
        Index(ad.Softmax(tau=0.05))
    with pytest.raises(TypeError, match="geometry"):
        Index("softmax")
    index.save(tmp_path / "x.index")
    with pytest.raises(ValueError, match="Cannot change nlist"):
        Index.load(tmp_path / "x.index", nlist=8)
    assert len(Index.load(tmp_path / "x.index", memory_budget=1)) == 10
    # cosine takes any dimension, the index pins the first one
    cos = Index(models["cosine"]).add(G)
    with pytest.raises(ValueError, match="dimension 5 but this index holds vectors of dimension 10"):
        cos.add(G[:2, :5])


@needs_faiss
def test_faiss_bad_inputs(data, models):
    _, Q, G = data
    m = models["softmax"]
    with pytest.raises(ValueError, match="Unknown faiss index_type 'lsh'"):
        Index(m, "faiss", index_type="lsh")
    with pytest.raises(ValueError, match="nprobe must be a positive int"):
        Index(m, "faiss", index_type="ivf", nprobe=0)
    ivf = Index(m, "faiss", index_type="ivf", nlist=16)
    with pytest.raises(ValueError, match="at least nlist=16"):
        ivf.add(G[:8])
    assert len(ivf) == 0
    with pytest.raises(ValueError, match="dimension"):
        Index(m, "faiss").add(G).add(G[:3, :4])


@needs_milvus
def test_milvus_bad_inputs(data, models, milvus_lite):
    m = models["softmax"]
    with pytest.raises(ValueError, match="needs uri="):
        Index(m, "milvus")
    with pytest.raises(ValueError, match="must end in '.db'"):
        Index(m, "milvus", uri="gallery.sqlite")
    with pytest.raises(ValueError, match="Unknown milvus index_type 'DISKANN_X'"):
        Index(m, "milvus", **milvus_lite, index_type="DISKANN_X")


def test_missing_optional_dependencies(models, monkeypatch):
    m = models["softmax"]
    with monkeypatch.context() as mp:
        mp.setitem(sys.modules, "faiss", None)  # makes `import faiss` fail
        with pytest.raises(ImportError, match="pip install faiss-cpu"):
            Index(m, "faiss")
    with monkeypatch.context() as mp:
        mp.setitem(sys.modules, "pymilvus", None)
        with pytest.raises(ImportError, match="pip install pymilvus"):
            Index(m, "milvus", uri="http://localhost:19530")
    if importlib.util.find_spec("pymilvus") is not None:
        with monkeypatch.context() as mp:
            mp.setitem(sys.modules, "milvus_lite", None)
            with pytest.raises(ImportError, match="pip install milvus-lite"):
                Index(m, "milvus", uri="./x.db")


@pytest.mark.parametrize("backend,params", [
    ("exact", {}),
    pytest.param("faiss", dict(index_type="hnsw", M=4, ef_construction=8, ef_search=4, shortlist=10), marks=needs_faiss),
    pytest.param("faiss", dict(index_type="ivf", nlist=8, nprobe=1, shortlist=10), marks=needs_faiss),
    *(pytest.param(f"milvus-{kind}", dict(index_type="FLAT"), marks=needs_milvus) for kind in MILVUS_KINDS),
])
def test_recall_against_exact_search(backend, params, data32, models, request):
    Q32, G32 = data32
    m = models["softmax"]
    index = make_index(backend, m, request, **params).add(G32)
    got = index.recall(Q32, k=10)
    _, found = index.search(Q32, k=10)
    # index.recall counts keys in its own float32 exact top-k or tied with its k-th (within TIE_RTOL ×
    # the query's scale): at least those certainly in every top-k, at most those within that and rounding
    from anchordiv.index._index import TIE_RTOL

    tol = float32_rounding(m, Q32, G32)
    Q64, G64 = Q32.astype(np.float64), G32.astype(np.float64)
    scale = np.abs(m.query_offsets(Q64)) + np.linalg.norm(m.query_features(Q64), axis=1) * np.linalg.norm(
        m.key_features(G64), axis=1).max()
    low = recall_up_to_rounding(m, Q32, G32, found, tol=-2 * tol)
    high = recall_up_to_rounding(m, Q32, G32, found, tol=2 * tol + TIE_RTOL * scale)
    assert low - 1e-12 <= got <= high + 1e-12
    assert (got == 1.0) if backend == "exact" or backend.startswith("milvus") else (0.0 < got <= 1.0)


def _clustered(rng, centres, n):
    d = centres.shape[1]
    x = centres[rng.integers(len(centres), size=n)] + rng.normal(size=(n, d)) * 0.8 / np.sqrt(d)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@needs_faiss
@pytest.mark.parametrize("index_type,candidates", [("hnsw", "embedding"), ("ivf", "embedding"), ("ivf", "routed")])
@pytest.mark.parametrize("name", ["softmax", "gmm"])
def test_candidates_hold_recall_with_defaults(index_type, candidates, name, tmp_path):
    """Anchor models without a Euclidean embedding: embedding candidates, and IVF lists routed by
    the embeddings (and softmax's anchors), match exact search with the default parameters."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(200, 128))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    A, G, Q = (_clustered(rng, centres, n) for n in (128, 4000, 100))
    model = ad.make_model(name, tau=0.05).fit(A)
    index = Index(model, "faiss", index_type=index_type, candidates=candidates)
    assert index.params["candidates"] == candidates
    assert Index(model, "faiss", index_type=index_type).params["candidates"] == (
        "routed" if index_type == "ivf" else "features")
    index.add(G[:2500]).add(G[2500:])  # two batches
    _, got = index.search(Q, 10)
    assert recall_up_to_rounding(model, Q, G, got) >= 0.99  # against float64 divergences
    assert index.recall(Q, k=10) >= 0.99
    index.save(tmp_path / "e.index")
    loaded = Index.load(tmp_path / "e.index")
    assert loaded.params["candidates"] == candidates
    np.testing.assert_array_equal(loaded.search(Q, 10)[1], got)


@needs_faiss
def test_routed_lists_hold_keys_by_cell_and_most_probable_anchor():
    """Routed softmax IVF: every key sits in its embedding cell and in its most probable anchor's
    list; a query scans its nprobe cells and anchors, so with nprobe = nlist the search is exact."""
    rng = np.random.default_rng(4)
    centres = rng.normal(size=(50, 64))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    A, G, Q = (_clustered(rng, centres, n) for n in (40, 3000, 30))
    model = ad.make_model("softmax", tau=0.02).fit(A)
    index = Index(model, "faiss", index_type="ivf", nlist=20, nprobe=20).add(G)
    backend = index._backend
    # each key's cell and anchor are the best by float64 scores, up to float32 rounding of their d terms
    G64, A64, C64 = G.astype(np.float64), A.astype(np.float64), backend.cells.numpy().astype(np.float64)
    for keys, route in ((C64, backend.routes[:, 0]), (A64, backend.routes[:, 1])):
        scores = G64 @ keys.T
        tol = 4 * (G.shape[1] + 2) * 2.0 ** -24 * np.linalg.norm(G64, axis=1) * np.linalg.norm(keys, axis=1).max()
        assert (scores[np.arange(len(G)), route] >= scores.max(1) - tol).all()
    cells, anchors = backend.routes[:, 0], backend.routes[:, 1]
    for ivf, lists in ((backend.index, cells), (backend.by_anchor, anchors)):
        sizes = np.array([ivf.invlists.list_size(i) for i in range(ivf.nlist)])
        np.testing.assert_array_equal(sizes, np.bincount(lists, minlength=ivf.nlist))
    d, i = index.search(Q, 10)
    assert_topk_up_to_rounding(model, Q, G, i, d)
    # one anchor list per query alone still finds keys of that anchor that no probed cell holds
    # (queries whose best cell or anchor is a near tie in float64 are left out: float32 may pick either)
    one = Index(model, "faiss", index_type="ivf", nlist=20, nprobe=1).add(G)
    _, i1 = one.search(Q, 10)
    Q64 = Q.astype(np.float64)
    cell_scores = Q64 @ one._backend.cells.numpy().astype(np.float64).T
    anchor_scores = Q64 @ A.astype(np.float64).T
    clear = np.ones(len(Q), dtype=bool)
    for scores, keys in ((cell_scores, one._backend.cells.numpy()), (anchor_scores, A)):
        top2 = np.sort(scores, axis=1)[:, -2:]
        tol = 4 * (Q.shape[1] + 2) * 2.0 ** -24 * np.linalg.norm(Q64, axis=1) * np.linalg.norm(keys, axis=1).max()
        clear &= top2[:, 1] - top2[:, 0] > tol
    probed, best_anchor = cell_scores.argmax(1), anchor_scores.argmax(1)
    assert clear.mean() > 0.9
    outside = (one._backend.routes[np.clip(i1, 0, None), 0] != probed[:, None]) & clear[:, None] & (i1 >= 0)
    assert outside.any() and (one._backend.routes[i1[outside], 1] ==
                              np.repeat(best_anchor[:, None], 10, 1)[outside]).all()


@needs_faiss
def test_routed_index_deletes_upserts_filters_and_reloads(tmp_path):
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(50, 64))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    A, G, Q = (_clustered(rng, centres, n) for n in (40, 3000, 30))
    model = ad.make_model("softmax", tau=0.05).fit(A)
    ids = np.arange(3000) * 7
    index = Index(model, "faiss", index_type="ivf", nlist=20, nprobe=20).add(G, ids=ids)
    gone = ids[::3]
    index.delete(gone)
    index.upsert(G[1:2] * 0 + G[5:6], ids=ids[1:2])  # id 7 now holds key 5's vector
    keep = np.setdiff1d(ids, gone)
    # the collection now: rows of G under their ids, id 7 holding row 5's vector
    held = G[np.isin(ids, keep)].copy()
    held[np.searchsorted(keep, 7)] = G[5]
    row = {int(i): r for r, i in enumerate(keep)}

    def rows(found):
        assert np.isin(found, keep).all()
        return np.vectorize(row.get)(found)

    d, got = index.search(Q, 10)
    assert_topk_up_to_rounding(model, Q, held, rows(got), d)
    even = keep[keep % 2 == 0]
    d, got = index.search(Q, 10, filter=even)
    assert np.isin(got, even).all()
    assert_topk_up_to_rounding(model, Q, held, rows(got), d, allowed=rows(even))
    index.save(tmp_path / "r.index")
    before = index.search(Q, 10)
    after = Index.load(tmp_path / "r.index").search(Q, 10)
    np.testing.assert_array_equal(after[1], before[1])  # the same stored vectors, searched the same way
    np.testing.assert_array_equal(after[0], before[0])
    with pytest.raises(ValueError, match="candidates='routed' needs index_type='ivf'"):
        Index(model, "faiss", index_type="hnsw", candidates="routed")


@needs_faiss
@pytest.mark.parametrize("name", ["softmax", "gaussian"])
def test_routed_scan_distances_are_the_divergences(name, tmp_path):
    """Routed lists are scanned with the divergence itself (inner products, or L2 for a Euclidean layout):
    probing every list gives exact search's ids, and distances equal to a float64 brute force."""
    rng = np.random.default_rng(9)
    centres = rng.normal(size=(40, 48))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    A, G, Q = (_clustered(rng, centres, n) for n in (50, 2000, 25))
    model = ad.make_model(name, tau=0.05).fit(A)
    index = Index(model, "faiss", index_type="ivf", candidates="routed", nlist=16, nprobe=16).add(G)
    d, ids = index.search(Q, 10)
    assert_topk_up_to_rounding(model, Q, G, ids, d)
    model64 = ad.make_model(name, tau=0.05).fit(A.astype(np.float64))
    want = np.take_along_axis(np.asarray(model64.pairwise(Q.astype(np.float64), G.astype(np.float64))), ids, 1)
    np.testing.assert_allclose(d, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    # lists written with the L2 metric (the same stored vectors) are read as divergence scans
    for ivf in (index._backend.index, index._backend.by_anchor):
        if ivf is not None:
            ivf.metric_type = index._backend.faiss.METRIC_L2
    index.save(tmp_path / "old.index")
    np.testing.assert_array_equal(Index.load(tmp_path / "old.index").search(Q, 10)[1], ids)


def test_recall_counts_keys_tied_with_the_kth_as_found(data32, models, monkeypatch):
    """A returned key that ties the exact k-th (a duplicate) counts as found; a farther key does not."""
    Q32, G32 = data32
    model = models["softmax"]
    G = np.concatenate([G32, G32[:50]])  # keys 0…49 repeated at the end: exact ties
    index = Index(model).add(G)
    _, top = index.search(Q32, k=5)
    assert (top < 50).any()
    D = np.asarray(model.pairwise(Q32, G))
    duplicates = np.where(top < 50, top + len(G32), top)  # the same keys under their duplicates' ids
    farthest = np.argsort(D, axis=1, kind="stable")[:, -5:]
    for ids, want in ((top, 1.0), (duplicates, 1.0), (farthest, 0.0)):
        monkeypatch.setattr(index, "search", lambda Q, k, ids=ids: (np.take_along_axis(D, ids, 1), ids))
        assert index.recall(Q32, k=5) == pytest.approx(want)


@needs_faiss
@pytest.mark.parametrize("name", ["softmax", "gaussian"])
def test_ivf_nprobe_auto_is_the_smallest_reaching_the_recall_target(name, tmp_path):
    """nprobe="auto": the tuned value reaches AUTO_RECALL on sampled keys (each excluding itself)
    and the ladder's value below it does not; small adds keep it, adds that grow the collection
    by half tune again, and it is saved with the index."""
    from anchordiv.index._faiss import NPROBE_LADDER
    from anchordiv.index._index import AUTO_RECALL, AUTO_SAMPLE, TIE_RTOL

    rng = np.random.default_rng(6)
    centres = rng.normal(size=(100, 64))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    A, G, Q = (_clustered(rng, centres, n) for n in (64, 4000, 100))
    model = ad.make_model(name, tau=0.05).fit(A)
    index = Index(model, "faiss", index_type="ivf").add(G)
    backend = index._backend
    tuned = backend.tuned_nprobe
    assert index.params["nprobe"] == "auto" and tuned in NPROBE_LADDER and backend.tuned_at == 4000
    rows = np.sort(np.random.default_rng(0).choice(4000, size=AUTO_SAMPLE, replace=False))
    # the tuning counts a key as found when it is in the float32 exact top-10 or tied with its 10th
    # (TIE_RTOL × the query's scale): at least the keys certainly in every top-10 by float64, at most
    # those within that and float32 rounding of the float64 10th
    tol = float32_rounding(model, G[rows], G)
    G64 = G.astype(np.float64)
    scale = np.abs(model.query_offsets(G64[rows])) + np.linalg.norm(model.query_features(G64[rows]), axis=1) * (
        np.linalg.norm(model.key_features(G64), axis=1).max())

    def sample_recall(nprobe, margin):
        backend.tuned_nprobe = nprobe
        _, got = index.search(G[rows], 10, exclude=rows)
        return recall_up_to_rounding(model, G[rows], G, got, exclude=rows[:, None], tol=margin)

    assert sample_recall(tuned, 2 * tol + TIE_RTOL * scale) >= AUTO_RECALL
    if tuned > 1:
        assert sample_recall(NPROBE_LADDER[NPROBE_LADDER.index(tuned) - 1], -2 * tol) < AUTO_RECALL
    backend.tuned_nprobe = tuned
    assert index.recall(Q, k=10) >= 0.97
    index.add(G[:1000] * 0 + G[1000:2000])  # +25 %: kept
    assert backend.tuned_at == 4000
    index.add(G[:2000])  # 7,000 ≥ 1.5 × 4,000: tuned again
    assert backend.tuned_at == 7000 and backend.tuned_nprobe in NPROBE_LADDER
    index.save(tmp_path / "t.index")
    loaded = Index.load(tmp_path / "t.index")
    assert (loaded._backend.tuned_nprobe, loaded._backend.tuned_at) == (backend.tuned_nprobe, 7000)
    fixed = Index(model, "faiss", index_type="ivf", nprobe=3).add(G)
    assert fixed._backend.tuned_nprobe is None and fixed._backend.nprobe == 3


@needs_faiss
@pytest.mark.parametrize("name", ["softmax", "gaussian"])
def test_ivf_defaults_on_a_few_thousand_items_train_without_warnings(name, capfd):
    """nlist from the size (≤ n/39) and nprobe tuned: no faiss training warning, recall ≥ 0.99."""
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(300, 96))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    A, G, Q = (_clustered(rng, centres, n) for n in (64, 3425, 100))
    model = ad.make_model(name, tau=0.05).fit(A)
    capfd.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nor a Python warning (tuning tries too-small nprobe values quietly)
        index = Index(model, "faiss", index_type="ivf").add(G)
    err = capfd.readouterr().err
    assert "WARNING" not in err and "please provide" not in err
    assert index._backend.nlist == 3425 // 39
    assert index.recall(Q, k=10) >= 0.99


def test_anchor_logits_are_the_log_posterior_up_to_a_row_constant():
    """Softmax.anchor_logits against a float64 log P(i | x) = log w_i + xᵀγ_i/τ − logsumexp."""
    rng = np.random.default_rng(8)
    A, X = rng.normal(size=(30, 16)), rng.normal(size=(12, 16))
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    w = rng.uniform(0.5, 2.0, size=30)
    model = ad.Softmax(tau=0.05).fit(ad.AnchorSet(torch.from_numpy(A), weights=torch.from_numpy(w)))
    logits = np.log(w / w.sum()) + X @ A.T / 0.05
    want = logits - logits.max(1, keepdims=True) - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
    got = model.anchor_logits(torch.from_numpy(X)).numpy()
    got = got - np.logaddexp.reduce(got, axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-10)
