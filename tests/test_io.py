"""Tests for anchordiv.io: writing, resuming and loading embedding collections."""

import hashlib
import json
import os

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
Image = pytest.importorskip("PIL.Image")

from anchordiv.io import (  # noqa: E402
    MANIFEST_NAME,
    Collection,
    embed_collection,
    list_images,
    load_collection,
    read_texts,
)

DIM = 8


def _hash_vec(key: bytes, dim: int = DIM) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim)
    return (v / np.linalg.norm(v)).astype(np.float32)


class HashEncoder:
    """Deterministic stand-in encoder: each input maps to a hash-seeded unit vector.

    ``fail_after`` makes the encoder raise on call number ``fail_after + 1``.
    """

    def __init__(self, name="hash-encoder", dim=DIM, tau=0.01, fail_after=None):
        self.name, self.dim, self.tau = name, dim, tau
        self.fail_after = fail_after
        self.calls = 0
        self.n_encoded = 0

    def _tick(self, n):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("simulated interruption")
        self.calls += 1
        self.n_encoded += n

    def encode_text(self, texts):
        self._tick(len(texts))
        return np.stack([_hash_vec(t.encode(), self.dim) for t in texts])

    def encode_images(self, images):
        self._tick(len(images))
        out = []
        for im in images:
            if not isinstance(im, Image.Image):
                im = Image.open(im).convert("RGB")
            out.append(_hash_vec(np.asarray(im).tobytes(), self.dim))
        return np.stack(out)


def _texts(n):
    return [f"a photo of object number {i}" for i in range(n)]


@pytest.fixture
def image_dir(tmp_path):
    """Two class folders of small PNGs plus one corrupt PNG and one text file named .jpg."""
    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    good = []
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True)
        for i in range(4):
            arr = rng.integers(0, 256, size=(6, 5, 3), dtype=np.uint8)
            path = root / cls / f"{cls}_{i}.png"
            Image.fromarray(arr).save(path)
            good.append(str(path))
    (root / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    (root / "dog" / "notes.jpg").write_text("this is not an image")
    (root / "dog" / "readme.txt").write_text("ignored: not an image extension")
    return root, sorted(good)


def _expected_image_vecs(paths):
    return np.stack([_hash_vec(np.asarray(Image.open(p).convert("RGB")).tobytes()) for p in paths])


# ---------------------------------------------------------------------------
# round trips


def test_text_roundtrip(tmp_path):
    texts = _texts(7)
    labels = {"label": [i % 3 for i in range(7)], "split": ["a"] * 7}
    enc = HashEncoder()
    res = embed_collection(texts, enc, tmp_path / "c", kind="text", labels=labels,
                           shard_size=3, progress=False, batch_size=2)
    assert res.complete and res.n_items == 7 and res.n_embedded == 7 and res.n_shards == 3
    assert res.n_skipped == 0 and res.shards_written == 3 and not res.resumed
    assert sorted(os.listdir(tmp_path / "c" / "text_emb")) == [f"text_emb_{i}.npy" for i in range(3)]

    c = load_collection(tmp_path / "c")
    assert isinstance(c, Collection)
    assert len(c) == 7 and c.dim == DIM and c.embeddings.dtype == np.float32
    np.testing.assert_array_equal(c.embeddings, np.stack([_hash_vec(t.encode()) for t in texts]))
    assert c.kind == "text" and c.encoder == "hash-encoder" and c.tau == pytest.approx(0.01)
    assert list(c.metadata.columns) == ["caption", "label", "split"]
    assert c.metadata["caption"].tolist() == texts
    np.testing.assert_array_equal(c.labels("label"), [i % 3 for i in range(7)])
    with pytest.raises(KeyError, match="available columns"):
        c.labels("nope")

    manifest = json.loads((tmp_path / "c" / MANIFEST_NAME).read_text())
    assert manifest["dim"] == DIM and manifest["n_items"] == 7 and manifest["complete"]
    assert [s["embeddings"] for s in manifest["shards"]] == [f"text_emb/text_emb_{i}.npy" for i in range(3)]
    # loading via the manifest file itself
    assert len(load_collection(tmp_path / "c" / MANIFEST_NAME)) == 7


def test_image_roundtrip_skips_unreadable(tmp_path, image_dir):
    root, good = image_dir
    listing = list_images(root)
    assert listing["image_path"].tolist() == sorted(listing["image_path"].tolist())
    assert len(listing) == 10  # 8 PNGs + broken.png + notes.jpg; readme.txt excluded
    assert set(listing["label"]) == {"cat", "dog"}

    enc = HashEncoder()
    res = embed_collection(listing, enc, tmp_path / "c", kind="image", shard_size=4,
                           progress=False, batch_size=3)
    assert res.complete and res.n_items == 10 and res.n_embedded == 8 and res.n_skipped == 2
    skipped = {os.path.basename(s["item"]) for s in res.skipped}
    assert skipped == {"broken.png", "notes.jpg"}
    assert all(s["reason"] for s in res.skipped)
    assert all(listing["image_path"][s["index"]] == s["item"] for s in res.skipped)

    manifest = json.loads((tmp_path / "c" / MANIFEST_NAME).read_text())
    assert manifest["n_skipped"] == 2 and {os.path.basename(s["item"]) for s in manifest["skipped"]} == skipped
    assert sum(s["n_rows"] for s in manifest["shards"]) == 8

    c = load_collection(tmp_path / "c")
    assert c.kind == "image" and len(c) == 8
    paths = c.metadata["image_path"].tolist()
    assert sorted(paths) == good and paths == sorted(paths)
    np.testing.assert_array_equal(c.labels("label"), [os.path.basename(os.path.dirname(p)) for p in paths])
    np.testing.assert_array_equal(c.embeddings, _expected_image_vecs(paths))


def test_list_images_options_and_errors(tmp_path, image_dir):
    root, _ = image_dir
    only_jpg = list_images(root, extensions=["JPG"], label_column=None)
    assert list(only_jpg.columns) == ["image_path"] and len(only_jpg) == 1
    with pytest.raises(FileNotFoundError, match="folder"):
        list_images(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no image files"):
        list_images(tmp_path / "empty")


def test_float16_shards(tmp_path):
    texts = _texts(5)
    embed_collection(texts, HashEncoder(), tmp_path / "c", dtype="float16", shard_size=2, progress=False)
    assert np.load(tmp_path / "c" / "text_emb" / "text_emb_0.npy").dtype == np.float16
    exact = np.stack([_hash_vec(t.encode()) for t in texts])

    up = load_collection(tmp_path / "c")
    assert up.embeddings.dtype == np.float32
    np.testing.assert_allclose(up.embeddings, exact, atol=1e-3)
    assert not np.array_equal(up.embeddings, exact)  # really went through float16

    kept = load_collection(tmp_path / "c", dtype=None)
    assert kept.embeddings.dtype == np.float16
    np.testing.assert_array_equal(kept.embeddings.astype(np.float32), up.embeddings)


def test_shard_order_is_numeric(tmp_path):
    texts = _texts(12)
    embed_collection(texts, HashEncoder(), tmp_path / "c", shard_size=1, progress=False)
    expected = np.stack([_hash_vec(t.encode()) for t in texts])
    with_manifest = load_collection(tmp_path / "c")
    np.testing.assert_array_equal(with_manifest.embeddings, expected)

    # same folder without the manifest: shards found by name, ordered 0, 1, 2, ..., 10, 11
    os.remove(tmp_path / "c" / MANIFEST_NAME)
    bare = load_collection(tmp_path / "c")
    assert bare.kind == "text" and bare.tau is None and bare.encoder is None
    np.testing.assert_array_equal(bare.embeddings, expected)
    assert bare.metadata["caption"].tolist() == texts

    # a plain folder of .npy shards, created in reverse order
    folder = tmp_path / "npys"
    folder.mkdir()
    for i in reversed(range(12)):
        np.save(folder / f"emb_{i}.npy", expected[i:i + 1])
    plain = load_collection(folder)
    np.testing.assert_array_equal(plain.embeddings, expected)
    assert plain.metadata is None and plain.kind is None


def test_clip_retrieval_folder_with_both_kinds(tmp_path):
    rng = np.random.default_rng(1)
    root = tmp_path / "cr"
    for d in ("img_emb", "text_emb", "metadata"):
        (root / d).mkdir(parents=True)
    img = rng.standard_normal((5, 4)).astype(np.float32)
    txt = rng.standard_normal((5, 4)).astype(np.float32)
    np.save(root / "img_emb" / "img_emb_0.npy", img[:3])
    np.save(root / "img_emb" / "img_emb_1.npy", img[3:])
    np.save(root / "text_emb" / "text_emb_0.npy", txt[:3])
    np.save(root / "text_emb" / "text_emb_1.npy", txt[3:])
    meta = pd.DataFrame({"image_path": [f"{i}.jpg" for i in range(5)], "caption": list("abcde")})
    meta.iloc[:3].to_parquet(root / "metadata" / "metadata_0.parquet", index=False)
    meta.iloc[3:].to_parquet(root / "metadata" / "metadata_1.parquet", index=False)

    with pytest.raises(ValueError, match="kind="):
        load_collection(root)
    ci = load_collection(root, kind="image")
    ct = load_collection(root, kind="text")
    np.testing.assert_array_equal(ci.embeddings, img)
    np.testing.assert_array_equal(ct.embeddings, txt)
    assert ci.metadata["caption"].tolist() == list("abcde") and ci.kind == "image"


def test_parquet_embedding_column(tmp_path):
    rng = np.random.default_rng(2)
    X = rng.standard_normal((6, 5)).astype(np.float32)
    df = pd.DataFrame({"embedding": list(X), "label": list("aabbcc"), "score": np.arange(6.0)})
    df.to_parquet(tmp_path / "e.parquet", index=False)
    c = load_collection(tmp_path / "e.parquet")
    np.testing.assert_array_equal(c.embeddings, X)
    assert list(c.metadata.columns) == ["label", "score"]
    assert c.labels("label").tolist() == list("aabbcc")

    # fixed-size list column, float64, custom name, no other columns
    arr = pa.FixedSizeListArray.from_arrays(pa.array(X.astype(np.float64).ravel()), 5)
    pq.write_table(pa.table({"vec": arr}), tmp_path / "f.parquet")
    c2 = load_collection(tmp_path / "f.parquet", embedding_column="vec")
    assert c2.embeddings.dtype == np.float32 and c2.metadata is None
    np.testing.assert_allclose(c2.embeddings, X)
    with pytest.raises(ValueError, match="embedding_column="):
        load_collection(tmp_path / "f.parquet")

    # ragged rows
    pq.write_table(pa.table({"embedding": [[1.0, 2.0], [1.0, 2.0, 3.0]]}), tmp_path / "r.parquet")
    with pytest.raises(ValueError, match="inconsistent lengths"):
        load_collection(tmp_path / "r.parquet")

    # folder of parquet shards, numeric order
    folder = tmp_path / "pqs"
    folder.mkdir()
    for i in (10, 2):
        part = df.iloc[:3] if i == 2 else df.iloc[3:]
        part.to_parquet(folder / f"part_{i}.parquet", index=False)
    c3 = load_collection(folder)
    np.testing.assert_array_equal(c3.embeddings, X)
    assert c3.metadata["label"].tolist() == list("aabbcc")


def test_plain_npy_and_mmap(tmp_path):
    X = np.random.default_rng(3).standard_normal((9, 4))
    np.save(tmp_path / "x64.npy", X)
    c = load_collection(tmp_path / "x64.npy")
    assert c.embeddings.dtype == np.float32 and c.metadata is None and len(c) == 9
    np.testing.assert_allclose(c.embeddings, X, rtol=1e-6)

    np.save(tmp_path / "x32.npy", X.astype(np.float32))
    m = load_collection(tmp_path / "x32.npy", mmap=True)
    assert isinstance(m.embeddings, np.memmap)
    np.testing.assert_array_equal(m.embeddings, X.astype(np.float32))
    with pytest.warns(UserWarning, match="into memory"):
        m64 = load_collection(tmp_path / "x64.npy", mmap=True)
    assert not isinstance(m64.embeddings, np.memmap)


# ---------------------------------------------------------------------------
# resumability


@pytest.mark.parametrize("fail_after", [1, 4, 7])
def test_resume_after_interruption_matches_uninterrupted(tmp_path, fail_after):
    texts = _texts(23)
    labels = {"label": [i % 4 for i in range(23)]}
    kw = dict(kind="text", labels=labels, shard_size=5, batch_size=2, progress=False)

    ref = embed_collection(texts, HashEncoder(), tmp_path / "ref", **kw)
    reference = load_collection(tmp_path / "ref")

    out = tmp_path / "job"
    with pytest.raises(RuntimeError, match="simulated interruption"):
        embed_collection(texts, HashEncoder(fail_after=fail_after), out, **kw)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    done = len(manifest["shards"])
    assert not manifest["complete"] and done == fail_after // 3  # 3 calls per 5-item shard
    with pytest.raises(ValueError, match="incomplete"):
        load_collection(out)
    if done:
        partial = load_collection(out, allow_partial=True)
        np.testing.assert_array_equal(partial.embeddings, reference.embeddings[: 5 * done])

    # leftovers of a crash between writes: a stray temp file of the killed process (its PID,
    # above Linux's PID_MAX_LIMIT, runs no more) and an unrecorded shard
    (out / "text_emb" / f".text_emb_{done}.npy.{2**22 + 1}.deadbeef.tmp").write_bytes(b"junk")
    np.save(out / "text_emb" / f"text_emb_{done}.npy", np.full((5, DIM), 7.0, np.float32))

    enc = HashEncoder()
    res = embed_collection(texts, enc, out, **kw)
    assert res.resumed and res.complete and res.shards_written == ref.n_shards - done
    assert enc.n_encoded == 23 - 5 * done  # nothing re-encoded
    resumed = load_collection(out)
    np.testing.assert_array_equal(resumed.embeddings, reference.embeddings)
    pd.testing.assert_frame_equal(resumed.metadata, reference.metadata)
    assert resumed.metadata["caption"].is_unique
    assert not any(f.endswith(".tmp") for f in os.listdir(out / "text_emb"))


def test_image_resume_keeps_skips_once(tmp_path, image_dir):
    root, _ = image_dir
    listing = list_images(root)
    kw = dict(kind="image", shard_size=3, batch_size=3, progress=False)
    embed_collection(listing, HashEncoder(), tmp_path / "ref", **kw)
    with pytest.raises(RuntimeError):
        embed_collection(listing, HashEncoder(fail_after=2), tmp_path / "job", **kw)
    res = embed_collection(listing, HashEncoder(), tmp_path / "job", **kw)
    assert res.n_skipped == 2 and res.n_embedded == 8
    a, b = load_collection(tmp_path / "ref"), load_collection(tmp_path / "job")
    np.testing.assert_array_equal(a.embeddings, b.embeddings)
    pd.testing.assert_frame_equal(a.metadata, b.metadata)
    manifest = json.loads((tmp_path / "job" / MANIFEST_NAME).read_text())
    assert len({s["index"] for s in manifest["skipped"]}) == len(manifest["skipped"]) == 2


def test_rerun_of_finished_job_is_noop(tmp_path):
    texts = _texts(6)
    out = tmp_path / "c"
    first = embed_collection(texts, HashEncoder(), out, shard_size=4, progress=False)
    stamps = {p: os.stat(p).st_mtime_ns for p in out.rglob("*") if p.is_file()}
    enc = HashEncoder(fail_after=0)  # any encoder call would raise
    again = embed_collection(texts, enc, out, shard_size=4, progress=False)
    assert enc.calls == 0 and again.shards_written == 0 and again.resumed and again.complete
    assert again.n_embedded == first.n_embedded == 6
    assert {p: os.stat(p).st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps


def test_finished_job_loads_no_encoder(tmp_path):
    """A finished collection is recognised by its encoder's name: an encoder loaded on first
    use (here one whose model folder does not exist) is never loaded."""
    from anchordiv.encoders import LazyEncoder

    spec = f"sentence-transformers:{tmp_path / 'no-such-model'}"
    texts = _texts(5)
    embed_collection(texts, HashEncoder(name=spec, dim=DIM), tmp_path / "c", shard_size=2, progress=False)
    again = embed_collection(texts, LazyEncoder(spec, "cpu"), tmp_path / "c", shard_size=2, progress=False)
    assert again.complete and again.resumed and again.shards_written == 0 and again.n_embedded == 5
    with pytest.raises(ValueError, match="different job"):  # a changed job is still refused, before any loading
        embed_collection(texts[:4], LazyEncoder(spec, "cpu"), tmp_path / "c", shard_size=2, progress=False)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(items=_texts(5)[::-1]), "items differ"),
        (dict(items=_texts(6), labels={"label": [1] * 6}), "n_items"),
        (dict(encoder=HashEncoder(name="other-encoder")), "encoder"),
        (dict(encoder=HashEncoder(tau=0.07)), "tau"),
        (dict(labels={"label": [9] * 5}), "labels differ"),
        (dict(shard_size=3), "shard_size"),
        (dict(dtype="float16"), "dtype"),
        (dict(kind="image", items=["a.png"] * 5), "kind"),
    ],
)
def test_mismatched_rerun_raises(tmp_path, change, match):
    base = dict(items=_texts(5), encoder=HashEncoder(), labels={"label": [1] * 5}, shard_size=2)
    embed_collection(out_dir=tmp_path / "c", progress=False, **base)
    before = sorted(os.listdir(tmp_path / "c" / "text_emb"))
    with pytest.raises(ValueError, match="different job") as info:
        embed_collection(out_dir=tmp_path / "c", progress=False, **{**base, **change})
    assert match in str(info.value)
    assert sorted(os.listdir(tmp_path / "c" / "text_emb")) == before


def test_nonempty_folder_without_manifest_raises(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "something.txt").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        embed_collection(_texts(3), HashEncoder(), tmp_path / "c", progress=False)


# ---------------------------------------------------------------------------
# bad inputs


def test_embed_argument_errors(tmp_path):
    enc = HashEncoder()
    with pytest.raises(ValueError, match="kind"):
        embed_collection(_texts(2), enc, tmp_path / "a", kind="audio", progress=False)
    with pytest.raises(ValueError, match="dtype"):
        embed_collection(_texts(2), enc, tmp_path / "a", dtype="int8", progress=False)
    with pytest.raises(ValueError, match="shard_size"):
        embed_collection(_texts(2), enc, tmp_path / "a", shard_size=0, progress=False)
    with pytest.raises(ValueError, match="empty"):
        embed_collection([], enc, tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="one value per item"):
        embed_collection(_texts(2), enc, tmp_path / "a", labels={"y": [1]}, progress=False)
    with pytest.raises(ValueError, match="texts must be str"):
        embed_collection(["ok", 3], enc, tmp_path / "a", progress=False)
    with pytest.raises(ValueError, match="single str"):
        embed_collection("just one string", enc, tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()

    class BadShape(HashEncoder):
        def encode_text(self, texts):
            return super().encode_text(texts)[:, :3]

    with pytest.raises(ValueError, match="dimension 3"):
        embed_collection(_texts(2), BadShape(), tmp_path / "b", progress=False)

    class NaNEncoder(HashEncoder):
        def encode_text(self, texts):
            v = super().encode_text(texts)
            v[-1, 0] = np.nan
            return v

    with pytest.raises(ValueError, match="NaN"):
        embed_collection(_texts(2), NaNEncoder(), tmp_path / "n", progress=False)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_collection(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no embeddings"):
        load_collection(tmp_path / "empty")
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="unsupported type"):
        load_collection(tmp_path / "x.csv")

    np.save(tmp_path / "nan.npy", np.array([[1.0, 0.0], [np.nan, 1.0]], np.float32))
    with pytest.raises(ValueError, match="row 1 holds NaN"):
        load_collection(tmp_path / "nan.npy")
    assert np.isnan(load_collection(tmp_path / "nan.npy", check_finite=False).embeddings).any()

    np.save(tmp_path / "flat.npy", np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="2-D"):
        load_collection(tmp_path / "flat.npy")

    dims = tmp_path / "dims"
    dims.mkdir()
    np.save(dims / "e_0.npy", np.zeros((2, 4), np.float32))
    np.save(dims / "e_1.npy", np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="inconsistent embedding dimensions"):
        load_collection(dims)


def test_load_layout_errors(tmp_path):
    out = tmp_path / "c"
    embed_collection(_texts(6), HashEncoder(), out, shard_size=3, progress=False)

    # metadata shard with the wrong number of rows
    meta = out / "metadata" / "metadata_1.parquet"
    pd.read_parquet(meta).iloc[:2].to_parquet(meta, index=False)
    with pytest.raises(ValueError, match="has 2 rows but"):
        load_collection(out)

    # shard listed in the manifest but deleted
    os.remove(out / "text_emb" / "text_emb_0.npy")
    with pytest.raises(FileNotFoundError, match="text_emb_0.npy"):
        load_collection(out)

    # no manifest: the gap in the shard numbering is reported (metadata_0 has no shard)
    os.remove(out / MANIFEST_NAME)
    with pytest.raises(ValueError, match="text_emb_0.npy is missing"):
        load_collection(out)

    # no manifest: a shard with another dimension
    np.save(out / "text_emb" / "text_emb_0.npy", np.zeros((3, DIM + 1), np.float32))
    with pytest.raises(ValueError, match="inconsistent embedding dimensions"):
        load_collection(out)


# ---------------------------------------------------------------------------
# read_texts


def test_read_texts_formats(tmp_path):
    (tmp_path / "t.txt").write_text("first line\n\n   \n second \nthird\n")
    t = read_texts(tmp_path / "t.txt")
    assert t["caption"].tolist() == ["first line", "second", "third"]
    with pytest.raises(ValueError, match="column="):
        read_texts(tmp_path / "t.txt", column="text")

    pd.DataFrame({"text": ["a cat", "a dog", ""], "label": [0, 1, 2]}).to_csv(tmp_path / "t.csv", index=False)
    with pytest.warns(UserWarning, match="dropped 1"):
        c = read_texts(tmp_path / "t.csv")
    assert list(c.columns) == ["caption", "label"]
    assert c["caption"].tolist() == ["a cat", "a dog"] and c["label"].tolist() == [0, 1]

    pd.DataFrame({"id": [1, 2], "prompt": ["x", "y"], "group": ["g", "h"]}).to_parquet(
        tmp_path / "t.parquet", index=False
    )
    with pytest.raises(ValueError, match="pass column="):
        read_texts(tmp_path / "t.parquet")
    p = read_texts(tmp_path / "t.parquet", column="prompt")
    assert p["caption"].tolist() == ["x", "y"] and set(p.columns) == {"caption", "id", "group"}
    with pytest.raises(ValueError, match="not in"):
        read_texts(tmp_path / "t.parquet", column="missing")
    with pytest.raises(FileNotFoundError):
        read_texts(tmp_path / "nope.txt")

    # a read_texts frame feeds embed_collection directly; label columns are kept
    embed_collection(p, HashEncoder(), tmp_path / "c", progress=False)
    loaded = load_collection(tmp_path / "c")
    assert loaded.metadata["group"].tolist() == ["g", "h"]
    np.testing.assert_array_equal(loaded.embeddings[1], _hash_vec(b"y"))
