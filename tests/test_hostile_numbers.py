"""Hostile numbers: huge and tiny vectors, extreme temperatures and weights, spreadsheet formulas in CSV.

Every value is checked against a float64 computation with float32-rounding tolerances.
"""

import csv
import io

import numpy as np
import pytest
from click.testing import CliRunner

import anchordiv as ad

TAU_RANGE = (1e-4, 100.0)
EPS32 = 2.0 ** -24


def _unit64(X):
    """Unit rows in float64, scaled by max |x| first so that no square overflows or underflows."""
    X = np.asarray(X, dtype=np.float64)
    Y = X / np.abs(X).max(axis=1, keepdims=True)
    return Y / np.linalg.norm(Y, axis=1, keepdims=True)


def _cosine64(Q, G):
    return 1.0 - _unit64(Q) @ _unit64(G).T


def _data(seed=0, d=16, n_q=6, n_g=40):
    rng = np.random.default_rng(seed)
    center = rng.normal(size=d)
    draw = lambda n: rng.normal(size=(n, d)) + center
    return draw(n_q), draw(n_g), draw(30)


def _scaled(X, exponents, seed=1):
    """Rows of ``X`` scaled to norms 10**e, e drawn from ``exponents`` (float32)."""
    rng = np.random.default_rng(seed)
    e = rng.choice(exponents, size=len(X))
    return (_unit64(X) * 10.0 ** e[:, None]).astype(np.float32)


# ----------------------------------------------------------------- item 12: norms
@pytest.mark.parametrize("exponents", [[18, 20, 25, 30, 37], [-30, -38, -40, -44], [-40, -20, 0, 20, 37]],
                         ids=["huge", "tiny", "mixed"])
def test_cosine_of_extreme_norms_matches_float64(exponents):
    """1 − cos(q, g) for finite non-zero rows of any norm, float32 within rounding of float64."""
    Q, G, _ = _data()
    Q, G = _scaled(Q, exponents, 1), _scaled(G, exponents, 2)
    truth = _cosine64(Q, G)
    d, i = ad.Cosine().search(Q, G, k=5)
    np.testing.assert_allclose(d, np.take_along_axis(truth, i, 1), atol=16 * 16 * EPS32)
    assert (np.take_along_axis(truth, i, 1)[:, -1] <= np.sort(truth, 1)[:, 4] + 16 * 16 * EPS32).all()
    np.testing.assert_allclose(ad.Cosine().pairwise(Q, G), truth, atol=16 * 16 * EPS32)
    np.testing.assert_allclose(ad.Cosine().divergence(Q, G[:len(Q)]), np.diag(truth[:, :len(Q)]),
                               atol=16 * 16 * EPS32)


def test_normalized_anchor_set_of_extreme_norms():
    _, _, A = _data()
    A = _scaled(A, [-44, -30, 0, 30, 38])
    np.testing.assert_allclose(ad.AnchorSet(A).normalized().embeddings.numpy(), _unit64(A), atol=4 * EPS32)


@pytest.mark.parametrize("name", ["gaussian", "latent_gaussian", "softmax", "gmm"])
@pytest.mark.parametrize("exponent", [17, 30])
def test_anchor_models_at_large_norms_match_float64_or_name_the_cause(name, exponent):
    """Float32 vectors of norm 1e17 or 1e30: the top-k and its distances match float64 up to
    float32 rounding, or, where the divergences (∝ ‖λ‖²/τ² for the Gaussian models) leave float32,
    a ValueError names the cause; never NaN or a silent order. Float64 input holds them all."""
    from anchordiv.testing import assert_topk_up_to_rounding

    Q, G, A = _data()
    params = {"gmm": {"n_components": 2}, "latent_gaussian": {"rank": 4}}.get(name, {})
    model = ad.make_model(name, tau=0.05, **params).fit(_unit64(A).astype(np.float32))
    Q32, G32 = _scaled(Q, [exponent]), _scaled(G, [exponent], 2)
    # ‖λ‖²/τ² leaves float32 near ‖λ‖ ~ 1e18; softmax's d_sym grows like ‖λ‖/τ
    overflows = exponent == 30 and name != "softmax"
    if overflows:
        for call in (lambda: model.search(Q32, G32, k=5), lambda: model.pairwise(Q32, G32),
                     lambda: model.divergence(Q32, G32[:len(Q32)])):
            with pytest.raises(ValueError, match="too large"):
                call()
    else:
        d, i = model.search(Q32, G32, k=5)
        assert_topk_up_to_rounding(model, Q32, G32, i, d)
    Q64, G64 = Q32.astype(np.float64), G32.astype(np.float64)
    d64, i64 = model.search(Q64, G64, k=5)
    assert_topk_up_to_rounding(model, Q64, G64, i64, d64, tol=1e-9 * np.abs(d64).max())


def test_latent_spherical_at_extreme_norms_matches_float64():
    from anchordiv.testing import assert_topk_up_to_rounding

    Q, G, A = _data()
    model = ad.LatentSpherical(tau=0.05, rank=4).fit(_unit64(A).astype(np.float32))
    for exponents in ([20, 30, 37], [-25, -40]):
        Q32, G32 = _scaled(Q, exponents), _scaled(G, exponents, 2)
        d, i = model.search(Q32, G32, k=5)
        assert_topk_up_to_rounding(model, Q32, G32, i, d)


# ----------------------------------------------------------------- item 13: τ
@pytest.mark.parametrize("tau", [1e-200, 1e-155, 5e-5, 101.0, 1e300, float("inf"), float("nan"), 0.0, -1.0])
def test_tau_outside_the_range_is_refused_everywhere(tau):
    _, _, A = _data()
    for name in ("softmax", "gaussian", "gmm", "latent_gaussian", "latent_spherical"):
        with pytest.raises(ValueError, match=r"tau"):
            ad.make_model(name, tau=tau).fit(_unit64(A))
    if tau > 0 and np.isfinite(tau):
        with pytest.raises(ValueError, match=r"logit_scale.*\[0\.01, 10000\]"):
            ad.Softmax(logit_scale=1 / tau).fit(_unit64(A))
    with pytest.raises(ValueError, match="tau"):
        ad.models.default_tau(["softmax"], None, tau)  # a manifest's τ goes through the same check


def test_tau_range_edges_match_float64():
    from anchordiv.testing import assert_topk_up_to_rounding

    Q, G, A = _data()
    Q32, G32 = _unit64(Q).astype(np.float32), _unit64(G).astype(np.float32)
    for tau in TAU_RANGE:
        for name in ("softmax", "gaussian", "gmm", "latent_gaussian", "latent_spherical"):
            params = {"gmm": {"n_components": 2}}.get(name, {})
            model = ad.make_model(name, tau=tau, **params).fit(_unit64(A))
            d, i = model.search(Q32, G32, k=5)
            assert_topk_up_to_rounding(model, Q32, G32, i, d)


def test_a_restored_tau_outside_the_range_is_named_in_search():
    """A model restored with τ = 1e-200 (as an index file's state would) gives no NaN order: the
    search fails naming τ as the cause."""
    Q, G, A = _data()
    model = ad.Softmax(tau=0.05).fit(_unit64(A))
    model.tau_ = 1e-200
    with pytest.raises(ValueError, match=r"tau=1e-200 is outside \[0\.0001, 100\]"):
        model.search(_unit64(Q).astype(np.float32), _unit64(G).astype(np.float32), k=5)


def test_tau_check_and_option_values():
    import click

    from anchordiv._cli_values import tau_option
    from anchordiv.models import base
    from anchordiv.models.base import check_tau

    assert base.TAU_RANGE == TAU_RANGE
    assert check_tau(0.05) == 0.05 and check_tau(1e-4) == 1e-4 and check_tau(100) == 100.0
    for bad in (1e-200, 5e-5, 101.0, float("inf"), float("nan"), 0.0, -1.0, "x", True, None):
        with pytest.raises(ValueError, match=r"tau.*\[0\.0001, 100\]"):
            check_tau(bad)

    assert tau_option(None, None, None) is None
    assert tau_option(None, None, 0.05) == 0.05
    assert tau_option(None, None, [0.02, 0.05]) == [0.02, 0.05]
    for bad in (1e-200, [0.05, 1e-155], 1e3):
        with pytest.raises(click.BadParameter, match=r"\[0\.0001, 100\]"):
            tau_option(None, None, bad)


class Fixed:
    """An encoder of seeded random vectors (no model), recording a temperature."""

    name, dim = "fixed", 4

    def __init__(self, tau=0.05):
        self.tau = tau

    def encode_text(self, texts):
        rng = np.random.default_rng(len(texts))
        return rng.normal(size=(len(texts), 4)).astype(np.float32)


def _search(*args):
    from anchordiv.cli import cli

    return CliRunner().invoke(cli, ["search", *map(str, args)], catch_exceptions=True)


@pytest.mark.parametrize("where", ["option", "manifest"])
def test_cli_refuses_a_tau_outside_the_range(tmp_path, where):
    """--tau 1e-200, or a manifest's τ of 1e-200, used to give NaN distances in an arbitrary order
    with exit status 0; now the command fails naming tau and the range."""
    from anchordiv.anchorsfile import embed_anchors
    from anchordiv.io import embed_collection

    embed_collection([f"item {i}" for i in range(6)], Fixed(1e-200 if where == "manifest" else 0.05),
                     tmp_path / "c", progress=False)
    anchors = tmp_path / "a.txt"
    anchors.write_text("x\ny\nz\nw\nv\n")
    embed_anchors(anchors, Fixed())  # cached: the command loads no encoder
    args = [tmp_path / "c", "--model", "softmax", "--anchors", anchors, "--query-row", 0, "-k", 3,
            "--format", "json"]
    assert _search(*args, "--tau", 0.05).exit_code == 0
    out = _search(*args, *(["--tau", "1e-200"] if where == "option" else []))
    assert out.exit_code != 0 and "nan" not in out.stdout.lower()
    assert "tau" in out.output and "[0.0001, 100]" in out.output


# ----------------------------------------------------------------- item 18: messages
def test_tiny_vectors_are_not_called_zero():
    tiny = np.full((2, 4), 1e-40, dtype=np.float32)
    tiny[1, 0] = -1e-40
    assert np.isfinite(ad.Cosine().pairwise(tiny, tiny)).all()
    with pytest.raises(ValueError, match="all-zero row"):
        ad.Cosine().pairwise(np.zeros((1, 4), np.float32), tiny)


def test_weights_whose_sum_overflows_are_named():
    with pytest.raises(ValueError, match=r"weights.*sum.*overflow"):
        ad.AnchorSet(np.eye(3), weights=[1e308, 1e308, 1e308])
    w = ad.AnchorSet(np.eye(3), weights=[1e307, 2e307, 1e307]).weights.numpy()
    np.testing.assert_allclose(w, [0.25, 0.5, 0.25], rtol=1e-15)


# ----------------------------------------------------------------- item 14: CSV
@pytest.mark.parametrize("text,safe", [
    ("=HYPERLINK(\"http://x\")", "'=HYPERLINK(\"http://x\")"), ("+1+1", "'+1+1"), ("-2+3", "'-2+3"),
    ("@SUM(A1)", "'@SUM(A1)"), ("\tcmd", "'\tcmd"), ("\rcmd", "'\rcmd"), ("plain", "plain"),
    ("-0.25", "-0.25"), ("+3", "+3"), ("1e-5", "1e-5"), ("", ""), (-0.5, "-0.5"), (7, "7"), (None, ""),
])
def test_csv_cell(text, safe):
    from anchordiv._cli_values import csv_cell

    assert csv_cell(text) == safe


def test_search_csv_neutralises_formula_captions(tmp_path):
    from anchordiv.cli import cli
    from anchordiv.io import embed_collection

    captions = ["=1+1", "+SUM(A1)", "-2+3", "@cmd", "\tx", "plain", "-0.5", "ok"]

    class Fixed:
        name, dim, tau = "fixed", 4, 0.05

        def encode_text(self, texts):
            rng = np.random.default_rng(len(texts))
            return rng.normal(size=(len(texts), 4)).astype(np.float32)

    embed_collection(captions, Fixed(), tmp_path / "c", labels={"note": ["=A1"] * 8}, progress=False)
    out = CliRunner().invoke(cli, ["search", str(tmp_path / "c"), "--model", "cosine", "--query-row", "0",
                                   "-k", "7", "--format", "csv"], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert len(rows) == 7
    dangerous = ("=", "+", "-", "@", "\t", "\r")
    for r in rows:
        for value in r.values():
            if value.startswith(dangerous):
                float(value)  # only numbers may start so
        assert r["note"] == "'=A1"
    assert sorted(r["caption"] for r in rows) == sorted(["'+SUM(A1)", "'-2+3", "'@cmd", "'\tx", "plain", "-0.5", "ok"])
    assert all(np.isfinite(float(r["distance"])) for r in rows)
