"""Index.search(filter=...), Index.delete and Index.upsert on every backend (exact, faiss,
milvus-lite and a Milvus server), against a float64 brute force of the model's divergence."""

import numpy as np
import pytest

import anchordiv as ad
from anchordiv.index import Index
from anchordiv.testing import assert_topk_up_to_rounding

from conftest import GEOMETRY_PARAMS, MILVUS_KINDS, collection_namer, unit_rows

pytestmark = pytest.mark.numeric
N = 60
new_collection = collection_namer("f")

BACKENDS = {
    "exact": ("exact", {}),
    "faiss-flat": ("faiss", dict(index_type="flat")),
    "faiss-hnsw": ("faiss", dict(index_type="hnsw", M=8, ef_construction=64, ef_search=N, shortlist=N)),
    "faiss-ivf": ("faiss", dict(index_type="ivf", nlist=4, nprobe=4)),
    **{f"milvus-{kind}": ("milvus", dict(index_type="FLAT")) for kind in MILVUS_KINDS},
}


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(21)
    d = 10
    center = rng.normal(size=d)
    anchors = unit_rows(rng, 40, d, center)
    G = unit_rows(rng, N, d, center).astype(np.float32)
    Q = unit_rows(rng, 6, d, center).astype(np.float32)
    extra = unit_rows(rng, 12, d, center).astype(np.float32)
    return anchors, Q, G, extra


@pytest.fixture(scope="module", params=["softmax", "gaussian"])
def model(request, data):
    return ad.make_model(request.param, **GEOMETRY_PARAMS[request.param]).fit(data[0])


def make(name, model, request):
    backend, params = BACKENDS[name]
    if backend == "milvus":
        params = dict(request.getfixturevalue(name.replace("-", "_")), collection_name=new_collection(), **params)
    return Index(model, backend, **params)


def brute_force(model, Q, vectors, ids, k):
    """Top-k ids and d_sym = ½[d(q‖g) + d(g‖q)] in float64 from ``model.divergence`` of every pair."""
    Q64, V64 = np.asarray(Q, np.float64), np.asarray(vectors, np.float64)
    qq, gg = np.repeat(Q64, len(V64), axis=0), np.tile(V64, (len(Q64), 1))
    d = 0.5 * (np.asarray(model.divergence(qq, gg)) + np.asarray(model.divergence(gg, qq)))
    d = d.reshape(len(Q64), len(V64))
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, 1), np.asarray(ids)[order]


def assert_matches(index, model, Q, vectors, ids, k=8, **search):
    """The index's float32 answer is a top-k of the float64 brute force up to float32 rounding."""
    ref_d, _ = brute_force(model, Q, vectors, ids, k)
    D64 = np.sort(np.asarray(model.pairwise(np.float64(Q), np.float64(vectors))), axis=1)[:, :k]
    np.testing.assert_allclose(D64, ref_d, rtol=1e-9, atol=1e-9 * float(np.abs(ref_d).max()))  # the truth, twice
    dist, got = index.search(Q, k=k, **search)
    ids = np.asarray(ids)
    assert np.isin(got, ids).all()
    order = np.argsort(ids)
    assert_topk_up_to_rounding(model, Q, vectors, order[np.searchsorted(ids, got, sorter=order)], dist)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_filter_delete_upsert_equal_brute_force(name, model, data, request, tmp_path):
    _, Q, G, extra = data
    ids = np.arange(N, dtype=np.int64) * 3 + 1000
    index = make(name, model, request).add(G, ids=ids)

    # an allow-list: the exact top-k among those ids only (unknown ids are ignored)
    allowed = np.r_[ids[5:45:2], [-7, 99999]]
    keep = np.isin(ids, allowed)
    assert_matches(index, model, Q, G[keep], ids[keep], filter=allowed)
    assert_matches(index, model, Q, G[keep][:6], ids[keep][:6], k=4, filter=ids[keep][:6])  # shorter than a shortlist
    with pytest.raises(ValueError, match="k=21 exceeds the 20 stored ids that filter allows"):
        index.search(Q, k=21, filter=allowed)
    # with exclude as well: the query's excluded id is skipped among the allowed ones
    ref_i = brute_force(model, Q, G[keep], ids[keep], 1)[1][:, 0]
    d, got = index.search(Q, k=5, filter=allowed, exclude=ref_i)
    assert not (got == ref_i[:, None]).any() and np.isin(got, allowed).all()

    # delete: the others keep their order; the result is the brute force over what is left
    gone = ids[[0, 7, 8, 30, 59]]
    index.delete(gone)
    left = ~np.isin(ids, gone)
    assert len(index) == N - 5
    np.testing.assert_array_equal(index.ids, ids[left])
    assert_matches(index, model, Q, G[left], ids[left])

    # upsert: replace 4 stored vectors, insert 4 new ids
    up_ids = np.r_[ids[[1, 2, 40, 41]], [5000, 5001, 5002, 5003]]
    index.upsert(extra[:8], ids=up_ids)
    index.upsert(extra[:8], ids=up_ids)  # a retried upsert changes nothing
    vectors = {int(i): v for i, v in zip(ids[left], G[left])} | {int(i): v for i, v in zip(up_ids, extra[:8])}
    final_ids = np.array(sorted(vectors))
    final = np.stack([vectors[int(i)] for i in final_ids])
    assert len(index) == len(final_ids) and set(index.ids.tolist()) == set(final_ids.tolist())
    assert_matches(index, model, Q, final, final_ids)
    assert_matches(index, model, Q, final[final_ids > 1100], final_ids[final_ids > 1100],
                   filter=final_ids[final_ids > 1100])

    # save and load keep the result
    index.save(tmp_path / "f.index")
    extra_params = {} if BACKENDS[name][0] != "milvus" else request.getfixturevalue(name.replace("-", "_"))
    loaded = Index.load(tmp_path / "f.index", **extra_params)
    assert_matches(loaded, model, Q, final, final_ids)
    np.testing.assert_array_equal(loaded.ids, index.ids)


@pytest.mark.parametrize("kind", MILVUS_KINDS)
def test_milvus_expression_filter(kind, model, data, request):
    _, Q, G, _ = data
    ids = np.arange(N, dtype=np.int64) * 3 + 1000
    index = make(f"milvus-{kind}", model, request).add(G, ids=ids)
    sel = (ids >= 1060) & (ids < 1150)
    assert_matches(index, model, Q, G[sel], ids[sel], filter="id >= 1060 and id < 1150")
    with pytest.warns(RuntimeWarning, match="fewer than k"):
        _, got = index.search(Q, k=5, filter="id < 1006")  # two rows match
    np.testing.assert_array_equal(np.sort(got[:, :2], axis=1), np.tile([1000, 1003], (len(Q), 1)))
    assert (got[:, 2:] == -1).all()


def test_bad_filters_deletes_and_upserts(data):
    anchors, Q, G, _ = data
    index = Index(ad.make_model("gaussian", tau=0.05).fit(anchors)).add(G)
    with pytest.raises(ValueError, match="Milvus expression.*'exact' backend.*array of allowed ids"):
        index.search(Q, k=3, filter="id > 3")
    with pytest.raises(ValueError, match="filter must be integers"):
        index.search(Q, k=3, filter=[0.5, 1.5])
    with pytest.raises(ValueError, match=r"k=3 exceeds the allowed ids left after excluding \(2\)"):
        index.search(Q, k=3, filter=[1, 2, 3], exclude=np.full(len(Q), 2))
    with pytest.raises(ValueError, match=r"ids not in the index: \[777\]"):
        index.delete([3, 777])
    assert len(index) == N  # nothing deleted
    with pytest.raises(ValueError, match="upsert needs ids="):
        index.upsert(G[:2], ids=None)
    with pytest.raises(ValueError, match="Duplicate ids"):
        index.upsert(G[:2], ids=[4, 4])
    with pytest.raises(ValueError, match="use upsert to replace"):
        index.add(G[:2], ids=[4, 5])


@pytest.mark.parametrize("kind", MILVUS_KINDS)
def test_milvus_schema_raw_embedding_and_metadata_fields(kind, data, request):
    """The collection holds id, vec, the raw embedding (a second vector field, or a companion
    collection on Milvus 2.3) and the metadata as scalar fields, which filter expressions use."""
    import pandas as pd
    from pymilvus import MilvusClient

    anchors, Q, G, extra = data
    m = ad.make_model("softmax", **GEOMETRY_PARAMS["softmax"]).fit(anchors)
    rng = np.random.default_rng(4)
    meta = pd.DataFrame({"label": rng.choice(["cat", "dog", "car"], N), "score": rng.random(N),
                         "flag": rng.random(N) > 0.5, "year": rng.integers(1990, 2030, N)})
    conn = request.getfixturevalue(f"milvus_{kind}")
    name = new_collection()
    index = Index(m, "milvus", **conn, collection_name=name).add(G, metadata=meta)
    client = MilvusClient(uri=index.params["uri"], token=conn["token"] or "")
    try:
        fields = {f["name"]: f for f in client.describe_collection(name)["fields"]}
        types = {k: f["type"].name for k, f in fields.items()}
        assert fields["id"]["is_primary"] and types["id"] == "INT64" and types["vec"] == "FLOAT_VECTOR"
        assert (types["label"], types["score"], types["flag"], types["year"]) == ("VARCHAR", "DOUBLE", "BOOL", "INT64")
        companion = kind == "server" and not client.get_server_version().startswith(("v2.4", "v2.5", "v2.6"))
        where = f"{name}_embedding" if companion else name
        assert ("embedding" in types) != companion and client.has_collection(f"{name}_embedding") == companion
        if companion:  # kept unloaded by the index; a tool that reads it loads it
            client.load_collection(where)
        got = client.get(where, ids=[0, 17, 59], output_fields=["embedding"])
        np.testing.assert_allclose(np.array([r["embedding"] for r in sorted(got, key=lambda r: r["id"])]),
                                   G[[0, 17, 59]], rtol=1e-6)
        row = client.get(name, ids=[17], output_fields=["label", "score", "flag", "year"])[0]
        assert (row["label"], row["flag"], row["year"]) == (meta.label[17], bool(meta.flag[17]), int(meta.year[17]))
        # filter expressions on the metadata fields
        sel = ((meta.label == "cat") & (meta.score > 0.3)).to_numpy()
        assert_matches(index, m, Q, G[sel], np.arange(N)[sel], k=min(5, int(sel.sum())),
                       filter='label == "cat" and score > 0.3')
        # upsert rewrites the row's metadata; delete removes the raw embedding too
        index.upsert(extra[:1], ids=[17], metadata=meta.iloc[[17]].assign(label="bird"))
        assert client.get(name, ids=[17], output_fields=["label"])[0]["label"] == "bird"
        index.delete([59])
        assert client.get(where, ids=[59], output_fields=["embedding"]) == []
        with pytest.raises(ValueError, match="metadata must have the columns"):
            index.add(extra[1:3], ids=[900, 901])
        with pytest.raises(ValueError, match="milvus backend only"):
            Index(m).add(G, metadata=meta)
    finally:
        client.close()


def test_milvus_never_drops_a_collection_it_did_not_make(data, milvus_server):
    """On a Milvus that keeps raw embeddings in a companion collection, an existing collection of
    that name is refused, never dropped; where a second vector field is allowed none is needed."""
    from pymilvus import DataType, MilvusClient

    anchors, Q, G, _ = data
    m = ad.make_model("gaussian", tau=0.05).fit(anchors)
    name = new_collection()
    client = MilvusClient(uri=milvus_server["uri"], token=milvus_server["token"] or "")
    try:
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("pk", DataType.INT64, is_primary=True)
        schema.add_field("v", DataType.FLOAT_VECTOR, dim=2)
        client.create_collection(f"{name}_embedding", schema=schema)
        index = Index(m, "milvus", **milvus_server, collection_name=name)
        if client.get_server_version().startswith("v2.3"):
            with pytest.raises(ValueError, match=f"'{name}_embedding' already exists.*store_embedding=False"):
                index.add(G)
            assert not client.has_collection(name)
            index = Index(m, "milvus", **milvus_server, collection_name=name, store_embedding=False)
        index.add(G)
        assert_matches(index, m, Q, G, np.arange(N))
        assert client.has_collection(f"{name}_embedding")
        assert [f["name"] for f in client.describe_collection(f"{name}_embedding")["fields"]] == ["pk", "v"]
    finally:
        client.close()
