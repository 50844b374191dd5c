"""build_index: one pass over a collection's shards, in one process and on a real Dask
LocalCluster (2 worker processes) with milvus-lite and a real Milvus server; a worker killed
mid-build changes nothing."""

import os
import signal
from pathlib import Path
import threading
import time

import numpy as np
import pandas as pd
import pytest

import anchordiv as ad
from anchordiv.index import Index, build_index
from anchordiv.index._build import collection_shards
from anchordiv.testing import assert_topk_up_to_rounding

from conftest import collection_namer, unit_rows

distributed = pytest.importorskip("distributed")

new_collection = collection_namer("b")
SHARDS = (70, 45, 85)  # rows of img_emb_0.npy, img_emb_1.npy, img_emb_2.npy


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A clip-retrieval layout folder of three shards, its rows, anchors and queries."""
    rng = np.random.default_rng(5)
    d = 16
    center = rng.normal(size=d)
    anchors = unit_rows(rng, 50, d, center)
    G = unit_rows(rng, sum(SHARDS), d, center).astype(np.float32)
    Q = unit_rows(rng, 9, d, center).astype(np.float32)
    root = tmp_path_factory.mktemp("coll")
    (root / "img_emb").mkdir()
    (root / "metadata").mkdir()
    labels = pd.DataFrame({"label": rng.choice(["a", "b"], len(G)), "rank": np.arange(len(G))})
    for i, (a, b) in enumerate(zip(np.cumsum((0,) + SHARDS[:-1]), np.cumsum(SHARDS))):
        np.save(root / "img_emb" / f"img_emb_{i}.npy", G[a:b])
        labels.iloc[a:b].to_parquet(root / "metadata" / f"metadata_{i}.parquet", index=False)
    return str(root), anchors, G, Q


@pytest.fixture(scope="module")
def model(data):
    return ad.Softmax(tau=0.05).fit(data[1])


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=40) as cluster, \
            distributed.Client(cluster) as c:
        yield c


def backend_params(backend, request):
    if backend == "faiss":
        return "faiss", dict(index_type="flat")
    if backend.startswith("milvus-"):
        conn = request.getfixturevalue(backend.replace("-", "_"))
        return "milvus", dict(conn, collection_name=new_collection())
    return backend, {}


def assert_same(built, reference, Q, G, k=10):
    """The same ids (rows of G), and both answers a float64 top-k up to float32 rounding (features
    made shard by shard may differ from one add's in the last bit, so near ties may swap)."""
    np.testing.assert_array_equal(built.ids, np.arange(len(G)))
    np.testing.assert_array_equal(reference.ids, np.arange(len(G)))
    for index in (built, reference):
        d, i = index.search(Q, k=k)
        assert_topk_up_to_rounding(index.model, Q, G, i, d)


def test_shards_of_a_collection_folder_a_file_and_an_array(data, tmp_path):
    root, _, G, _ = data
    shards = collection_shards(root)
    assert [(len(s), s.offset) for s in shards] == [(70, 0), (45, 70), (85, 115)]
    np.testing.assert_array_equal(np.concatenate([s.read() for s in shards]), G)
    np.save(tmp_path / "all.npy", G)
    assert [(s.start, s.stop) for s in collection_shards(str(tmp_path / "all.npy"), shard_rows=80)] == \
        [(0, 80), (80, 160), (160, 200)]
    assert [s.offset for s in collection_shards(G, shard_rows=150)] == [0, 150]
    with pytest.raises(ValueError, match="shard_rows must be"):
        collection_shards(G, shard_rows=0)
    with pytest.raises(ValueError, match="not a collection folder"):
        collection_shards(str(tmp_path))


@pytest.mark.parametrize("backend", ["exact", "faiss", "milvus-lite"])
def test_one_process_build_equals_one_add(backend, data, model, request):
    root, _, G, Q = data
    name, params = backend_params(backend, request)
    built = build_index(model, root, name, progress=False, **params)
    np.testing.assert_array_equal(built.ids, np.arange(len(G)))
    if name == "milvus":
        params = dict(params, collection_name=new_collection())
    assert_same(built, Index(model, name, **params).add(G), Q, G)


@pytest.mark.parametrize("backend", ["exact", "faiss", "milvus-server"])
def test_dask_build_equals_one_process_build(backend, data, model, client, request):
    root, _, G, Q = data
    name, params = backend_params(backend, request)
    on_cluster = build_index(model, root, name, client=client, shard_rows=40, progress=False, **params)
    if name == "milvus":
        params = dict(params, collection_name=new_collection())
    one = build_index(model, root, name, progress=False, **params)
    assert_same(on_cluster, one, Q, G)
    if name == "milvus":  # the metadata shards became scalar fields
        for index in (on_cluster, one):
            _, ids = index.search(Q, k=5, filter='label == "a" and rank >= 100')
            labels = pd.concat([pd.read_parquet(f) for f in sorted((Path(root) / "metadata").iterdir())])
            assert (labels.label.to_numpy()[ids] == "a").all() and (ids >= 100).all()
        allowed = np.flatnonzero(labels.label.to_numpy() == "a")
        for index in (on_cluster, one):
            d, ids = index.search(Q, k=5, filter='label == "a"')
            assert_topk_up_to_rounding(model, Q, G, ids, d, allowed=allowed)


@pytest.mark.parametrize("backend", ["exact", "milvus-server"])
def test_worker_killed_mid_build(backend, data, model, client, request, tmp_path):
    """One worker is killed (SIGKILL) while it computes a shard; its tasks are run again and the
    upserts of a shard written twice leave one row per id."""
    _, anchors, _, Q = data
    rng = np.random.default_rng(9)
    G = unit_rows(rng, 3000, anchors.shape[1], anchors.mean(0)).astype(np.float32)
    np.save(tmp_path / "big.npy", G)
    slow = ad.Softmax(tau=0.05).fit(unit_rows(rng, 20000, anchors.shape[1], anchors.mean(0)))  # ~0.3 s per shard
    name, params = backend_params(backend, request)
    pids = client.run(os.getpid)
    result, killed = {}, []

    def build():
        result["index"] = build_index(slow, str(tmp_path / "big.npy"), name, client=client, shard_rows=500,
                                      progress=False, **params)

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 120
    while not killed and thread.is_alive() and time.monotonic() < deadline:
        busy = [w for w, keys in client.processing().items() if any("anchordiv-" in str(k) for k in keys)]
        if busy:  # a worker computing a shard
            os.kill(pids[busy[0]], signal.SIGKILL)
            killed.append(busy[0])
        time.sleep(0.05)
    thread.join(300)
    assert killed and "index" in result
    if name == "milvus":
        params = dict(params, collection_name=new_collection())
    reference = Index(slow, name, **params).add(G)
    assert_same(result["index"], reference, Q, G)
    assert len(result["index"]) == len(G)
