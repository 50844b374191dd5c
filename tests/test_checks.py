"""The shared geometry check battery, over every registered geometry."""

import os
import subprocess
import sys
import unittest

import numpy as np
import pytest

import anchordiv as ad
from anchordiv.models import registry
from anchordiv.testing import NotApplicable, check_geometry, geometry_checks

from conftest import GEOMETRY_PARAMS

pytestmark = pytest.mark.numeric

#: Checks that do not apply, per geometry, with a word of the reason.
NOT_APPLICABLE = {
    "cosine": {"check_eq_f1": "anchor_model", "check_low_temperature": "takes_temperature",
               "check_prior_round_trip": "accepts_prior"},
    "iti": {"check_eq_f1": "anchor_model", "check_low_temperature": "takes_temperature",
            "check_prior_round_trip": "accepts_prior"},
    "softmax": {"check_prior_round_trip": "accepts_prior"},
}


def factory(name):
    return lambda: ad.make_model(name, **GEOMETRY_PARAMS[name])


def test_every_registered_geometry_has_test_parameters():
    assert set(GEOMETRY_PARAMS) == set(registry())


@pytest.mark.parametrize("check", [c for name in GEOMETRY_PARAMS for c in geometry_checks(factory(name))], ids=str)
def test_battery(check):
    try:
        check()
    except NotApplicable as exc:
        pytest.skip(f"{check.name}: {exc}")


@pytest.mark.parametrize("name", sorted(GEOMETRY_PARAMS))
def test_report_lists_inapplicable_checks_as_skipped(name):
    report = check_geometry(factory(name))
    label = type(factory(name)()).__name__
    expected = {f"{label}-{check}": word for check, word in NOT_APPLICABLE.get(name, {}).items()}
    assert report.ok and not report.failed
    assert set(report.skipped) == set(expected)
    for check, word in expected.items():
        assert word in report.skipped[check]
    assert len(report.passed) + len(report.skipped) == len(report.results) == 8
    assert f"8 checks: {len(report.passed)} passed, {len(expected)} skipped, 0 failed" in str(report)


def test_an_inapplicable_check_raises_a_skip():
    check = next(c for c in geometry_checks(ad.Cosine) if c.name == "Cosine-check_eq_f1")
    with pytest.raises(NotApplicable, match="not an anchor model") as info:
        check()
    assert isinstance(info.value, unittest.SkipTest)
    assert check.result().outcome == "skipped"


# ------------------------------------------------------------ broken geometries
class BrokenCosine(ad.Cosine):
    """Its feature maps break the contract: pairwise no longer matches o − φψᵀ."""

    def pairwise(self, Q, G, symmetric=True):
        return super().pairwise(Q, G, symmetric) + 1e-3


class BrokenGradient(ad.Gaussian):
    """Its public ∇κ is not the gradient its divergences use."""

    def grad_cgf(self, eta):
        return super().grad_cgf(eta) * 1.01


class Upcasting(ad.Cosine):
    """Returns float64 for float32 arrays."""

    def pairwise(self, Q, G, symmetric=True):
        D = super().pairwise(Q, G, symmetric)
        return D.astype(np.float64) if isinstance(D, np.ndarray) else D


class Overflowing(ad.Softmax):
    """Forms exp(1/τ) unguarded, which overflows at low temperature."""

    def pairwise(self, Q, G, symmetric=True):
        with np.errstate(over="ignore", invalid="ignore"):
            big = np.exp(np.float64(1.0 / self.tau_))
            return super().pairwise(Q, G, symmetric) * big / big


class Accumulating(ad.Softmax):
    """Each fit adds the first anchor again, so fitting twice changes the geometry."""

    def fit(self, anchors, prior=None):
        seen = getattr(self, "seen_", None)
        self.seen_ = np.asarray(anchors) if seen is None else np.vstack([seen, np.asarray(anchors)[:1]])
        return super().fit(self.seen_, prior=prior)


class Unregistered(ad.Cosine):
    """Not in the registry, so no index file can name it."""


class DroppingPrior(ad.Gaussian):
    """Claims a posterior update but ignores the prior."""

    def fit(self, anchors, prior=None):
        return super().fit(anchors)


class Lenient(ad.Cosine):
    """Replaces NaN and inf in its inputs instead of refusing them."""

    def pairwise(self, Q, G, symmetric=True):
        return super().pairwise(np.nan_to_num(np.asarray(Q)), np.nan_to_num(np.asarray(G)), symmetric)


#: Per check, a geometry broken in the way it looks for, and a part of its failure message.
BREAKAGES = {
    "check_feature_contract": (BrokenCosine, {}, "pairwise"),
    "check_eq_f1": (BrokenGradient, {"tau": 0.05}, "eq. F.1"),
    "check_array_kinds": (Upcasting, {}, "numpy float32 in gave ndarray float64"),
    "check_low_temperature": (Overflowing, {"tau": 0.05}, "non-finite"),
    "check_fit": (Accumulating, {"tau": 0.05}, "a second fit"),
    "check_index_round_trip": (Unregistered, {}, "Unregistered is not registered"),
    "check_prior_round_trip": (DroppingPrior, {"tau": 0.05}, "prior_"),
    "check_bad_inputs": (Lenient, {}, "must raise ValueError"),
}


def _register_broken(monkeypatch):
    broken = {cls.__name__.lower(): cls for cls, _, _ in BREAKAGES.values() if cls is not Unregistered}
    monkeypatch.setattr("anchordiv.models._USER_MODELS", broken)


def test_every_check_has_a_breakage():
    from anchordiv.testing import CHECKS

    assert set(BREAKAGES) == {c.__name__ for c in CHECKS}


def test_battery_catches_a_broken_geometry(monkeypatch):
    _register_broken(monkeypatch)
    with pytest.raises(AssertionError, match="check_feature_contract: pairwise"):
        check_geometry(BrokenCosine)


@pytest.mark.parametrize("check", sorted(BREAKAGES))
def test_each_check_catches_its_breakage(check, monkeypatch):
    cls, params, words = BREAKAGES[check]
    _register_broken(monkeypatch)
    report = check_geometry(lambda: cls(**params), raise_on_failure=False)
    name = f"{cls.__name__}-{check}"
    assert name in report.failed, str(report)
    assert words in report.failed[name]
    with pytest.raises(AssertionError, match=check):
        check_geometry(lambda: cls(**params))


def test_battery_requires_registration_for_index_files():
    with pytest.raises(AssertionError, match="check_index_round_trip: Unregistered is not registered"):
        check_geometry(Unregistered)


OPTIMIZED = """
import sys
import anchordiv as ad
from anchordiv.testing import check_geometry
from test_checks import BREAKAGES, Unregistered

try:
    assert False
except AssertionError:
    sys.exit("assert statements still run: this script needs python -O")
for cls, _, _ in BREAKAGES.values():
    if cls is not Unregistered:
        ad.register_model(cls.__name__.lower(), cls)
for check, (cls, params, words) in sorted(BREAKAGES.items()):
    report = check_geometry(lambda: cls(**params), raise_on_failure=False)
    message = report.failed.get(f"{cls.__name__}-{check}", "")
    print(check, "caught" if words in message else "missed: " + str(report))
"""


def test_each_check_fails_under_python_O():
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-O", "-c", OPTIMIZED], capture_output=True, text=True, env=env,
                         cwd=tests, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines == [f"{check} caught" for check in sorted(BREAKAGES)], run.stdout + run.stderr
