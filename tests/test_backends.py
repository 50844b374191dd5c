"""Index backends as plug-ins: the backend check battery on every built-in backend, and a tiny
out-of-tree backend (a test distribution on sys.path, found through its entry point) in
``Index``, ``build_index`` and the command line."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import anchordiv as ad
from anchordiv.index import BACKENDS, Backend, BackendTags, Index, build_index, register_backend
from anchordiv.index import _registry
from anchordiv.testing import backend_checks, check_backend

from conftest import collection_namer

HAS_FAISS = importlib.util.find_spec("faiss") is not None
HAS_MILVUS = importlib.util.find_spec("pymilvus") is not None and importlib.util.find_spec("milvus_lite") is not None
CHECK_NAMES = [c.name for c in backend_checks("exact")]
new_collection = collection_namer("chk")

PLUGIN = '''
"""A brute-force backend in numpy, shipped by a package beside anchordiv."""
import numpy as np
import torch

from anchordiv.index import Backend, BackendTags


class NumpyBackend(Backend):
    """Key features in one numpy array; every search scores all of them (in float64)."""

    name = "numpy_flat"
    TAGS = BackendTags(exact=True)
    DEFAULTS = {"memory_budget": 1 << 28}
    CHECKS = {"memory_budget": int}
    RUNTIME = frozenset({"memory_budget"})

    def __init__(self, params, euclidean):
        super().__init__(params, euclidean)
        self.keys = None

    def add(self, psi, ids, stored_ids, upsert=False, raw=None, metadata=None):
        new = psi.detach().cpu().numpy()
        self.keys = new if self.keys is None else np.concatenate([self.keys, new.astype(self.keys.dtype)])

    def delete(self, positions, ids, n, replaced=False):
        self.keys = np.delete(self.keys, positions, axis=0)

    def search(self, offsets, phi, k, n, positions_of, allow=None, certify=False, exclude=None, queries=None):
        o, f = offsets.detach().cpu().double().numpy(), phi.detach().cpu().double().numpy()
        scores = o[:, None] - f @ self.keys.astype(np.float64).T
        if allow is not None:
            hidden = np.ones(n, dtype=bool)
            hidden[allow] = False
            scores[:, hidden] = np.inf
        pos = np.argsort(scores, axis=1, kind="stable")[:, :k]
        dist = np.take_along_axis(scores, pos, axis=1)
        pos = np.where(np.isfinite(dist), pos, -1)
        out = (torch.from_numpy(dist).to(phi.dtype), torch.from_numpy(pos))
        return out + (np.ones(len(dist), dtype=bool),) if certify else out

    def key_blocks(self, stored_ids, rows=1 << 16):
        keys = np.zeros((0, 0), np.float32) if self.keys is None else self.keys
        for start in range(0, len(keys), rows):
            yield torch.from_numpy(np.ascontiguousarray(keys[start:start + rows]))

    def state(self, n):
        return {"keys": None if self.keys is None else torch.from_numpy(self.keys.copy())}

    @classmethod
    def restore(cls, params, euclidean, state, n, source):
        keys = state.get("keys")
        if n and not (isinstance(keys, torch.Tensor) and keys.ndim == 2 and keys.shape[0] == n):
            raise ValueError(f"{source!r} is corrupt: its numpy_flat keys are missing or malformed.")
        self = cls(params, euclidean)
        self.keys = None if keys is None else keys.numpy().copy()
        return self
'''


def _distribution(root: Path, name: str, entry_points: str, files: dict) -> None:
    """An installed distribution ``name`` under ``root``: its modules and a dist-info with entry points."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for path, text in files.items():
        (root / path).write_text(textwrap.dedent(text))


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    """A folder on sys.path holding the distribution ``adplug_numpy`` (entry point ``numpy_flat``); the
    registry is restored afterwards."""
    root = tmp_path / "site"
    _distribution(root, "adplug_numpy", "[anchordiv.backends]\nnumpy_flat = adplug_numpy:NumpyBackend\n",
                  {"adplug_numpy.py": PLUGIN})
    saved = dict(_registry._REGISTERED), set(_registry._SEEN), _registry._discovered
    monkeypatch.syspath_prepend(str(root))
    _registry._discovered = False  # discovered again on the next lookup, as in a fresh process
    yield root
    _registry._REGISTERED.clear()
    _registry._REGISTERED.update(saved[0])
    _registry._SEEN.clear()
    _registry._SEEN.update(saved[1])
    _registry._discovered = saved[2]
    sys.modules.pop("adplug_numpy", None)
    sys.modules.pop("adplug_missing", None)


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(30, 8)) + 2
    return ad.Softmax(tau=0.05).fit(A / np.linalg.norm(A, axis=1, keepdims=True))


@pytest.fixture(scope="module")
def gallery():
    rng = np.random.default_rng(2)
    G = rng.normal(size=(40, 8)) + 2
    return (G / np.linalg.norm(G, axis=1, keepdims=True)).astype(np.float32)


# ------------------------------------------------------------------ the battery on the built-ins
@pytest.mark.parametrize("check", CHECK_NAMES)
def test_exact_backend_passes_the_battery(check):
    dict((c.name, c) for c in backend_checks("exact"))[check]()


@pytest.mark.skipif(not HAS_FAISS, reason="needs faiss-cpu")
@pytest.mark.parametrize("params", [dict(index_type="flat"), dict(index_type="ivf", nlist=2, nprobe=2),
                                    dict(index_type="flat", candidates="embedding", shortlist=48)],
                         ids=["flat", "ivf", "embedding"])
def test_faiss_backend_passes_the_battery(params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # faiss' k-means warns about a small training set
        check_backend("faiss", **params)


@pytest.mark.skipif(not HAS_MILVUS, reason="needs pymilvus and milvus-lite")
@pytest.mark.parametrize("kind", ["lite", "server"])
def test_milvus_backend_passes_the_battery(kind, request):
    milvus = request.getfixturevalue(f"milvus_{kind}")
    check_backend("milvus", **milvus, collection_name=new_collection(), overwrite=True)


def test_battery_fails_on_a_broken_backend():
    """A backend that drops the last key passes nothing but the contract: the battery can fail."""
    from anchordiv.index._exact import ExactBackend

    class Forgetful(ExactBackend):
        name = "forgetful_test"

        def search(self, offsets, phi, k, n, positions_of, allow=None, certify=False, exclude=None, queries=None):
            d, p = super().search(offsets, phi, k, n, positions_of, allow=allow, exclude=exclude)[:2]
            return (d[:, :-1], p[:, :-1]) if k > 1 else (d, p)

    saved = dict(_registry._REGISTERED)
    try:
        register_backend(Forgetful)
        with pytest.raises(AssertionError, match="check_backend\\('forgetful_test'\\) failed round_trip"):
            check_backend("forgetful_test")
    finally:
        _registry._REGISTERED.clear()
        _registry._REGISTERED.update(saved)


# ------------------------------------------------------------------ the contract
def test_builtin_tags():
    assert BACKENDS["exact"].tags() == BackendTags(exact=True, accepts_exclude=True)
    assert BACKENDS["faiss"].tags() == BackendTags(wants_queries=True, tunable=True)
    assert BACKENDS["milvus"].tags() == BackendTags(stores_metadata=True, expression_filters=True, remote=True,
                                                    workers_write=True)
    assert list(BACKENDS)[:3] == ["exact", "faiss", "milvus"] and "annoy" not in BACKENDS


def test_register_backend_refuses_bad_classes():
    class NoName(Backend):
        pass

    class Half(Backend):
        name = "half_test"

        def add(self, *a, **kw):
            pass

    class Clash(BACKENDS["exact"]):
        name = "exact"

    with pytest.raises(TypeError, match="subclass of anchordiv.index.Backend"):
        register_backend(dict)
    with pytest.raises(ValueError, match="NoName.name must be a name"):
        register_backend(NoName)
    with pytest.raises(TypeError, match="does not implement delete, search, key_blocks, state, restore"):
        register_backend(Half)
    with pytest.raises(ValueError, match="'exact' is already taken"):
        register_backend(Clash)
    assert register_backend(BACKENDS["exact"]) is BACKENDS["exact"]  # the same class again: a no-op


def test_index_tests_no_backend_class():
    """Index, build_index and the registry read tags and hooks, never a backend's class or name."""
    root = Path(ad.__file__).parent / "index"
    for module in ("_index.py", "_build.py", "_common.py", "_storage.py", "_layout.py", "_certify.py"):
        text = (root / module).read_text()
        for needle in ("isinstance(self._backend", "MilvusBackend", "FaissBackend", "ExactBackend",
                       '== "milvus"', '== "faiss"', '== "exact"', '!= "milvus"', '!= "exact"', "embedding_candidates"):
            assert needle not in text, f"{module} tests a backend class or name: {needle}"


# ------------------------------------------------------------------ an out-of-tree plug-in
def test_plugin_found_through_its_entry_point(plugin_path, model, gallery):
    assert "numpy_flat" in BACKENDS and "numpy_flat" in _registry.backend_names()
    index = Index(model, backend="numpy_flat").add(gallery, ids=np.arange(100, 140))
    dist, ids = index.search(gallery[:3], k=4, exclude=np.arange(100, 103))
    ref_d, ref_rows = model.search(gallery[:3].astype(np.float64), gallery.astype(np.float64), k=5)
    np.testing.assert_array_equal(ids, ref_rows[:, 1:] + 100)
    built = build_index(model, gallery, "numpy_flat", shard_rows=7)
    np.testing.assert_array_equal(built.search(gallery[:3], k=4)[1], index.search(gallery[:3], k=4)[1] - 100)
    path = plugin_path / "g.index"
    built.save(path)
    assert Index.load(path).backend == "numpy_flat"


def test_plugin_passes_the_battery(plugin_path):
    check_backend("numpy_flat")


def test_broken_plugin_warns_and_is_skipped(plugin_path, model, gallery):
    _distribution(plugin_path, "adplug_broken",
                  "[anchordiv.backends]\nbroken_one = adplug_missing:Nothing\nwrong_name = adplug_numpy:NumpyBackend\n",
                  {})
    with pytest.warns(RuntimeWarning) as caught:
        names = _registry.backend_names()
    messages = " | ".join(str(w.message) for w in caught)
    assert "'broken_one' (adplug_missing:Nothing) could not be loaded" in messages
    assert "'wrong_name'" in messages and "give both the same name" in messages
    assert "numpy_flat" in names and "broken_one" not in names
    assert len(Index(model).add(gallery)) == len(gallery)  # the built-ins still work
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a broken plug-in warns once
        _registry.backend_names()
        with pytest.raises(ValueError, match="Unknown backend 'broken_one'"):
            Index(model, backend="broken_one")


def test_plugin_from_the_command_line(plugin_path, gallery, tmp_path):
    """``anchordiv index build --backend numpy_flat`` and ``index search`` in subprocesses that find the
    plug-in through PYTHONPATH alone."""
    coll = tmp_path / "coll"
    (coll / "img_emb").mkdir(parents=True)
    np.save(coll / "img_emb" / "img_emb_0.npy", gallery)
    out = tmp_path / "g.index"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    script = [sys.executable, "-c", "from anchordiv.cli import main; main()"]

    def run(*args):
        done = subprocess.run([*script, *map(str, args)], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "numpy_flat" in run("index", "build", "--help")
    built = run("index", "build", coll, "--model", "cosine", "--backend", "numpy_flat", "--out", out)
    assert "(numpy_flat)" in built
    got = json.loads(run("index", "search", out, "--query-row", 0, "-k", 3, "--format", "json"))
    assert got["backend"] == "numpy_flat"
    rows = [hit["row"] for hit in got["queries"][0]["results"]]
    ref = ad.Cosine().fit().search(gallery[:1].astype(np.float64), gallery.astype(np.float64), k=4)[1][0]
    assert rows == [r for r in ref.tolist() if r != 0][:3]
