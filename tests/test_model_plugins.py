"""Geometries as plug-ins: declared parameters, and an out-of-tree geometry found as an entry point.

The plug-in is a test distribution on ``sys.path`` (``NAME-0.dist-info`` with ``METADATA`` and
``entry_points.txt``), as ``pip install`` would leave it. It is used from the Python API, the
``anchordiv search`` command (a subprocess with ``PYTHONPATH``), ``anchordiv eval`` and the
check battery.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import anchordiv as ad
import anchordiv.models as models
from anchordiv.models import Param, model_params, models_taking, registry

#: ~20 lines: an isotropic Gaussian anchor model N(mean, s·I), d(x‖y) = s‖x − y‖²/(2τ²).
PLUGIN = '''
import math

from anchordiv.models import Param
from anchordiv.models.base import EuclideanModel


class ScaledEuclidean(EuclideanModel):
    """d(x‖y) = s‖x − y‖²/(2τ²): the anchor model N(mean, s·I)."""

    PARAMS = (Param("scale", "float", 1.0, "Variance s of the isotropic Gaussian.", low=0, low_open=True),)

    def __init__(self, *, scale=1.0, tau=None, logit_scale=None):
        super().__init__(tau=tau, logit_scale=logit_scale)
        self.scale = scale

    def _fit(self, anchors):
        self.mean_ = anchors.embeddings.mean(0)

    def _cgf_and_grad(self, eta):
        mean = self.mean_.to(eta.dtype)
        return eta @ mean + 0.5 * self.scale * (eta * eta).sum(1), mean + self.scale * eta

    def _embed(self, X):
        return X * (math.sqrt(self.scale / 2) / self.tau_)
'''

NAME = "scaled_euclid"


def _distribution(root: Path, entry_points: str, module: str = "adplug_scaled", source: str = PLUGIN) -> Path:
    """A test distribution in ``root``: the module and its ``.dist-info`` (METADATA, entry_points.txt)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return root


@pytest.fixture
def fresh_registry(monkeypatch):
    """A registry that reloads the entry points and forgets what the test registered."""
    monkeypatch.setattr(models, "_USER_MODELS", dict(models._USER_MODELS))
    monkeypatch.setattr(models, "_PLUGINS_LOADED", False)
    yield


@pytest.fixture
def plugin(tmp_path, monkeypatch, fresh_registry):
    root = _distribution(tmp_path / "site", f"[anchordiv.models]\n{NAME} = adplug_scaled:ScaledEuclidean\n")
    monkeypatch.syspath_prepend(str(root))
    yield root
    sys.modules.pop("adplug_scaled", None)


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# ------------------------------------------------------------------ declarations
def test_every_builtin_declares_its_constructor():
    import inspect

    for name, cls in registry().items():
        sig = inspect.signature(cls.__init__).parameters
        keywords = {k for k in sig if k not in ("self", "tau", "logit_scale")}
        declared = {p.name for p in cls.PARAMS}
        assert declared == keywords, (name, declared, keywords)
        for p in cls.PARAMS:
            assert sig[p.name].default == p.default, (name, p.name)
            assert p.help, (name, p.name)
        assert cls.color, name


def test_param_checks_and_clips():
    gmm, rank = model_params("gmm"), model_params("latent_gaussian")["rank"]
    assert gmm["n_components"].check(3) == 3 and gmm["n_components"].parse("3") == 3
    with pytest.raises(ValueError, match=r"--components must be an int in \[1, inf\), got 0"):
        gmm["n_components"].check(0, "--components")
    assert gmm["n_components"].clip(8, n_anchors=5, dim=16) == 5
    assert rank.parse("8") == 8 and rank.parse("0.9") == 0.9
    with pytest.raises(ValueError, match="variance fraction"):
        rank.parse("1.5")
    assert rank.clip(8, n_anchors=5, dim=16) == 4 and rank.clip(0.9, n_anchors=5, dim=16) == 0.9
    assert rank.clip(8, n_anchors=1, dim=16) == 1
    assert model_params("gaussian")["summary"].parse("mode") == "mode"
    with pytest.raises(ValueError, match="one of 'mean', 'mode'"):
        model_params("gaussian")["summary"].parse("median")
    assert model_params("gmm")["nu0"].parse("none") is None
    assert "tau" not in model_params("softmax") and model_params("cosine") == {}
    assert models_taking("rank") == ("latent_gaussian", "latent_spherical")
    assert [p["name"] for p in map(Param.describe, model_params("gmm").values())][:2] == ["n_components", "seed"]


def test_build_geometry_clips_by_the_declaration():
    from anchordiv.experiments.core import build_geometry

    assert build_geometry("gmm", 0.1, 3, 8, {"gmm": {"n_components": 8}}, seed=5).get_params()["n_components"] == 3
    assert build_geometry("gmm", 0.1, 3, 8, seed=5).seed == 5
    assert build_geometry("latent_spherical", 0.1, 4, 8, {"latent_spherical": {"rank": 6}}).rank == 3
    assert build_geometry("latent_spherical", 0.1, 4, 8).rank == 0.95
    assert build_geometry("gmm", 0.1, 3, 8, {"gmm": {"n_components": 8}}, clip=False).n_components == 8


def test_register_model_checks_the_declaration(fresh_registry):
    class Bad(ad.Cosine):
        PARAMS = (Param("width", "int", 3),)

    with pytest.raises(ValueError, match="declares width, which its __init__ does not take"):
        ad.register_model("bad_decl", Bad)
    with pytest.raises(ValueError, match="kind must be one of"):
        Param("x", "complex", 0)


def test_undeclared_constructor_arguments_are_inferred(fresh_registry):
    class Loose(ad.Cosine):
        def __init__(self, width=3, label="a"):
            self.width, self.label = width, label

    ad.register_model("loose_geometry", Loose)
    p = model_params("loose_geometry")
    assert p["width"].kind == "int" and p["width"].default == 3 and p["label"].kind == "any"


# ------------------------------------------------------------ query_terms / key_terms
@pytest.mark.parametrize("name", ["softmax", "gaussian", "gmm", "latent_spherical", "cosine", "iti"])
def test_query_terms_in_one_pass(name):
    rng = np.random.default_rng(0)
    A, Q, G = (_unit(rng.normal(size=(n, 6))) for n in (12, 4, 7))
    m = ad.make_model(name, **({"tau": 0.1} if registry()[name].tags().takes_temperature else {})).fit(A)
    for symmetric in (True, False):
        offsets, phi = m.query_terms(Q, symmetric)
        psi = m.key_terms(G, symmetric)
        assert isinstance(offsets, np.ndarray) and offsets.dtype == np.float64
        np.testing.assert_allclose(offsets, m.query_offsets(Q, symmetric))
        np.testing.assert_allclose(phi, m.query_features(Q, symmetric))
        np.testing.assert_allclose(offsets[:, None] - phi @ psi.T, m.pairwise(Q, G, symmetric), atol=1e-9)
    import torch

    o, f = m.query_terms(torch.as_tensor(Q, dtype=torch.float32))
    assert isinstance(o, torch.Tensor) and f.dtype == torch.float32


def test_query_terms_computes_the_statistics_once():
    calls = []

    class Counting(ad.Softmax):
        def _stats(self, X, need_cgf):
            calls.append(X.shape[0])
            return super()._stats(X, need_cgf)

    rng = np.random.default_rng(1)
    m = Counting(tau=0.1).fit(_unit(rng.normal(size=(300, 4))))  # N > d: the ambient features
    m.query_terms(_unit(rng.normal(size=(5, 4))))
    assert calls == [5]


# ----------------------------------------------------------------- entry points
def test_plugin_from_the_python_api(plugin):
    assert NAME in registry() and registry()[NAME].__module__ == "adplug_scaled"
    assert model_params(NAME)["scale"].default == 1.0
    rng = np.random.default_rng(2)
    A, X = _unit(rng.normal(size=(10, 5))), _unit(rng.normal(size=(6, 5)))
    m = ad.make_model(NAME, scale=2.0, tau=0.1).fit(A)
    want = 2.0 * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1) / (2 * 0.1 ** 2)
    np.testing.assert_allclose(m.pairwise(X, X), want, rtol=1e-9, atol=1e-9)
    assert NAME in models.model_names(anchor_model=True) and NAME not in models.model_names(builtin=True)


def test_plugin_passes_the_check_battery(plugin):
    from anchordiv.testing import check_geometry

    cls = registry()[NAME]
    report = check_geometry(lambda: cls(scale=0.5, tau=0.05))
    assert report.ok and len(report.passed) >= 7, str(report)


def test_a_broken_plugin_warns_naming_it(tmp_path, monkeypatch, fresh_registry):
    root = _distribution(tmp_path / "site", "[anchordiv.models]\nbroken_geo = adplug_missing_module:Nothing\n",
                         module="adplug_broken", source="")
    monkeypatch.syspath_prepend(str(root))
    with pytest.warns(RuntimeWarning, match=r"skipped the geometry plug-in 'broken_geo = adplug_missing_module"):
        names = registry()
    assert "broken_geo" not in names and "softmax" in names


def test_a_plugin_cannot_take_a_builtin_name(tmp_path, monkeypatch, fresh_registry):
    root = _distribution(tmp_path / "site", "[anchordiv.models]\nsoftmax = adplug_taken:ScaledEuclidean\n",
                         module="adplug_taken")
    monkeypatch.syspath_prepend(str(root))
    with pytest.warns(RuntimeWarning, match="'softmax' is already taken"):
        table = registry()
    assert table["softmax"] is ad.Softmax
    sys.modules.pop("adplug_taken", None)


def test_register_model_after_import_reaches_the_cli(fresh_registry, tmp_path):
    from anchordiv.cli import cli

    class Shifted(ad.Cosine):
        """Cosine distance plus a constant c."""

        PARAMS = (Param("shift", "float", 0.0, "The constant c."),)

        def __init__(self, shift=0.0):
            self.shift = shift

        def _query_terms(self, Q, symmetric):
            offsets, phi = super()._query_terms(Q, symmetric)
            return offsets + self.shift, phi

    ad.register_model("shifted_cosine", Shifted)
    X = _unit(np.random.default_rng(3).normal(size=(6, 4))).astype(np.float32)
    np.save(tmp_path / "coll.npy", X)
    r = CliRunner().invoke(cli, ["search", str(tmp_path / "coll.npy"), "--model", "shifted_cosine",
                                 "--param", "shift=10", "--query-row", "0", "-k", "2", "--format", "json"])
    assert r.exit_code == 0, r.output
    hits = json.loads(r.output)["queries"][0]["results"]
    assert all(h["distance"] >= 10 for h in hits)
    r = CliRunner().invoke(cli, ["search", str(tmp_path / "coll.npy"), "--model", "shifted_cosine",
                                 "--param", "shift=x", "--query-row", "0"])
    assert r.exit_code == 2 and "shift must be a number" in r.output, r.output
    r = CliRunner().invoke(cli, ["search", str(tmp_path / "coll.npy"), "--model", "cosine",
                                 "--param", "shift=1", "--query-row", "0"])
    assert r.exit_code == 2 and "takes 'shift'" in r.output, r.output


def test_plugin_from_the_command_line(plugin, tmp_path):
    """``anchordiv search --model NAME --param KEY=VALUE`` in a fresh process that finds the plug-in."""
    rng = np.random.default_rng(4)
    X = _unit(rng.normal(size=(8, 384))).astype(np.float32)
    np.save(tmp_path / "coll.npy", X)
    (tmp_path / "anchors.txt").write_text("a cat\na dog\na car\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    base = [sys.executable, "-m", "anchordiv.cli", "search", str(tmp_path / "coll.npy"), "--model", NAME,
            "--anchors", str(tmp_path / "anchors.txt"), "--encoder", "minilm", "--tau", "0.1", "--query-row", "0",
            "-k", "3", "--format", "json", "--include-self", "--device", "cpu"]
    proc = subprocess.run([*base, "--param", "scale=2"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    hits = json.loads(proc.stdout)["queries"][0]["results"]
    want = 2.0 * ((X[0] - X) ** 2).sum(1) / (2 * 0.1 ** 2)
    assert [h["row"] for h in hits] == list(np.argsort(want)[:3])
    np.testing.assert_allclose([h["distance"] for h in hits], np.sort(want)[:3], rtol=1e-4, atol=1e-3)
    bad = subprocess.run([*base, "--param", "scale=-1"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "scale must be a number in (0, inf)" in bad.stderr, bad.stderr


def test_plugin_in_eval(plugin, tmp_path):
    import pandas as pd

    from anchordiv.experiments.cli import eval_command

    rng = np.random.default_rng(5)
    centres = _unit(rng.normal(size=(3, 8)))
    labels = np.repeat(np.arange(3), 8)
    X = _unit(centres[labels] + 0.3 * rng.normal(size=(24, 8))).astype(np.float32)
    pd.DataFrame({"embedding": list(X), "a": labels}).to_parquet(tmp_path / "coll.parquet")
    np.save(tmp_path / "A.npy", centres)
    r = CliRunner().invoke(eval_command(), [
        "budget", str(tmp_path / "coll.parquet"), "--anchors", str(tmp_path / "A.npy"), "--factor", "a",
        "--tau", "0.1", "--budgets", "3", "--draws", "1", "--model", f"softmax,{NAME}", "--baseline", "cosine",
        "--param", f"{NAME}.scale=3", "--n-boot", "20", "--out", str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    summary = (tmp_path / "out" / "budget_summary.csv").read_text()
    assert NAME in summary
    assert '"scale": 3.0' in (tmp_path / "out" / "budget.json").read_text()
