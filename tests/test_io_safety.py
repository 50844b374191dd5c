"""Regression tests for anchordiv.io: unsafe manifests, shard gaps, NA-like captions,
clear errors for broken files and full disks, numpy integer arguments and progress=False."""

import errno
import hashlib
import json
import os
import sys
import types

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pq = pytest.importorskip("pyarrow.parquet")
Image = pytest.importorskip("PIL.Image")
torch = pytest.importorskip("torch")

import anchordiv._util as adutil  # noqa: E402
import anchordiv.io.embed as adembed  # noqa: E402
from anchordiv.encoders import Encoder  # noqa: E402
from anchordiv.io import MANIFEST_NAME, embed_collection, load_collection, read_texts  # noqa: E402

DIM = 6


def _vec(key: bytes) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(DIM)
    return (v / np.linalg.norm(v)).astype(np.float32)


class HashEncoder:
    """Duck-typed encoder without a progress argument; can fail after some calls."""

    name, dim, tau = "hash", DIM, 0.01

    def __init__(self, fail_after=None):
        self.fail_after, self.calls = fail_after, 0

    def encode_text(self, texts):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("simulated interruption")
        self.calls += 1
        return np.stack([_vec(t.encode()) for t in texts])


class TinyEncoder(Encoder):
    """A real :class:`anchordiv.encoders.Encoder` (with its own tqdm bars) on a hash model."""

    has_images = True

    def __init__(self, batch_size=1):
        super().__init__("tiny", None, tau=0.01, device=torch.device("cpu"), batch_size=batch_size)

    def _encode_text_batch(self, texts):
        return np.stack([_vec(t.encode()) for t in texts])

    def _encode_image_batch(self, images):
        return np.stack([_vec(np.asarray(im).tobytes()) for im in images])


def _texts(n):
    return [f"text number {i}" for i in range(n)]


def _collection(tmp_path, n=6, shard_size=2, name="c"):
    out = tmp_path / name
    embed_collection(_texts(n), HashEncoder(), out, shard_size=shard_size, progress=False)
    return out


def _edit_manifest(out, edit):
    path = out / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    return path


# ---------------------------------------------------------------------------
# 1. manifest entries outside the collection folder


def _load(out):
    return load_collection(out)


def _resume(out):
    return embed_collection(_texts(6), HashEncoder(), out, shard_size=2, progress=False)


@pytest.mark.parametrize("action", [_load, _resume], ids=["load", "resume"])
def test_manifest_relative_escape_is_refused(tmp_path, action):
    out = _collection(tmp_path / "deep" / "er")
    outside = tmp_path / "x.npy"
    np.save(outside, np.ones((2, DIM), np.float32))
    entry = "../../../x.npy"
    assert (out / entry).resolve() == outside.resolve()  # the entry really reaches the file
    path = _edit_manifest(out, lambda m: m["shards"][1].update(embeddings=entry))
    with pytest.raises(ValueError, match="outside the collection folder") as info:
        action(out)
    msg = str(info.value)
    assert str(path) in msg and repr(entry) in msg and "shards[1].embeddings" in msg


@pytest.mark.parametrize("action", [_load, _resume], ids=["load", "resume"])
def test_manifest_absolute_path_is_refused(tmp_path, action):
    out = _collection(tmp_path)
    outside = tmp_path / "elsewhere.parquet"
    pd.DataFrame({"caption": ["p", "q"]}).to_parquet(outside, index=False)
    path = _edit_manifest(out, lambda m: m["shards"][2].update(metadata=str(outside)))
    with pytest.raises(ValueError, match="outside the collection folder") as info:
        action(out)
    assert str(path) in str(info.value) and repr(str(outside)) in str(info.value)


def test_manifest_absolute_path_inside_folder_is_refused(tmp_path):
    out = _collection(tmp_path)
    inside = str((out / "text_emb" / "text_emb_0.npy").resolve())
    _edit_manifest(out, lambda m: m["shards"][0].update(embeddings=inside))
    with pytest.raises(ValueError, match="relative paths inside the folder"):
        load_collection(out)


def test_manifest_symlink_leading_outside_is_refused(tmp_path):
    out = _collection(tmp_path)
    outside = tmp_path / "outside.npy"
    np.save(outside, np.ones((2, DIM), np.float32))
    shard = out / "text_emb" / "text_emb_1.npy"
    shard.unlink()
    try:
        shard.symlink_to(outside)
    except OSError:  # pragma: no cover - platform without symlinks
        pytest.skip("symlinks not available")
    with pytest.raises(ValueError, match="text_emb/text_emb_1.npy.*outside"):
        load_collection(out)


def test_manifest_symlink_inside_folder_still_loads(tmp_path):
    out = _collection(tmp_path)
    expected = load_collection(out).embeddings
    shard = out / "text_emb" / "text_emb_1.npy"
    moved = out / "store" / "one.npy"
    moved.parent.mkdir()
    shard.rename(moved)
    shard.symlink_to(moved)
    np.testing.assert_array_equal(load_collection(out).embeddings, expected)


# ---------------------------------------------------------------------------
# 2. gaps in the shard numbering without a manifest


def test_missing_middle_shard_without_manifest_fails(tmp_path):
    out = _collection(tmp_path, n=10, shard_size=2)  # shards 0..4
    os.remove(out / MANIFEST_NAME)
    os.remove(out / "text_emb" / "text_emb_3.npy")
    os.remove(out / "metadata" / "metadata_3.parquet")
    with pytest.raises(ValueError, match=r"text_emb_3\.npy is missing") as info:
        load_collection(out)
    assert str(out / "text_emb") in str(info.value)


def test_shard_numbering_not_starting_at_zero_fails(tmp_path):
    out = _collection(tmp_path, n=6, shard_size=2)
    os.remove(out / MANIFEST_NAME)
    os.remove(out / "text_emb" / "text_emb_0.npy")
    os.remove(out / "metadata" / "metadata_0.parquet")
    with pytest.raises(ValueError, match=r"text_emb_0\.npy is missing"):
        load_collection(out)


def test_clip_retrieval_image_shard_gap_fails(tmp_path):
    root = tmp_path / "cr"
    (root / "img_emb").mkdir(parents=True)
    for i in (0, 1, 2, 4):
        np.save(root / "img_emb" / f"img_emb_{i}.npy", np.full((2, 3), i, np.float32))
    with pytest.raises(ValueError, match=r"img_emb_3\.npy is missing"):
        load_collection(root)
    np.save(root / "img_emb" / "img_emb_3.npy", np.full((2, 3), 3, np.float32))
    c = load_collection(root)
    np.testing.assert_array_equal(c.embeddings[:, 0], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])


def test_missing_metadata_shard_is_named(tmp_path):
    out = _collection(tmp_path, n=10, shard_size=2)
    os.remove(out / MANIFEST_NAME)
    os.remove(out / "metadata" / "metadata_3.parquet")
    with pytest.raises(ValueError, match="do not match") as info:
        load_collection(out)
    assert "metadata_3.parquet" in str(info.value)


def test_contiguous_shards_without_manifest_still_load(tmp_path):
    out = _collection(tmp_path, n=10, shard_size=2)
    expected = load_collection(out)
    os.remove(out / MANIFEST_NAME)
    bare = load_collection(out)
    np.testing.assert_array_equal(bare.embeddings, expected.embeddings)
    assert bare.metadata["caption"].tolist() == _texts(10)


# ---------------------------------------------------------------------------
# 3. literal captions that look like pandas NA strings

NA_LIKE = ["None", "NA", "null", "N/A", "nan", "NaN", "NULL", "n/a", "<NA>", "#N/A"]


@pytest.mark.parametrize("suffix, sep", [(".csv", ","), (".tsv", "\t")])
def test_na_like_captions_survive_csv_tsv(tmp_path, suffix, sep):
    rows = [f"{c}{sep}{i}" for i, c in enumerate(NA_LIKE)] + [f"{sep}99", f"a cat{sep}7"]
    path = tmp_path / f"t{suffix}"
    path.write_text(f"caption{sep}label\n" + "\n".join(rows) + "\n")
    with pytest.warns(UserWarning, match="dropped 1 rows"):  # only the empty cell is missing
        frame = read_texts(path)
    assert frame["caption"].tolist() == NA_LIKE + ["a cat"]
    assert frame["label"].tolist() == list(range(len(NA_LIKE))) + [7]


def test_na_like_label_values_survive_and_empty_cell_is_missing(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text,group\nfirst,NA\nsecond,\nthird,None\n")
    frame = read_texts(path)
    assert frame["caption"].tolist() == ["first", "second", "third"]
    assert frame["group"][0] == "NA" and frame["group"][2] == "None"
    assert pd.isna(frame["group"][1])


def test_na_like_captions_survive_parquet_and_roundtrip(tmp_path):
    path = tmp_path / "t.parquet"
    pd.DataFrame({"caption": NA_LIKE + [None, ""]}).to_parquet(path, index=False)
    with pytest.warns(UserWarning, match="dropped 2 rows"):
        frame = read_texts(path)
    assert frame["caption"].tolist() == NA_LIKE
    embed_collection(frame, HashEncoder(), tmp_path / "c", progress=False)
    c = load_collection(tmp_path / "c")
    assert c.metadata["caption"].tolist() == NA_LIKE
    np.testing.assert_array_equal(c.embeddings[0], _vec(b"None"))


# ---------------------------------------------------------------------------
# 4. clear errors: broken shards, malformed manifests, full disk


def test_zero_byte_npy_file(tmp_path):
    path = tmp_path / "empty.npy"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="0 bytes") as info:
        load_collection(path)
    assert str(path) in str(info.value) and "recompute" in str(info.value)


def test_zero_byte_shard_in_collection(tmp_path):
    out = _collection(tmp_path)
    shard = out / "text_emb" / "text_emb_1.npy"
    shard.write_bytes(b"")
    with pytest.raises(ValueError, match="0 bytes") as info:
        load_collection(out)
    assert str(shard) in str(info.value)


def test_truncated_npy_shard(tmp_path):
    path = tmp_path / "cut.npy"
    np.save(path, np.ones((4, DIM), np.float32))
    path.write_bytes(path.read_bytes()[:5])
    with pytest.raises(ValueError, match="truncated") as info:
        load_collection(path)
    assert str(path) in str(info.value)


def test_zero_byte_metadata_shard(tmp_path):
    out = _collection(tmp_path)
    meta = out / "metadata" / "metadata_2.parquet"
    meta.write_bytes(b"")
    with pytest.raises(ValueError, match="restore it or recompute it") as info:
        load_collection(out)
    assert str(meta) in str(info.value)


@pytest.mark.parametrize("action", [_load, _resume], ids=["load", "resume"])
def test_manifest_without_shards(tmp_path, action):
    out = _collection(tmp_path)
    path = _edit_manifest(out, lambda m: m.pop("shards"))
    with pytest.raises(ValueError, match="has no 'shards' list") as info:
        action(out)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "shards, match",
    [
        ("text_emb/text_emb_0.npy", "'shards' of type str"),
        ([0, 1, 2], r"shards\[0\] must be an object"),
        ([{"embeddings": "text_emb/text_emb_0.npy"}], r"shards\[0\] must be an object"),
        ([{"embeddings": 3, "metadata": "metadata/metadata_0.parquet"}], r"shards\[0\] must be"),
    ],
)
@pytest.mark.parametrize("action", [_load, _resume], ids=["load", "resume"])
def test_malformed_manifest_shards(tmp_path, action, shards, match):
    out = _collection(tmp_path)
    path = _edit_manifest(out, lambda m: m.update(shards=shards))
    with pytest.raises(ValueError, match=match) as info:
        action(out)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("action", [_load, _resume], ids=["load", "resume"])
def test_manifest_not_json(tmp_path, action):
    out = _collection(tmp_path)
    (out / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="cannot read manifest") as info:
        action(out)
    assert str(out / MANIFEST_NAME) in str(info.value)


def test_resume_manifest_missing_counters(tmp_path):
    out = _collection(tmp_path)
    path = _edit_manifest(out, lambda m: m.pop("n_embedded"))
    with pytest.raises(ValueError, match="n_embedded") as info:
        _resume(out)
    assert str(path) in str(info.value)


def test_manifest_non_numeric_tau(tmp_path):
    out = _collection(tmp_path)
    _edit_manifest(out, lambda m: m.update(tau="hot"))
    with pytest.raises(ValueError, match="non-numeric tau"):
        load_collection(out)


_needs_dev_full = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not os.path.exists("/dev/full"),
    reason="needs Linux /dev/full",
)


def _start_job(tmp_path):
    """A 3-shard job interrupted after its first shard, plus its uninterrupted reference."""
    texts = _texts(6)
    ref = tmp_path / "ref"
    embed_collection(texts, HashEncoder(), ref, shard_size=2, batch_size=2, progress=False)
    out = tmp_path / "job"
    with pytest.raises(RuntimeError):
        embed_collection(texts, HashEncoder(fail_after=1), out, shard_size=2, batch_size=2, progress=False)
    return texts, ref, out


def _fixed_partial_names(monkeypatch):
    """Make the temporary write names predictable (see :func:`_temp_of`)."""
    monkeypatch.setattr(adutil, "uuid", types.SimpleNamespace(uuid4=lambda: types.SimpleNamespace(hex="full")))


def _temp_of(path):
    """The temporary file this process writes ``path`` through, with :func:`_fixed_partial_names`."""
    return path.parent / f".{path.name}.{os.getpid()}.full.tmp"


@_needs_dev_full
@pytest.mark.parametrize("target", ["text_emb/text_emb_1.npy", "metadata/metadata_1.parquet"])
def test_disk_full_while_writing_shard(tmp_path, monkeypatch, target):
    texts, ref, out = _start_job(tmp_path)
    _fixed_partial_names(monkeypatch)
    # the temporary file of shard 1 is /dev/full: every write to it fails with ENOSPC
    trap = _temp_of(out / target)
    trap.symlink_to("/dev/full")

    with pytest.raises(OSError) as info:
        embed_collection(texts, HashEncoder(), out, shard_size=2, batch_size=2, progress=False)
    msg = str(info.value)
    assert info.value.errno == errno.ENOSPC
    assert str(out / target) in msg and "disk is full" in msg and "--out" in msg
    assert "free some space" in msg.lower() and "\n" not in msg

    # nothing half-written is left: no temp file, no unrecorded shard of either kind
    assert not os.path.lexists(trap)
    assert sorted(os.listdir(out / "text_emb")) == ["text_emb_0.npy"]
    assert sorted(os.listdir(out / "metadata")) == ["metadata_0.parquet"]
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert len(manifest["shards"]) == 1 and not manifest["complete"]
    np.testing.assert_array_equal(
        load_collection(out, allow_partial=True).embeddings, load_collection(ref).embeddings[:2]
    )


@_needs_dev_full
def test_disk_full_then_resume_matches_reference(tmp_path, monkeypatch):
    texts, ref, out = _start_job(tmp_path)
    _fixed_partial_names(monkeypatch)
    _temp_of(out / "text_emb" / "text_emb_2.npy").symlink_to("/dev/full")
    with pytest.raises(OSError, match="disk is full"):
        embed_collection(texts, HashEncoder(), out, shard_size=2, batch_size=2, progress=False)
    assert len(json.loads((out / MANIFEST_NAME).read_text())["shards"]) == 2
    monkeypatch.undo()
    res = embed_collection(texts, HashEncoder(), out, shard_size=2, batch_size=2, progress=False)
    assert res.complete and res.resumed and res.shards_written == 1
    a, b = load_collection(ref), load_collection(out)
    np.testing.assert_array_equal(a.embeddings, b.embeddings)
    pd.testing.assert_frame_equal(a.metadata, b.metadata)


@_needs_dev_full
def test_disk_full_while_writing_manifest(tmp_path, monkeypatch):
    _fixed_partial_names(monkeypatch)
    out = tmp_path / "new"
    out.mkdir()
    # a new job writes its manifest first; out/ must be empty, so the trap is a dangling
    # link created right before the manifest write
    real_write_json = adembed._write_json

    def write_json_into_full_disk(path, obj):
        _temp_of(path).symlink_to("/dev/full")
        real_write_json(path, obj)

    monkeypatch.setattr(adembed, "_write_json", write_json_into_full_disk)
    with pytest.raises(OSError, match="disk is full") as info:
        embed_collection(_texts(3), HashEncoder(), out, progress=False)
    assert str(out / MANIFEST_NAME) in str(info.value)
    assert os.listdir(out) == []  # nothing left behind, so a rerun can start afresh
    monkeypatch.undo()
    res = embed_collection(_texts(3), HashEncoder(), out, progress=False)
    assert res.complete and len(load_collection(out)) == 3


def test_disk_quota_exceeded_while_writing_npy(tmp_path, monkeypatch):
    texts, _, out = _start_job(tmp_path)

    def save_over_quota(file, arr, **kw):  # what the OS reports past a quota
        file.write(b"\x93NUMPY")
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(np, "save", save_over_quota)
    with pytest.raises(OSError) as info:
        embed_collection(texts, HashEncoder(), out, shard_size=2, batch_size=2, progress=False)
    assert info.value.errno == errno.EDQUOT
    assert "text_emb_1.npy" in str(info.value) and "disk is full" in str(info.value)
    assert sorted(os.listdir(out / "text_emb")) == ["text_emb_0.npy"]


def test_other_write_errors_pass_through(tmp_path, monkeypatch):
    texts, _, out = _start_job(tmp_path)

    def save_denied(file, arr, **kw):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(np, "save", save_denied)
    with pytest.raises(PermissionError, match="Permission denied"):
        embed_collection(texts, HashEncoder(), out, shard_size=2, batch_size=2, progress=False)
    assert sorted(os.listdir(out / "text_emb")) == ["text_emb_0.npy"]


# ---------------------------------------------------------------------------
# 5. numpy integers as sizes


def test_numpy_integer_sizes_match_python_ints(tmp_path):
    texts = _texts(7)
    a = embed_collection(texts, HashEncoder(), tmp_path / "a", shard_size=3, batch_size=2, progress=False)
    b = embed_collection(texts, HashEncoder(), tmp_path / "b", shard_size=np.int64(3),
                         batch_size=np.int32(2), progress=False)
    assert (a.n_shards, a.n_embedded) == (b.n_shards, b.n_embedded) == (3, 7)
    ma = json.loads((tmp_path / "a" / MANIFEST_NAME).read_text())
    mb = json.loads((tmp_path / "b" / MANIFEST_NAME).read_text())
    assert ma["job"] == mb["job"] and type(mb["job"]["shard_size"]) is int
    assert [s["stop"] for s in mb["shards"]] == [3, 6, 7]
    np.testing.assert_array_equal(load_collection(tmp_path / "a").embeddings,
                                  load_collection(tmp_path / "b").embeddings)
    # the job written with numpy ints resumes with Python ints (and vice versa)
    again = embed_collection(texts, HashEncoder(), tmp_path / "b", shard_size=3, progress=False)
    assert again.resumed and again.shards_written == 0
    again = embed_collection(texts, HashEncoder(), tmp_path / "a", shard_size=np.uint16(3), progress=False)
    assert again.resumed and again.shards_written == 0


@pytest.mark.parametrize("arg", ["shard_size", "batch_size"])
@pytest.mark.parametrize("value", [True, np.bool_(True), 2.0, np.float64(2.0), "2", np.int64(0), -1])
def test_bad_sizes_name_the_argument(tmp_path, arg, value):
    with pytest.raises(ValueError, match=f"{arg} must be a positive integer"):
        embed_collection(_texts(3), HashEncoder(), tmp_path / "c", progress=False, **{arg: value})
    assert not (tmp_path / "c").exists()


# ---------------------------------------------------------------------------
# 6. progress=False silences every bar


def test_progress_false_silences_encoder_bars(tmp_path, capfd):
    enc = TinyEncoder(batch_size=1)  # a call with 12 texts shows the encoder's own bar
    enc.encode_text(_texts(12))
    assert "tiny texts" in capfd.readouterr().err  # the bar does reach stderr when shown

    res = embed_collection(_texts(12), enc, tmp_path / "c", batch_size=12, shard_size=6, progress=False)
    assert res.complete
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""
    np.testing.assert_array_equal(load_collection(tmp_path / "c").embeddings[3], _vec(b"text number 3"))


def test_progress_false_silences_image_bars(tmp_path, capfd):
    paths = []
    for i in range(6):
        p = tmp_path / f"im_{i}.png"
        Image.fromarray(np.full((4, 4, 3), i * 20, np.uint8)).save(p)
        paths.append(str(p))
    embed_collection(paths, TinyEncoder(batch_size=1), tmp_path / "c", kind="image", batch_size=6,
                     progress=False)
    assert capfd.readouterr().err == ""
    assert len(load_collection(tmp_path / "c")) == 6


def test_progress_true_still_shows_the_bar(tmp_path, capfd):
    embed_collection(_texts(4), HashEncoder(), tmp_path / "c", progress=True)  # no progress kwarg
    assert "embedding texts" in capfd.readouterr().err


def test_numeric_looking_captions_keep_their_text(tmp_path):
    from anchordiv.io import read_texts

    path = tmp_path / "codes.csv"
    path.write_text("caption,label\n007,1\n1e3,2\n0.50,3\n", encoding="utf-8")
    frame = read_texts(path)
    assert frame["caption"].tolist() == ["007", "1e3", "0.50"]
    assert frame["label"].tolist() == [1, 2, 3]  # other columns keep their types
