"""Milvus backend safety against milvus-lite and a real Milvus server: collection fingerprints, a file held by
another process, recovery of unsaved adds (resync), numpy integer parameters."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import anchordiv as ad
from anchordiv.index import Index
from anchordiv.testing import assert_topk_up_to_rounding

from conftest import GEOMETRY_PARAMS, collection_namer, unit_rows


N = 60


def make_data(seed=11, d=10):
    rng = np.random.default_rng(seed)
    center = rng.normal(size=d)
    anchors = unit_rows(rng, 40, d, center)
    G = unit_rows(rng, N, d, center).astype(np.float32)
    Q = unit_rows(rng, 7, d, center).astype(np.float32)
    return anchors, Q, G


@pytest.fixture(scope="module")
def data():
    return make_data()


@pytest.fixture(scope="module")
def models(data):
    anchors = data[0]
    return {name: ad.make_model(name, **GEOMETRY_PARAMS[name]).fit(anchors) for name in ("softmax", "gaussian", "iti")}


collection = collection_namer("s")


def rows_of(got, ids):
    """Rows (of the array whose rows have ``ids``) of the ids ``got``, all of which must be there."""
    ids = np.asarray(ids)
    assert np.isin(got, ids).all()
    order = np.argsort(ids, kind="stable")
    return order[np.searchsorted(ids, got, sorter=order)]


def assert_exact(index, model, Q, G, ids, k=8, symmetric=True):
    """``index`` returns an exact top-k of ``model`` over ``G`` (whose rows have ``ids``): the float64
    top-k up to float32 rounding (anchordiv.testing.assert_topk_up_to_rounding)."""
    dist, got = index.search(Q, k=k)
    assert_topk_up_to_rounding(model, Q, G, rows_of(got, ids), dist, symmetric=symmetric)


# ----------------------------------------------------------- 1. fingerprint
def test_collection_overwritten_by_other_model_is_refused(data, models, milvus, tmp_path):
    _, Q, G = data
    name = collection()
    a = Index(models["softmax"], "milvus", **milvus, collection_name=name).add(G)
    a.save(tmp_path / "a.index")
    # another model, same row count and ids: a row count check alone passes
    b = Index(models["gaussian"], "milvus", **milvus, collection_name=name, overwrite=True).add(G[::-1].copy())
    assert len(b) == len(a) == N
    with pytest.raises(ValueError, match=rf"collection '{name}'.*model: 'softmax:.*expected, 'gaussian:.*found") as err:
        Index.load(tmp_path / "a.index", **milvus)
    msg = str(err.value)
    assert "a.index" in msg and "replaced" in msg and "own collection_name" in msg
    # the index still open in this process refuses to search (or add to) the new collection
    with pytest.raises(ValueError, match=rf"collection '{name}'.*not the one this index was built in"):
        a.search(Q, k=3)
    with pytest.raises(ValueError, match="not the one this index"):
        a.add(G[:2], ids=[1000, 1001])
    assert_exact(b, models["gaussian"], Q, G[::-1].copy(), np.arange(N))


def test_collection_overwritten_with_other_vectors_is_refused(data, models, milvus, tmp_path):
    _, Q, G = data
    name, m = collection(), models["softmax"]
    Index(m, "milvus", **milvus, collection_name=name).add(G).save(tmp_path / "a.index")
    other = make_data(seed=12)[2]
    Index(m, "milvus", **milvus, collection_name=name, overwrite=True).add(other)  # same model, ids and count
    with pytest.raises(ValueError, match=rf"collection '{name}'.*build: '[0-9a-f]{{32}}' expected"):
        Index.load(tmp_path / "a.index", **milvus)


def test_same_row_count_other_ids_is_refused(data, models, milvus, tmp_path):
    _, Q, G = data
    name, m = collection(), models["softmax"]
    Index(m, "milvus", **milvus, collection_name=name).add(G).save(tmp_path / "a.index")
    Index(m, "milvus", **milvus, collection_name=name, overwrite=True).add(G, ids=np.arange(N) + 1000)
    with pytest.raises(ValueError, match=rf"collection '{name}'.*ids: '60:[0-9a-f]{{12}}…' expected, '60:"):
        Index.load(tmp_path / "a.index", **milvus)


def test_untouched_collection_loads_and_searches_exactly(data, models, milvus, tmp_path):
    _, Q, G = data
    m = models["softmax"]
    ids = np.random.default_rng(3).permutation(10 * N)[:N]
    index = Index(m, "milvus", **milvus, collection_name=collection())
    index.add(G[:25], ids=ids[:25]).add(G[25:], ids=ids[25:])
    path = tmp_path / "a.index"
    index.save(path)
    loaded = Index.load(path, **milvus)
    np.testing.assert_array_equal(loaded.ids, ids)
    assert_exact(loaded, m, Q, G, ids)
    # a loaded index keeps its fingerprint current through add, save and load
    extra = make_data(seed=13)[2][:5]
    loaded.add(extra, ids=[-1, -2, -3, -4, -5])
    loaded.save(path)
    again = Index.load(path, **milvus)
    assert len(again) == N + 5
    assert_exact(again, m, Q, np.vstack([G, extra]), np.r_[ids, -1, -2, -3, -4, -5])


# ------------------------------------------- 2. a file held by another process
CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[3])
    import anchordiv as ad
    from test_milvus_safety import make_data
    anchors, Q, G = make_data()
    index = ad.Index(ad.make_model("softmax", tau=0.05).fit(anchors), "milvus", uri=sys.argv[1], collection_name="held")
    index.add(G).save(sys.argv[2])
    print("ready", flush=True)
    time.sleep(600)
""")


def test_lite_file_held_by_another_process(data, models, tmp_path):
    _, Q, G = data
    db, path = str(tmp_path / "held.db"), str(tmp_path / "held.index")
    child = subprocess.Popen([sys.executable, "-c", CHILD, db, path, os.path.dirname(__file__)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        for attempt in (lambda: Index.load(path), lambda: Index(models["softmax"], "milvus", uri=db)):
            with pytest.raises(RuntimeError) as err:
                attempt()
            msg = str(err.value)
            assert "\n" not in msg and err.value.__cause__ is None
            assert repr(db) in msg and "held open by another process" in msg
            assert 'uri="http://host:19530"' in msg
    finally:
        child.kill()
        child.wait()
    # once the other process is gone the file opens and holds what it saved
    loaded = Index.load(path)
    assert_exact(loaded, models["softmax"], Q, G, np.arange(N))
    loaded.close()


# ------------------------------------------------------------ 3. resync
def test_resync_recovers_rows_added_after_save(data, models, milvus, tmp_path):
    _, Q, G = data
    m = models["softmax"]
    ids = np.random.default_rng(5).permutation(10 * N)[:N]
    path = tmp_path / "a.index"
    index = Index(m, "milvus", **milvus, collection_name=collection()).add(G[:40], ids=ids[:40])
    index.save(path)
    index.add(G[40:], ids=ids[40:])  # then a crash: never saved
    with pytest.raises(ValueError, match=r"lists 40 ids but Milvus collection .* holds 60 rows.*resync=True"):
        Index.load(path, **milvus)
    loaded = Index.load(path, resync=True, **milvus)
    assert len(loaded) == N
    # the file's ids keep their order, the unsaved ones follow ascending
    np.testing.assert_array_equal(loaded.ids, np.r_[ids[:40], np.sort(ids[40:])])
    assert_exact(loaded, m, Q, G, ids, k=N)
    # resynced and saved: a plain load works again
    loaded.save(path)
    again = Index.load(path, **milvus)
    np.testing.assert_array_equal(again.ids, loaded.ids)
    assert_exact(again, m, Q, G, ids, k=10)


def test_resync_after_a_reaugmenting_add(data, models, milvus, tmp_path):
    """The unsaved batch raised the augmentation bound M: resync takes M from the collection."""
    _, Q, G = data
    m = models["softmax"]  # asymmetric features have no analytic bound: M follows the key norms
    G2 = np.vstack([G[:30], 5 * G[30:]])
    path = tmp_path / "a.index"
    index = Index(m, "milvus", symmetric=False, **milvus, collection_name=collection(), shortlist=N).add(G2[:30])
    index.save(path)
    bound = index._backend.layout.max_norm
    index.add(G2[30:])
    assert index._backend.layout.max_norm > 2 * bound
    with pytest.raises(ValueError, match="holds 60 rows.*resync=True"):
        Index.load(path, **milvus)
    loaded = Index.load(path, resync=True, **milvus)
    assert loaded._backend.layout.max_norm == index._backend.layout.max_norm
    assert_exact(loaded, m, Q, G2, np.arange(len(G2)), symmetric=False)


def test_resync_refuses_other_backends_and_replaced_collections(data, models, milvus, tmp_path):
    _, Q, G = data
    m = models["softmax"]
    Index(m).add(G).save(tmp_path / "exact.index")
    with pytest.raises(ValueError, match="resync=True applies to milvus indexes only.*'exact'"):
        Index.load(tmp_path / "exact.index", resync=True)
    name = collection()
    Index(m, "milvus", **milvus, collection_name=name).add(G[:40]).save(tmp_path / "a.index")
    Index(models["gaussian"], "milvus", **milvus, collection_name=name, overwrite=True).add(G)
    with pytest.raises(ValueError, match=rf"collection '{name}'.*model: 'softmax:.*replaced"):
        Index.load(tmp_path / "a.index", resync=True, **milvus)


# -------------------------------------------------- 4. numpy integers
def test_numpy_integer_parameters(data, models, milvus_lite, tmp_path):
    """numpy integers are turned into ints on the client side (milvus-lite and a server get the same
    pymilvus calls, so milvus-lite alone)."""
    milvus = milvus_lite
    _, Q, G = data
    m = models["softmax"]
    hnsw = Index(m, "milvus", **milvus, collection_name=collection(), index_type="HNSW", M=np.int64(8),
                 ef_construction=np.int64(64), ef_search=np.int64(N), shortlist=np.int64(N),
                 memory_budget=np.int64(2**20)).add(G)
    ivf = Index(m, "milvus", **milvus, collection_name=collection(), index_type="IVF_FLAT", nlist=np.int64(4),
                nprobe=np.int32(4)).add(G)
    expected = {"M": 8, "ef_construction": 64, "ef_search": N, "shortlist": N, "memory_budget": 2**20}
    assert {k: hnsw.params[k] for k in expected} == expected
    assert (ivf.params["nlist"], ivf.params["nprobe"]) == (4, 4)
    assert all(type(v) is int for v in (*[hnsw.params[k] for k in expected], ivf.params["nlist"], ivf.params["nprobe"]))
    for index in (hnsw, ivf):
        dist, ids = index.search(Q, k=np.int64(5))
        assert_topk_up_to_rounding(m, Q, G, ids, dist)
    hnsw.save(tmp_path / "h.index")
    ivf.save(tmp_path / "i.index")
    h2 = Index.load(tmp_path / "h.index", ef_search=np.int64(N + 5), shortlist=np.int32(N))
    i2 = Index.load(tmp_path / "i.index", nprobe=np.int64(4), memory_budget=np.uint32(2**20))
    assert (h2.params["ef_search"], type(h2.params["ef_search"])) == (N + 5, int)
    assert (i2.params["nprobe"], type(i2.params["memory_budget"])) == (4, int)
    assert_exact(h2, m, Q, G, np.arange(N))
    assert_exact(i2, m, Q, G, np.arange(N))


# ------------------------------------------------- 5. authorization
def test_token_reaches_only_a_server_with_authorization_that_it_names(data, models, milvus_auth_server, tmp_path):
    """On a server with authorization enabled, a token opens the collection; the index file never
    holds it, and a load sends it only with a uri given in the same call."""
    from pymilvus import MilvusException

    _, Q, G = data
    m, conn, name, path = models["softmax"], milvus_auth_server, collection(), tmp_path / "auth.index"
    with pytest.raises(MilvusException, match="(?i)auth|credential|password|denied|illegal connection params"):
        Index(m, "milvus", uri=conn["uri"], collection_name=name).add(G)
    index = Index(m, "milvus", **conn, collection_name=name).add(G)
    assert_exact(index, m, Q, G, np.arange(N))
    index.save(path)
    assert conn["token"].encode() not in path.read_bytes()
    with pytest.raises(ValueError, match="a token is sent only to a uri you name"):
        Index.load(path, token=conn["token"])
    with pytest.raises(MilvusException, match="(?i)auth|credential|password|denied|illegal connection params"):
        Index.load(path)  # the file's uri, no credentials
    assert_exact(Index.load(path, **conn), m, Q, G, np.arange(N))
