"""Damaged and mismatched files: index digests, sidecar fingerprints, manifests checked
against their shards, relative image paths, and clear errors for malformed inputs."""

import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

import anchordiv as ad
from anchordiv import cli
from anchordiv.cli import main
from anchordiv.index import Index
from anchordiv.index import _storage
from anchordiv.io import MANIFEST_NAME, Collection, load_collection

from conftest import unit_rows

D = 8


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(5)
    center = rng.normal(size=D)
    return (unit_rows(rng, 6, D, center).astype(np.float32), unit_rows(rng, 4, D, center).astype(np.float32),
            unit_rows(rng, 300, D, center).astype(np.float32))


def _payload(path):
    return torch.load(path, weights_only=True)


def _save_raw(payload, path):
    torch.save(payload, path)


def _flip(tensor, byte, mask=0x40):
    """``tensor`` with bit ``mask`` of its byte ``byte`` (negative: from the end) flipped."""
    raw = tensor.detach().clone().contiguous()
    flat = raw.reshape(-1).view(torch.uint8)
    flat[byte] ^= mask
    return raw


def _float_tensors(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _float_tensors(v)
    elif isinstance(value, list):
        for v in value:
            yield from _float_tensors(v)


# --------------------------------------------------------- 6. index file digests
KINDS = {
    "exact": ("cosine", "exact", {}),
    "flat": ("cosine", "faiss", {"index_type": "flat"}),
    "hnsw": ("cosine", "faiss", {"index_type": "hnsw"}),
    "ivf": ("cosine", "faiss", {"index_type": "ivf", "nlist": 4, "nprobe": 4}),
    "ivf-routed": ("softmax", "faiss", {"index_type": "ivf", "nlist": 4, "nprobe": 4}),
}


def _index(kind, small):
    anchors, _, G = small
    name, backend, params = KINDS[kind]
    model = ad.Cosine().fit(anchors) if name == "cosine" else ad.Softmax(tau=0.05).fit(anchors)
    return Index(model, backend, **params).add(G)


def _damage_features(payload):
    store = payload["store"]
    if "blocks" in store:
        store["blocks"][0] = _flip(store["blocks"][0], 3)  # the exponent of the first stored feature
    else:
        store["index"] = _flip(store["index"], -200)


@pytest.mark.parametrize("kind", list(KINDS))
def test_flipped_bit_in_stored_features_is_refused(tmp_path, small, kind):
    path = tmp_path / f"{kind}.index"
    _index(kind, small).save(path)
    payload = _payload(path)
    _damage_features(payload)
    _save_raw(payload, path)
    with pytest.raises(ValueError, match=rf"{kind}\.index.*is damaged.*stored vectors"):
        Index.load(path)


@pytest.mark.parametrize("part", ["ids", "model", "header"])
def test_flipped_bit_in_ids_model_or_header_is_refused(tmp_path, small, part):
    path = tmp_path / "part.index"
    anchors, _, G = small
    Index(ad.Softmax(tau=0.05).fit(anchors)).add(G).save(path)
    payload = _payload(path)
    if part == "ids":
        payload["ids"] = _flip(payload["ids"], 8 * 7, 0x01)  # id 7 becomes 6: still a valid-looking file
    elif part == "model":
        tensor = next(_float_tensors(payload["model"]["state"]))
        tensor.copy_(_flip(tensor, 3))
    else:
        payload["symmetric"] = not payload["symmetric"]
    _save_raw(payload, path)
    with pytest.raises(ValueError, match=rf"part\.index.*is damaged.*\b{part}\b.*Restore it.*rebuild"):
        Index.load(path)


def test_current_file_without_digests_is_refused(tmp_path, small):
    path = tmp_path / "stripped.index"
    _index("exact", small).save(path)
    payload = _payload(path)
    del payload["sha256"]
    _save_raw(payload, path)
    with pytest.raises(ValueError, match="stripped.index.*is damaged.*no SHA-256"):
        Index.load(path)


def test_files_of_the_format_before_digests_load_with_a_warning(tmp_path, small):
    _, Q, G = small
    path = tmp_path / "v2.index"
    index = _index("flat", small)
    index.save(path)
    payload = _payload(path)
    del payload["sha256"]
    payload["version"] = 2
    _save_raw(payload, path)
    with pytest.warns(UserWarning, match=r"v2\.index.*no integrity digests.*\.save"):
        loaded = Index.load(path)
    np.testing.assert_array_equal(loaded.search(Q, k=5)[1], index.search(Q, k=5)[1])
    loaded.save(path)  # saving again adds the digests
    assert _payload(path)["version"] == _storage.VERSION and Index.load(path).file_digest == loaded.file_digest


@pytest.mark.parametrize("kind", list(KINDS))
def test_intact_files_load_with_a_stable_digest(tmp_path, small, kind):
    _, Q, _ = small
    index = _index(kind, small)
    index.save(tmp_path / "a.index")
    loaded = Index.load(tmp_path / "a.index")
    assert isinstance(loaded.file_digest, str) and len(loaded.file_digest) == 64
    assert loaded.file_digest == index.file_digest
    assert loaded.save(tmp_path / "b.index") == index.file_digest  # the same content, the same digest
    assert Index.load(tmp_path / "b.index").file_digest == index.file_digest
    np.testing.assert_array_equal(loaded.search(Q, k=5)[1], index.search(Q, k=5)[1])


# ----------------------------------------------- 18. corrupted IVF lists are named
def _corrupt_ivf_ids(path, which="index"):
    import faiss

    payload = _payload(path)
    ivf = faiss.deserialize_index(payload["store"][which].numpy())
    lists = ivf.invlists
    first = next(i for i in range(lists.nlist) if lists.list_size(i))
    ids = faiss.rev_swig_ptr(lists.get_ids(first), lists.list_size(first))
    ids[0] = 10 ** 6
    payload["store"][which] = torch.from_numpy(faiss.serialize_index(ivf).copy())
    _storage.seal(payload)  # a consistent file: its digests were made after the damage
    _save_raw(payload, path)


@pytest.mark.parametrize("kind,which", [("ivf", "index"), ("ivf-routed", "index"), ("ivf-routed", "anchor_index")])
def test_corrupted_ivf_lists_are_named_at_load(tmp_path, small, kind, which):
    path = tmp_path / "lists.index"
    _index(kind, small).save(path)
    _corrupt_ivf_ids(path, which)
    with pytest.raises(ValueError, match=r"lists\.index.*IVF lists.*1000000.*300 stored vectors.*rebuild"):
        Index.load(path)


# -------------------------------------------------- 7, 8. the sidecar of `index build`
def _write_collection(folder, emb, ids=None):
    """A clip-retrieval collection folder (one shard, an 'id' column) without an encoder."""
    (folder / "text_emb").mkdir(parents=True)
    (folder / "metadata").mkdir()
    np.save(folder / "text_emb" / "text_emb_0.npy", emb.astype(np.float32))
    ids = [f"item{i}" for i in range(len(emb))] if ids is None else ids
    pd.DataFrame({"id": ids, "caption": [f"text {i}" for i in range(len(emb))]}).to_parquet(
        folder / "metadata" / "metadata_0.parquet")
    return folder


def _run(capsys, *args, ok=True):
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    assert (code == 0) == ok, out.err
    return out.out if ok else out.err


@pytest.fixture
def built(tmp_path, small, capsys):
    _, _, G = small
    coll = _write_collection(tmp_path / "coll", G)
    path = tmp_path / "g.index"
    _run(capsys, "index", "build", coll, "--model", "cosine", "--out", path)
    return coll, path


def _search(capsys, path, *extra, ok=True):
    return _run(capsys, "index", "search", path, "--query-row", 0, "-k", 3, "--format", "json", *extra, ok=ok)


def test_sidecar_records_fingerprints(built, capsys):
    coll, path = built
    meta = json.loads((path.parent / (path.name + ".anchordiv.json")).read_text())
    assert meta["index_sha256"] == Index.load(path).file_digest
    fp = meta["collection_fingerprint"]
    assert fp["n"] == 300 and fp["dim"] == D and len(fp["ids_sha256"]) == 64 and len(fp["sample_sha256"]) == 64
    got = json.loads(_search(capsys, path))
    hits = got["queries"][0]["results"]
    assert len(hits) == 3 and all(hit["row"] != 0 for hit in hits)


def test_collection_of_the_same_size_with_other_content_is_refused(built, tmp_path, capsys):
    coll, path = built
    other = _write_collection(tmp_path / "other", unit_rows(np.random.default_rng(9), 300, D).astype(np.float32))
    err = _search(capsys, path, "--collection", other, ok=False)
    assert "embeddings" in err and "other" in err and "rebuild" in err


def test_collection_with_other_ids_is_refused(built, tmp_path, small, capsys):
    coll, path = built
    other = _write_collection(tmp_path / "other", small[2], ids=[f"x{i}" for i in range(300)])
    err = _search(capsys, path, "--collection", other, ok=False)
    assert "'id' column" in err and "rebuild" in err


def test_collection_with_more_rows_is_refused(built, tmp_path, small, capsys):
    coll, path = built
    other = _write_collection(tmp_path / "more", np.concatenate([small[2], small[2][:5]]))
    err = _search(capsys, path, "--collection", other, ok=False)
    assert "305 rows" in err and "300" in err


def test_collection_changed_at_its_recorded_path_is_refused(built, small, capsys):
    coll, path = built
    np.save(coll / "text_emb" / "text_emb_0.npy", small[2][::-1].copy())
    err = _search(capsys, path, ok=False)
    assert "embeddings" in err and str(coll) in err


def test_stale_sidecar_is_refused(built, small, capsys):
    coll, path = built
    anchors, _, G = small
    # a build killed between the index save and the sidecar write: a new index, the old sidecar
    Index(ad.Cosine().fit(anchors)).add(G[::-1].copy()).save(path)
    err = _search(capsys, path, ok=False)
    assert "stale" in err and "rebuild" in err.lower() and "--collection" in err
    # an explicit --collection is still checked, against the index itself
    _search(capsys, path, "--collection", coll)
    wide = _write_collection(coll.parent / "wide", unit_rows(np.random.default_rng(1), 300, 2 * D).astype(np.float32))
    err = _search(capsys, path, "--collection", wide, ok=False)
    assert f"dimension {2 * D}" in err and "the index" in err and f"{D}" in err


def test_wrong_dimension_names_the_index_not_the_collection(built, tmp_path, capsys):
    coll, path = built
    wide = _write_collection(tmp_path / "wide", unit_rows(np.random.default_rng(1), 300, 2 * D).astype(np.float32))
    err = _search(capsys, path, "--collection", wide, ok=False)
    assert f"has dimension {2 * D}" in err and "index" in err and f"the collection has {D}" not in err


def test_query_dimension_error_names_what_has_the_other_dimension():
    class Encoder:
        def encode_text(self, texts):
            return np.zeros((len(texts), 16), np.float32)

    with pytest.raises(ValueError, match="has dimension 16 but the index has 8"):
        cli._gather_queries(None, [], ["a query"], [], Encoder(), 8, "the index")


def test_sidecar_replaces_a_planted_symlink(tmp_path, small, capsys):
    coll = _write_collection(tmp_path / "coll", small[2])
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "g.index"
    os.symlink(victim, tmp_path / "g.index.anchordiv.json")
    os.symlink(victim, path)
    _run(capsys, "index", "build", coll, "--model", "cosine", "--out", path)
    assert victim.read_text() == "precious" and not path.is_symlink()
    side = tmp_path / "g.index.anchordiv.json"
    assert not side.is_symlink() and json.loads(side.read_text())["n"] == 300
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


# ------------------------------------------------- 9. manifests against their shards
def _text_collection(tmp_path, n=6, shard_size=2):
    from test_io_safety import HashEncoder, _texts

    out = tmp_path / "c"
    ad.io.embed_collection(_texts(n), HashEncoder(), out, shard_size=shard_size, progress=False)
    return out


def _edit(out, edit):
    path = out / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_manifest_listing_a_shard_twice_is_refused(tmp_path):
    out = _text_collection(tmp_path)
    _edit(out, lambda m: m["shards"].__setitem__(1, dict(m["shards"][0])))
    with pytest.raises(ValueError, match=r"shards\[1\].*text_emb_0\.npy.*shards\[0\]"):
        load_collection(out)


@pytest.mark.parametrize("field,value,match", [
    ("n_rows", 5, r"shards\[1\]\.n_rows = 5.*text_emb_1\.npy.*holds 2 rows"),
    ("n_rows", "2", r"shards\[1\]\.n_rows"),
    ("start", 3, r"shards\[1\]\.start = 3.*previous shard stops at 2"),
    ("stop", 3, r"shards\[1\]\.stop = 3.*start 2.*2 rows"),
])
def test_manifest_shard_fields_must_match_the_files(tmp_path, field, value, match):
    out = _text_collection(tmp_path)
    _edit(out, lambda m: m["shards"][1].__setitem__(field, value))
    with pytest.raises(ValueError, match=match):
        load_collection(out)


@pytest.mark.parametrize("field,value,match", [
    ("dim", 7, r"'dim' = 7.*shards hold 6"),
    ("n_items", 9, r"'n_items' = 9.*shards cover 6"),
    ("n_embedded", 4, r"'n_embedded' = 4.*hold 6 rows"),
])
def test_manifest_totals_must_match_the_files(tmp_path, field, value, match):
    out = _text_collection(tmp_path)
    _edit(out, lambda m: m.__setitem__(field, value))
    with pytest.raises(ValueError, match=match):
        load_collection(out)


def test_manifest_checks_keep_image_shards_with_skipped_items(tmp_path):
    out = _text_collection(tmp_path, n=6, shard_size=3)

    def skip_one(m):  # as an image shard that lost an unreadable item: rows 0..2 hold 2 embeddings
        m["shards"][0]["n_rows"] = 2
        m["n_embedded"] = 5

    np.save(out / "text_emb" / "text_emb_0.npy", np.load(out / "text_emb" / "text_emb_0.npy")[:2])
    meta = pd.read_parquet(out / "metadata" / "metadata_0.parquet").iloc[:2]
    meta.to_parquet(out / "metadata" / "metadata_0.parquet")
    _edit(out, skip_one)
    assert len(load_collection(out)) == 5


# --------------------------------------------------- 16. relative image paths
def test_relative_image_path_resolves_against_the_collection_folder_only(tmp_path, monkeypatch):
    coll = tmp_path / "coll"
    (coll / "img").mkdir(parents=True)
    (coll / "img" / "a.png").write_bytes(b"collection")
    work = tmp_path / "work"
    (work / "img").mkdir(parents=True)
    (work / "img" / "a.png").write_bytes(b"working directory")
    (work / "img" / "b.png").write_bytes(b"working directory")
    monkeypatch.chdir(work)
    c = Collection(np.zeros((3, 2), np.float32), metadata=pd.DataFrame({"image_path": ["img/a.png", "img/b.png", str(work / "img" / "b.png")]}),
                   kind="image", path=str(coll))
    assert c.item_file(0) == coll / "img" / "a.png"
    assert c.item_file(1) == coll / "img" / "b.png"  # not the working directory's file
    assert c.item_file(2) == work / "img" / "b.png"  # absolute paths stay as they are
    assert c.item_file(0, root=work) == work / "img" / "a.png"
    single = Collection(np.zeros((1, 2), np.float32), metadata=pd.DataFrame({"image_path": ["img/a.png"]}),
                        kind="image", path=str(coll / "emb.npy"))
    assert single.item_file(0) == coll / "img" / "a.png"  # a file's collection folder is its folder


def test_list_images_of_a_relative_folder_gives_absolute_paths(tmp_path, monkeypatch):
    (tmp_path / "pics" / "cat").mkdir(parents=True)
    (tmp_path / "pics" / "cat" / "1.png").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    listing = ad.io.list_images("pics")
    assert listing["image_path"].tolist() == [str(tmp_path / "pics" / "cat" / "1.png")]


# ------------------------------------------------------- 18. messages of io errors
def test_npz_named_npy_is_a_clear_error(tmp_path):
    path = tmp_path / "emb.npy"
    with open(path, "wb") as fh:
        np.savez(fh, emb=np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"emb\.npy.*\.npz archive.*np\.save"):
        load_collection(path)


def test_deeply_nested_manifest_is_a_clear_error(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / MANIFEST_NAME).write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match=r"collection\.json.*nested too deeply.*repair"):
        load_collection(tmp_path / "c")


def test_deeply_nested_sidecar_is_a_clear_error(built, capsys):
    coll, path = built
    (path.parent / (path.name + ".anchordiv.json")).write_text("{\"a\":" * 200_000 + "1" + "}" * 200_000)
    err = _search(capsys, path, ok=False)
    assert "nested too deeply" in err and "rebuild" in err


@pytest.mark.parametrize("names,dup", [(["embedding", "x", "x"], "x"), (["embedding", "embedding"], "embedding")])
def test_duplicate_parquet_columns_are_named(tmp_path, names, dup):
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = [pa.array([[1.0, 2.0], [3.0, 4.0]]) if n == "embedding" else pa.array(["a", "b"]) for n in names]
    pq.write_table(pa.table(columns, names=names), tmp_path / "dup.parquet")
    with pytest.raises(ValueError, match=rf"dup\.parquet.*duplicate column.*'{dup}'.*rename") as info:
        load_collection(tmp_path / "dup.parquet")
    assert "truncated" not in str(info.value)
