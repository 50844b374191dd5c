"""The context engine: features streamed from memory-mapped shards, searched exactly, built in the background.

Every search is checked against the float64 divergences of the same rows (up to float32
rounding, :func:`anchordiv.testing.topk_up_to_rounding`), and streamed features against the
in-memory ones.
"""

from __future__ import annotations

import threading
import time
import warnings

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv.contexts import (Cancelled, ContextLimit, ContextRegistry, FeatureStore, IndexStore, compact,
                                context_store)
from anchordiv.exact import knn_within
from anchordiv.io import MappedRows, load_collection
from anchordiv.testing import assert_topk_up_to_rounding, topk_up_to_rounding

pytestmark = pytest.mark.numeric

D, N_ROWS = 48, 6000


def _unit(X):
    return X / np.linalg.norm(X, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Clustered unit rows (noise scaled by 1/√d) in three float16 .npy shards, and anchors."""
    rng = np.random.default_rng(0)
    centres = _unit(rng.standard_normal((40, D)))
    X = _unit(centres[rng.integers(0, 40, N_ROWS)] + rng.standard_normal((N_ROWS, D)) * (0.6 / np.sqrt(D)))
    folder = tmp_path_factory.mktemp("shards")
    cuts = [0, 1500, 4100, N_ROWS]
    files = []
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        files.append(folder / f"img_emb_{i}.npy")
        np.save(files[-1], X[a:b].astype(np.float16))
    rows = MappedRows.open(files)
    G64 = np.asarray(rows).astype(np.float64)  # the stored (float16) values, exactly
    A = _unit(rng.standard_normal((12, D))).astype(np.float32)
    Q = G64[rng.choice(N_ROWS, 16, replace=False)] + rng.standard_normal((16, D)) * 0.01
    return {"rows": rows, "G64": G64, "A": A, "Q": _unit(Q).astype(np.float32), "folder": folder, "files": files}


GEOMETRIES = {
    "softmax-0.05": lambda A: ad.Softmax(tau=0.05).fit(A),
    "softmax-0.01": lambda A: ad.Softmax(tau=0.01).fit(A),
    "softmax-weighted": lambda A: ad.Softmax(tau=0.05).fit(ad.AnchorSet(A, weights=np.arange(1, len(A) + 1))),
    "gaussian": lambda A: ad.Gaussian(tau=0.05).fit(A),
    "latent_gaussian": lambda A: ad.LatentGaussian(tau=0.05, rank=5).fit(A),
    "latent_spherical": lambda A: ad.LatentSpherical(tau=0.05, rank=5).fit(A),
    "cosine": lambda A: ad.Cosine().fit(None),
    "iti": lambda A: ad.ImageTextInversion().fit(A),
}


# --------------------------------------------------------------------------- mapped rows
def test_mapped_rows_read_like_the_array(data):
    rows, G = data["rows"], data["G64"]
    assert rows.shape == (N_ROWS, D) and rows.dtype == np.float16 and len(rows.parts) == 3
    assert np.array_equal(rows[1499:1502].astype(np.float64), G[1499:1502])
    idx = np.array([5999, 0, 4100, 1500, 4099, 3, 3])
    assert np.array_equal(rows.take(idx).astype(np.float64), G[idx])
    assert np.array_equal(rows[-1].astype(np.float64), G[-1])
    starts = [(s, b.shape[0]) for s, b in rows.blocks(1000)]
    assert starts[:3] == [(0, 1000), (1000, 500), (1500, 1000)] and sum(n for _, n in starts) == N_ROWS
    with pytest.raises(IndexError):
        rows.take([N_ROWS])
    with pytest.raises(ValueError, match="integer"):
        rows.take([0.5])


def test_a_collection_of_several_shards_loads_mapped(data, tmp_path):
    folder = tmp_path / "coll" / "img_emb"
    folder.mkdir(parents=True)
    for f in data["files"]:
        (folder / f.name).write_bytes(f.read_bytes())
    coll = load_collection(tmp_path / "coll", mmap=True, dtype=None)
    assert isinstance(coll.embeddings, MappedRows) and len(coll) == N_ROWS and coll.dim == D
    assert np.array_equal(np.asarray(coll.embeddings).astype(np.float64), data["G64"])
    assert coll.fingerprint() == load_collection(tmp_path / "coll", dtype=None).fingerprint()
    with pytest.warns(UserWarning, match="converted"):
        assert isinstance(load_collection(tmp_path / "coll", mmap=True).embeddings, np.ndarray)


# --------------------------------------------------------------------------- features
@pytest.mark.parametrize("storage", ["float32", "float16"])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_streamed_features_equal_the_in_memory_features(data, name, storage):
    """ψ built block by block from float16 shards (float32 features, kept as float16 + residual) equals the
    float64 features of the same rows, within float32 rounding and the geometry's in-dtype bound."""
    model = GEOMETRIES[name](data["A"])
    store = FeatureStore(model, data["rows"], storage=storage, memory_budget=1 << 20).build()
    assert store.ready and store.progress == 1.0 and store.high.dtype == getattr(torch, storage)
    got = store.stored(torch.arange(N_ROWS)).numpy()
    want = model.key_terms(data["G64"], compute_dtype=True)
    with warnings.catch_warnings():  # near one-hot softmaxes are computed in float64 here
        warnings.simplefilter("ignore", RuntimeWarning)
        memory = model.key_terms(data["G64"].astype(np.float32))  # what Index.add stores
    norm = np.linalg.norm(want, axis=1)
    m = want.shape[1]
    tol = model.key_error_bound(torch.float32) + 8 * (m + 2) * 2.0 ** -24 * norm + 2.0 ** -20
    assert (np.linalg.norm(got - want, axis=1) <= tol).all()
    assert (np.linalg.norm(got - memory, axis=1) <= 2 * tol).all()
    assert store.key_norm == pytest.approx(norm.max(), rel=1e-3)


def test_softmax_in_dtype_features_are_within_their_bound():
    rng = np.random.default_rng(3)
    A = _unit(rng.standard_normal((20, 256))).astype(np.float32)
    X = _unit(rng.standard_normal((3000, 256)))
    for tau in (0.01, 0.05, 0.5):
        model = ad.Softmax(tau=tau).fit(A)
        fast = model.key_terms(X.astype(np.float32), precise=False)
        exact = model.key_terms(X, compute_dtype=True)
        err = np.linalg.norm(fast - exact, axis=1).max()
        assert err <= model.key_error_bound(torch.float32)
        assert model.key_error_bound(torch.float64) == 0.0
        assert np.allclose(model.key_terms(X, precise=False), exact, rtol=1e-12, atol=1e-12)  # float64 input


# --------------------------------------------------------------------------- search
@pytest.mark.parametrize("storage", ["float32", "float16"])
@pytest.mark.parametrize("name", GEOMETRIES)
def test_search_is_the_float64_top_k(data, name, storage):
    model = GEOMETRIES[name](data["A"])
    store = context_store(model, data["rows"], storage=storage, memory_budget=1 << 20).build()
    assert store.path == "scan" and isinstance(store, FeatureStore)
    Q, G = data["Q"], data["G64"]
    d, i = store.search(Q, k=10)
    assert_topk_up_to_rounding(model, Q, G, i, d)
    torch_d, torch_i = store.search(torch.from_numpy(Q), k=10)
    assert isinstance(torch_i, torch.Tensor) and np.array_equal(torch_i.numpy(), i)


@pytest.mark.parametrize("storage", ["float32", "float16"])
@pytest.mark.parametrize("name", ["softmax-0.05", "latent_gaussian", "cosine"])
def test_search_with_allow_and_exclude(data, name, storage):
    model = GEOMETRIES[name](data["A"])
    store = context_store(model, data["rows"], storage=storage, memory_budget=1 << 20).build()
    Q, G = data["Q"], data["G64"]
    rng = np.random.default_rng(1)
    allow = np.sort(rng.choice(N_ROWS, 2000, replace=False))
    exclude = np.stack([allow[rng.choice(2000, 3, replace=False)] for _ in range(len(Q))])
    exclude[0, 0] = -1
    d, i = store.search(Q, k=7, allow=allow, exclude=exclude)
    assert np.isin(i, allow).all() and not (i[:, :, None] == exclude[:, None, :]).any()
    assert topk_up_to_rounding(model, Q, G, i, d, exclude=exclude, allowed=allow).all()
    with pytest.raises(ValueError, match="k=2001 exceeds"):
        store.search(Q[:1], k=2001, allow=allow)


def test_ties_go_to_the_lower_row(tmp_path):
    rng = np.random.default_rng(5)
    X = _unit(rng.standard_normal((50, 16))).astype(np.float32)
    X = np.concatenate([X, X[:10], X[:10]])  # rows 50..69 repeat rows 0..9
    model = ad.Softmax(tau=0.1).fit(_unit(rng.standard_normal((6, 16))).astype(np.float32))
    store = FeatureStore(model, X).build()
    d, i = store.search(X[:10], k=3)
    assert np.array_equal(i, np.stack([np.arange(10), np.arange(10) + 50, np.arange(10) + 60], 1))
    assert np.array_equal(d[:, 0], d[:, 1]) and np.array_equal(d[:, 1], d[:, 2])


def test_a_build_never_writes_the_rows(data):
    X = data["G64"].astype(np.float32)
    before = X.copy()
    for name in GEOMETRIES:
        FeatureStore(GEOMETRIES[name](data["A"]), X).build()
    assert np.array_equal(X, before)


def test_features_beyond_float16_are_kept_in_float32(data):
    model = ad.Gaussian(tau=2e-4).fit(data["A"])  # ‖z‖² = λᵀΣλ/(2τ²), past 6e4
    with pytest.warns(RuntimeWarning, match="kept in float32"):
        store = FeatureStore(model, data["rows"], storage="float16", memory_budget=1 << 20).build()
    assert store.storage == torch.float32 and store.low is None
    d, i = store.search(data["Q"], k=5)
    assert_topk_up_to_rounding(model, data["Q"], data["G64"], i, d)


def test_a_mixture_takes_the_index_path(data):
    model = ad.GaussianMixture(tau=0.05, n_components=2).fit(data["A"])
    assert not compact(model, D)
    store = context_store(model, data["rows"], memory_budget=1 << 20)
    assert isinstance(store, IndexStore) and store.path == "index"
    d, i = store.build().search(data["Q"], k=5, exclude=np.zeros((len(data["Q"]), 1), dtype=np.int64))
    assert_topk_up_to_rounding(model, data["Q"], data["G64"], i, d, exclude=np.zeros((len(data["Q"]), 1), dtype=int))


def test_a_store_refuses_what_it_cannot_do(data):
    model = GEOMETRIES["softmax-0.05"](data["A"])
    store = FeatureStore(model, data["rows"])
    with pytest.raises(RuntimeError, match="still building"):
        store.search(data["Q"], k=3)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Cancelled):
        store.build(cancel=cancel)
    with pytest.raises(ValueError, match="dimension"):
        FeatureStore(ad.Softmax(tau=0.05).fit(np.eye(8, dtype=np.float32)), data["rows"])
    with pytest.raises(ValueError, match="storage"):
        FeatureStore(model, data["rows"], storage="int8")


def test_knn_within_keeps_every_key_in_the_window():
    rng = np.random.default_rng(2)
    n, m, k = 5000, 9, 6
    keys = torch.from_numpy(rng.standard_normal((n, m)))
    phi = torch.from_numpy(rng.standard_normal((4, m)))
    offsets = torch.zeros(4, dtype=torch.float64)
    slack = torch.tensor([0.0, 0.05, 0.5, 3.0], dtype=torch.float64)
    who, pos = knn_within(offsets, phi, [keys[:1234], keys[1234:]], k, slack, n_keys=n, memory_budget=1 << 16)
    d = (offsets[:, None] - phi @ keys.T).numpy()
    kth = np.sort(d, 1)[:, k - 1]
    for q in range(4):
        want = np.flatnonzero(d[q] <= kth[q] + 2 * slack[q].item() + 1e-12)
        assert np.array_equal(np.sort(pos[who == q].numpy()), want)


# --------------------------------------------------------------------------- registry
def _fit(data, tau=0.05, delay=0.0):
    def fit():
        time.sleep(delay)
        return ad.Softmax(tau=tau).fit(data["A"]), True
    return fit


def test_registry_builds_in_the_background_and_answers(data):
    reg = ContextRegistry(data["rows"], max_bytes=64 << 20)
    ctx = reg.start("a", _fit(data, delay=0.3))
    assert ctx.status == "building" and ctx.describe()["status"] == "building"
    assert ctx.wait(30) and ctx.status == "ready" and ctx.progress == 1.0 and ctx.path == "scan"
    assert reg.start("a", _fit(data)) is ctx and reg.stats()["hits"] == 1 and reg.stats()["misses"] == 1
    d, i = ctx.store.search(data["Q"], k=4)
    assert_topk_up_to_rounding(ctx.model, data["Q"], data["G64"], i, d)
    info = ctx.describe()
    assert info["rows"] == N_ROWS and info["features"] == 2 * 12 + 1 and info["bytes"] >= N_ROWS * 25 * 4
    reg.close()


def test_registry_bounds_count_and_bytes(data):
    one = N_ROWS * 25 * 4
    reg = ContextRegistry(data["rows"], max_bytes=3 * one, max_contexts=2)
    a = reg.start("a", _fit(data, 0.05))
    a.wait(30)
    b = reg.start("b", _fit(data, 0.06))
    b.wait(30)
    c = reg.start("c", _fit(data, 0.07))  # the least recently used ready context makes room
    c.wait(30)
    assert "a" not in reg and "b" in reg and "c" in reg and reg.stats()["evictions"] == 1
    small = ContextRegistry(data["rows"], max_bytes=one // 2)
    big = small.start("big", _fit(data))
    big.wait(30)
    assert big.status == "failed" and "cache holds" in big.error
    slow = ContextRegistry(data["rows"], max_contexts=1)
    first = slow.start("x", _fit(data, delay=1.0))
    with pytest.raises(ContextLimit, match="building"):
        slow.start("y", _fit(data))
    assert slow.delete("x") and first.wait(30) and first.status == "failed"  # cancelled
    for r in (reg, small, slow):
        r.close()


def test_a_failed_fit_is_reported_and_retried(data):
    reg = ContextRegistry(data["rows"])
    calls = []

    def bad():
        calls.append(1)
        raise ValueError("no anchors like these")

    ctx = reg.start("bad", bad)
    ctx.wait(30)
    assert ctx.status == "failed" and ctx.error == "no anchors like these"
    again = reg.start("bad", bad)
    again.wait(30)
    assert again is not ctx and len(calls) == 2
    reg.close()


def test_a_row_with_nan_is_named_at_build(data):
    X = data["G64"].astype(np.float32)
    X[4321, 3] = np.nan
    with pytest.raises(ValueError, match="collection row 4321 holds NaN or inf"):
        FeatureStore(GEOMETRIES["softmax-0.05"](data["A"]), X, memory_budget=1 << 20).build()
