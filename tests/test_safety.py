"""Files and inputs that must not be turned against the user: index files, self-exclusion,
half precision, numpy integers, stale temporaries, silenced progress bars."""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv.cli import main
from anchordiv.index import Index
from anchordiv.index._storage import seal
from anchordiv.models import _USER_MODELS

from conftest import GEOMETRY_PARAMS, unit_rows


@pytest.fixture(scope="module")
def small():
    rng = np.random.default_rng(3)
    d = 8
    center = rng.normal(size=d)
    return unit_rows(rng, 30, d, center), unit_rows(rng, 5, d, center), unit_rows(rng, 40, d, center)


def _rewrite(path, change):
    """Change a saved payload and record its new digests: a crafted file, consistent in itself."""
    payload = torch.load(path, weights_only=True)
    change(payload)
    torch.save(seal(payload), path)


# ------------------------------------------------------- 1. no import from a file
EVIL_MODULE = """
import pathlib
pathlib.Path({marker!r}).write_text("imported")
class X:
    pass
"""


@pytest.mark.parametrize("name", [None, "softmax_evil"])
def test_load_never_imports_the_class_a_file_names(tmp_path, monkeypatch, small, name):
    anchors, Q, G = small
    marker = tmp_path / "marker.txt"
    (tmp_path / "evilmod.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "crafted.index"
    Index(ad.Softmax(tau=0.05).fit(anchors)).add(G).save(path)

    def craft(payload):
        payload["model"]["name"] = name
        payload["model"]["class"] = "evilmod:X"

    _rewrite(path, craft)
    with pytest.raises(ValueError, match="not registered.*ad.register_model"):
        Index.load(path)
    assert not marker.exists(), "loading imported a module named by the file"
    assert "evilmod" not in sys.modules


def test_registered_name_wins_over_a_crafted_class_path(tmp_path, monkeypatch, small):
    anchors, Q, G = small
    marker = tmp_path / "marker.txt"
    (tmp_path / "evilmod.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "crafted.index"
    model = ad.Softmax(tau=0.05).fit(anchors)
    Index(model).add(G).save(path)
    _rewrite(path, lambda p: p["model"].__setitem__("class", "evilmod:X"))
    loaded = Index.load(path)
    assert type(loaded.model) is ad.Softmax and not marker.exists()
    np.testing.assert_array_equal(loaded.search(Q, k=4)[1], model.search(Q, G, k=4)[1])


class ScaledCosine(ad.Cosine):
    """A user's own geometry: 2·(1 − cos)."""

    def _query_terms(self, Q, symmetric):
        offsets, phi = super()._query_terms(Q, symmetric)
        return 2 * offsets, 2 * phi


def test_register_model_makes_a_user_geometry_loadable(tmp_path, monkeypatch, small):
    anchors, Q, G = small
    monkeypatch.setattr("anchordiv.models._USER_MODELS", dict(_USER_MODELS))
    model = ScaledCosine().fit(anchors)
    index = Index(model).add(G)
    with pytest.raises(ValueError, match=r"not registered.*ad.register_model\('my_model', cls\)"):
        index.save(tmp_path / "user.index")
    assert ad.register_model("scaled_cosine", ScaledCosine) is ScaledCosine
    ad.register_model("scaled_cosine", ScaledCosine)  # the same class again: fine
    index.save(tmp_path / "user.index")
    loaded = Index.load(tmp_path / "user.index")
    assert type(loaded.model) is ScaledCosine
    dist, ids = loaded.search(Q, k=5)
    ref_d, ref_i = ad.Cosine().fit(anchors).search(Q, G, k=5)
    np.testing.assert_array_equal(ids, ref_i)
    np.testing.assert_allclose(dist, 2 * ref_d, rtol=1e-12)
    assert isinstance(ad.make_model("scaled_cosine"), ScaledCosine)
    # a file naming a model this process has not registered
    monkeypatch.setattr("anchordiv.models._USER_MODELS", {})
    with pytest.raises(ValueError, match="'scaled_cosine'.*not registered.*register_model"):
        Index.load(tmp_path / "user.index")


def test_register_model_bad_input():
    with pytest.raises(ValueError, match="already taken"):
        ad.register_model("softmax", ScaledCosine)
    with pytest.raises(TypeError, match="subclass of ad.Geometry"):
        ad.register_model("thing", dict)
    with pytest.raises(ValueError, match="identifier"):
        ad.register_model("has space", ScaledCosine)
    with pytest.raises(ValueError, match="register_model"):
        ad.make_model("no_such_model")


# ----------------------------------------------- 2. the token goes only where sent
def test_token_needs_an_explicit_uri(tmp_path, small):
    anchors, Q, G = small
    path = tmp_path / "milvus.index"
    Index(ad.Cosine().fit(anchors)).add(G).save(path)

    def as_milvus(payload):
        payload["backend"] = "milvus"
        payload["params"] = {"uri": "http://127.0.0.9:19530", "collection_name": "stolen"}

    _rewrite(path, as_milvus)
    with pytest.raises(ValueError, match=r"'http://127\.0\.0\.9:19530'.*Pass uri= explicitly"):
        Index.load(path, token="root:Milvus")


def test_cli_token_needs_an_explicit_uri(tmp_path, small, capsys):
    anchors, Q, G = small
    path = tmp_path / "milvus.index"
    Index(ad.Cosine().fit(anchors)).add(G).save(path)
    _rewrite(path, lambda p: (p.__setitem__("backend", "milvus"),
                              p.__setitem__("params", {"uri": "http://127.0.0.9:19530"})))
    with pytest.raises(SystemExit) as exit_info:
        main(["index", "search", str(path), "--query-text", "x", "--param", "token=root:Milvus"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err
    assert "127.0.0.9" in err and "uri=" in err


# -------------------------------------------------------- 6. exclude_self checked
def test_exclude_self_refuses_different_data(small):
    anchors, Q, G = small
    m = ad.Softmax(tau=0.05).fit(anchors)
    other = G[::-1].copy()  # same length, other rows
    with pytest.raises(ValueError, match="same data"):
        m.search(other, G, k=3, exclude_self=True)
    # the same data, as one object or as an equal copy: item i never returns i
    for Qs in (G, G.copy(), torch.from_numpy(G.copy())):
        dist, idx = m.search(Qs, G, k=3, exclude_self=True)
        idx = np.asarray(idx)
        assert not (idx == np.arange(len(G))[:, None]).any()
        full = m.pairwise(G, G)
        np.fill_diagonal(full, np.inf)
        np.testing.assert_array_equal(idx, np.argsort(full, axis=1, kind="stable")[:, :3])


# ------------------------------------------------------------ 7. half precision
@pytest.mark.parametrize("name", ["gaussian", "latent_gaussian", "latent_spherical", "softmax", "gmm"])
def test_float16_input_gives_finite_float32(small, name):
    anchors, Q, G = small
    params = dict(GEOMETRY_PARAMS[name], tau=1e-3)
    m = ad.make_model(name, **params).fit(anchors)
    Q16, G16 = Q.astype(np.float16), G.astype(np.float16)
    D = m.pairwise(Q16, G16)
    assert D.dtype == np.float32 and np.isfinite(D).all()
    ref = m.pairwise(Q16.astype(np.float64), G16.astype(np.float64))
    np.testing.assert_allclose(D, ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())
    Dt = m.pairwise(torch.from_numpy(Q16), torch.from_numpy(G16))
    assert Dt.dtype == torch.float32 and bool(torch.isfinite(Dt).all())
    dist, idx = m.search(Q16, G16, k=4)
    assert dist.dtype == np.float32 and np.isfinite(dist).all()


# --------------------------------------------------- 10. duplicate ids in a file
def test_duplicate_ids_in_a_file_are_refused(tmp_path, small):
    anchors, Q, G = small
    path = tmp_path / "dup.index"
    Index(ad.Cosine().fit(anchors)).add(G).save(path)
    _rewrite(path, lambda p: p.__setitem__("ids", torch.zeros(len(G), dtype=torch.int64)))
    with pytest.raises(ValueError, match=r"dup.index.*\[0\] more than once"):
        Index.load(path)


# ----------------------------------------------------- 12. clear errors, no unsafe advice
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_random_file_error_never_suggests_unsafe_loading(tmp_path):
    path = tmp_path / "random.bin"
    path.write_bytes(os.urandom(4096))
    import pickle

    pickled = tmp_path / "pickled.index"
    with open(pickled, "wb") as f:
        pickle.dump({"format": "anchordiv.Index", "x": object()}, f)
    for p in (path, pickled):
        with pytest.raises(ValueError) as info:
            Index.load(p)
        msg = str(info.value)
        assert str(p.name) in msg and "weights_only" not in msg and "Index.save" in msg
        assert info.value.__cause__ is None


def test_full_disk_while_saving_an_index(tmp_path, small, monkeypatch):
    anchors, Q, G = small
    path = tmp_path / "full.index"
    index = Index(ad.Cosine().fit(anchors)).add(G)
    index.save(path)
    before = path.read_bytes()
    real_fdopen = os.fdopen

    def fdopen_on_full_disk(fd, mode="r", *args, **kwargs):  # the kernel's own ENOSPC, from /dev/full
        os.close(fd)
        return real_fdopen(os.open("/dev/full", os.O_WRONLY), mode, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", fdopen_on_full_disk)
    with pytest.raises(OSError, match="no space left.*free some space") as info:
        index.add(np.tile(G, (50, 1)), ids=np.arange(100, 100 + 50 * len(G))).save(path)
    assert info.value.errno == errno.ENOSPC and "full.index" in str(info.value)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["full.index"]


# --------------------------------------------------------------- 13. numpy ints
def test_numpy_integers_are_ints(small):
    anchors, Q, G = small
    m = ad.GaussianMixture(n_components=np.int64(2), tau=0.05).fit(anchors)
    ref = ad.GaussianMixture(n_components=2, tau=0.05).fit(anchors)
    np.testing.assert_array_equal(m.means_, ref.means_)
    lat = ad.LatentGaussian(rank=np.int64(3), tau=0.05).fit(anchors)
    assert lat.components_.shape[0] == 3
    d1, i1 = m.search(Q, G, k=np.int64(4))
    d2, i2 = m.search(Q, G, k=4)
    np.testing.assert_array_equal(i1, i2)
    index = Index(m).add(G)
    np.testing.assert_array_equal(index.search(Q, k=np.int32(4))[1], i2)
    assert len(ad.AnchorSet(anchors).subsample(np.int64(5))) == 5
    for bad in (True, 2.0, 0, -1):
        with pytest.raises(ValueError, match="k must be a positive int"):
            m.search(Q, G, k=bad)
    with pytest.raises(ValueError, match="n_components must be a positive int"):
        ad.GaussianMixture(n_components=np.float64(2), tau=0.05).fit(anchors)


# ------------------------------------------------------------ 14. stale temporaries
def test_stale_temporaries_of_a_killed_save_are_removed(tmp_path, small):
    anchors, Q, G = small
    path = tmp_path / "g.index"
    # a save killed midway, for real: a child process starts writing and is SIGKILLed
    script = (
        "import os, signal, sys, torch, numpy as np\n"
        "import anchordiv as ad\n"
        "X = np.load(sys.argv[2])\n"
        "index = ad.Index(ad.Cosine().fit(X)).add(X)\n"
        "real = torch.save\n"
        "def save_then_die(obj, f, *a, **k):\n"
        "    f.write(b'partial'); f.flush(); os.kill(os.getpid(), signal.SIGKILL)\n"
        "torch.save = save_then_die\n"
        "index.save(sys.argv[1])\n"
    )
    np.save(tmp_path / "G.npy", G)
    proc = subprocess.Popen([sys.executable, "-c", script, str(path), str(tmp_path / "G.npy")])
    assert proc.wait(timeout=120) == -9
    stale = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert len(stale) == 1 and stale[0].startswith(f".g.index.{proc.pid}.")
    # a temporary of a live process (another save in progress) is left alone
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".g.index.{sleeper.pid}.abc.tmp"
        live.write_bytes(b"in progress")
        Index(ad.Cosine().fit(anchors)).add(G).save(path)
        left = sorted(f for f in os.listdir(tmp_path) if f.endswith(".tmp"))
        assert left == [live.name]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert len(Index.load(path)) == len(G)


# ------------------------------------------------------------- 15. progress=False
def test_progress_false_silences_every_bar(small, capfd, monkeypatch):
    anchors, Q, G = small
    import anchordiv.models.base as base
    import anchordiv.exact as search_module

    monkeypatch.setattr(base, "PROGRESS_FLOPS", 0.0)  # every statistics pass would show a bar
    monkeypatch.setattr(search_module, "PROGRESS_WORK", 0.0)
    m = ad.Softmax(tau=0.05).fit(anchors)
    m.batch_size = 2  # several chunks
    capfd.readouterr()
    m.search(Q, G, k=3, progress=False)
    assert capfd.readouterr().err == ""
    m.search(Q, G, k=3)  # default: these bars do show
    assert "statistics" in capfd.readouterr().err


def test_index_files_of_the_eta_unit_format_are_refused(tmp_path, small):
    anchors, Q, G = small
    path = tmp_path / "v1.index"
    Index(ad.Softmax(tau=0.05).fit(anchors)).add(G).save(path)
    _rewrite(path, lambda p: p.__setitem__("version", 1))
    with pytest.raises(ValueError, match="format version 1.*reads version 3 .and 2.: rebuild the index"):
        Index.load(path)
