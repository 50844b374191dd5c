"""Milvus searches on a real server: ids only come back, the shortlist is re-ranked in float64 (equal to a
float64 brute force over the stored float32 features), queries go in batches, and the Session default
sees this client's writes at once."""

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv.index import Index
from anchordiv.testing import assert_topk_up_to_rounding

from conftest import collection_namer, unit_rows

collection = collection_namer("q")
#: float64 unit roundoff.
U64 = 2.0 ** -53


@pytest.fixture(scope="module")
def data():
    """Softmax at τ = 0.01 with more anchors than dimensions, and near-duplicate keys: divergences ≪ their
    terms, where a float32 re-rank misorders neighbours."""
    rng = np.random.default_rng(5)
    d = 16
    center = rng.normal(size=d) * 1.5
    anchors = unit_rows(rng, 64, d, center)
    base = unit_rows(rng, 150, d, center)
    G = np.concatenate([base, unit_rows(rng, 150, d) * 1e-6 + base]).astype(np.float32)
    G /= np.linalg.norm(G, axis=1, keepdims=True)
    Q = (base[:40] + 1e-3 * rng.normal(size=(40, d))).astype(np.float32)
    return ad.Softmax(tau=0.01).fit(anchors), Q / np.linalg.norm(Q, axis=1, keepdims=True), G


def float64_of_float32(model, Q, G, k):
    """Top-k rows and divergences, in float64 arithmetic over the float32 features; and a float64 rounding bound."""
    o, phi = (t.double() for t in model.query_terms(torch.from_numpy(Q), True))
    psi = model.key_terms(torch.from_numpy(G), True).double()
    D = o[:, None] - phi @ psi.T
    rows = torch.argsort(D, dim=1, stable=True)[:, :k]
    scale = o.abs() + phi.norm(dim=1) * psi.norm(dim=1).max()
    return rows.numpy(), D, (4 * (psi.shape[1] + 3) * U64 * scale).numpy()


def assert_float64_topk(model, Q, G, ids, dist, got_ids, k):
    """``dist, got_ids`` are the float64 top-k of the float32 features, up to float64 rounding."""
    rows, D, tol = float64_of_float32(model, Q, G, k)
    got = np.searchsorted(ids, got_ids)
    kth = np.take_along_axis(D.numpy(), rows, 1)[:, -1]
    mine = np.take_along_axis(D.numpy(), got, 1)
    assert (mine <= (kth + tol)[:, None]).all()
    np.testing.assert_allclose(np.asarray(dist, np.float64), mine, rtol=0, atol=float(tol.max()) + 1e-6 * np.abs(mine).max())
    return rows


@pytest.fixture
def spy(monkeypatch):
    """Records the keyword arguments of every pymilvus ``MilvusClient.search`` (and calls it)."""
    from pymilvus import MilvusClient

    calls, search = [], MilvusClient.search

    def recorded(self, *args, **kwargs):
        calls.append(kwargs)
        return search(self, *args, **kwargs)

    monkeypatch.setattr(MilvusClient, "search", recorded)
    return calls


def test_ids_only_and_float64_rerank(milvus_server, data, spy, tmp_path):
    model, Q, G = data
    ids = np.arange(len(G), dtype=np.int64) * 2 + 5
    index = Index(model, "milvus", **milvus_server, collection_name=collection(), index_type="FLAT",
                  memory_budget=1 << 30).add(G, ids=ids)
    spy.clear()
    dist, got = index.search(Q, k=5)
    assert len(spy) == 1 and len(spy[0]["data"]) == len(Q)  # one request for every query
    assert spy[0]["output_fields"] == []  # no stored vectors come back
    rows = assert_float64_topk(model, Q, G, ids, dist, got, 5)
    # the data are such that a float32 computation of the same divergences misorders them
    o32, phi32 = model.query_terms(torch.from_numpy(Q), True)
    f32 = torch.argsort(o32[:, None] - phi32 @ model.key_terms(torch.from_numpy(G), True).T, dim=1)[:, :5]
    assert (np.sort(f32.numpy(), 1) != np.sort(rows, 1)).any()

    # a loaded index has no local features: Milvus returns the shortlist's (normalised) vectors, and the
    # answer is a top-k up to their float32 rounding
    index.save(tmp_path / "g.index")
    loaded = Index.load(tmp_path / "g.index", **milvus_server)
    spy.clear()
    dist2, got2 = loaded.search(Q, k=5)
    assert spy[0]["output_fields"] == ["vec"]
    assert_topk_up_to_rounding(model, Q, G, np.searchsorted(ids, got2), dist2)
    loaded.close()
    index.close()


@pytest.mark.parametrize("index_type", ["FLAT", "HNSW"])
def test_session_sees_own_writes(milvus_server, data, index_type, spy):
    """The default consistency (Session) reads Strong once after this client's writes, then Session."""
    model, Q, G = data
    ids = np.arange(len(G), dtype=np.int64)
    index = Index(model, "milvus", **milvus_server, collection_name=collection(), index_type=index_type,
                  ef_search=400)
    assert index.params["consistency_level"] == "Session"
    index.add(G[:200], ids=ids[:200])
    spy.clear()
    dist, got = index.search(Q, k=5)
    index.search(Q, k=5)
    assert [c["consistency_level"] for c in spy] == ["Strong", "Session"]
    assert_float64_topk(model, Q, G[:200], ids[:200], dist, got, 5)
    # delete the nearest keys and add the rest: the next search sees both
    gone = np.unique(got[:, 0])
    index.delete(gone)
    index.add(G[200:], ids=ids[200:])
    left = np.setdiff1d(ids, gone)
    dist, got = index.search(Q, k=5)
    assert not np.isin(got, gone).any()
    assert_float64_topk(model, Q, G[left], left, dist, got, 5)
    index.close()
