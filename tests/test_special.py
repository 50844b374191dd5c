"""Tests for anchordiv.special against high-precision mpmath references."""

import math

import mpmath as mp
import numpy as np
import pytest
from scipy import special as sc

from anchordiv.special import bessel_ratio, log_bessel_iv, log_vmf_normalizer

KS = [1, 2, 3, 5, 16, 128, 512, 1024, 4096]
RS = np.array([1e-6, 1e-3, 0.1, 1.0, 10.0, 100.0, 1000.0, 1e4, 1e5])


def _mp_reference(k, r):
    """(A_k(r), log I_{k/2-1}(r), c_k(r)) at 50 significant digits."""
    with mp.workdps(50):
        nu = mp.mpf(k) / 2 - 1
        x = mp.mpf(float(r))
        i0 = mp.besseli(nu, x)
        i1 = mp.besseli(nu + 1, x)
        log_i0 = mp.log(i0)
        c = mp.loggamma(mp.mpf(k) / 2) + nu * mp.log(2 / x) + log_i0
        return float(i1 / i0), float(log_i0), float(c)


@pytest.fixture(scope="module")
def reference():
    """Reference table over the (k, r) grid, shape (len(KS), len(RS), 3)."""
    return np.array([[_mp_reference(k, r) for r in RS] for k in KS])


def _abs_rel(got, want):
    return np.abs(got - want) / np.maximum(1.0, np.abs(want))


@pytest.mark.parametrize("i", range(len(KS)), ids=[f"k={k}" for k in KS])
def test_bessel_ratio_matches_mpmath(reference, i):
    k = KS[i]
    got = bessel_ratio(k, RS)
    want = reference[i, :, 0]
    assert got.shape == RS.shape
    np.testing.assert_array_less(np.abs(got / want - 1.0), 1e-10)
    assert np.all(got > 0)
    # 1 - tanh(r) < 2**-53 for r > 19, so only k = 1 may round up to 1.0.
    assert np.all(got <= 1) if k == 1 else np.all(got < 1)


@pytest.mark.parametrize("i", range(len(KS)), ids=[f"k={k}" for k in KS])
def test_log_bessel_iv_matches_mpmath(reference, i):
    k = KS[i]
    got = log_bessel_iv(k / 2 - 1, RS)
    np.testing.assert_array_less(_abs_rel(got, reference[i, :, 1]), 1e-8)
    assert np.all(np.isfinite(got))


@pytest.mark.parametrize("i", range(len(KS)), ids=[f"k={k}" for k in KS])
def test_log_vmf_normalizer_matches_mpmath(reference, i):
    k = KS[i]
    got = log_vmf_normalizer(k, RS)
    np.testing.assert_array_less(_abs_rel(got, reference[i, :, 2]), 1e-8)
    assert np.all(np.isfinite(got)) and np.all(got > 0)


@pytest.mark.parametrize(
    "v, x",
    [
        (0.0, 0.5),
        (0.3, 7.0),
        (7.25, 3.0),
        (19.9, 50.0),
        (20.0, 9.0),
        (33.3, 12.0),
        (250.75, 1e-4),
        (1500.5, 2e5),
    ],
)
def test_log_bessel_iv_real_orders(v, x):
    with mp.workdps(50):
        want = float(mp.log(mp.besseli(mp.mpf(v), mp.mpf(x))))
    got = log_bessel_iv(v, x)
    assert abs(got - want) <= 1e-12 * max(1.0, abs(want))


_BOUNDARY_CASES = [
    (k, 2.0 * math.sqrt(k / 2) * f)
    for k in [10, 16, 24, 40, 41, 42, 43]
    for f in [1 - 1e-9, 1 + 1e-9, 1.01, 1.5, 3.0]
] + [(k, r) for k in [2, 3, 16, 41] for r in [9999.999, 1e4]]


@pytest.mark.parametrize("k, r", _BOUNDARY_CASES)
def test_region_boundaries(k, r):
    """Orders and arguments where the evaluation method switches, and just past them."""
    want_a, want_log_i, want_c = _mp_reference(k, r)
    assert abs(bessel_ratio(k, r) / want_a - 1) < 1e-12
    assert abs(log_bessel_iv(k / 2 - 1, r) - want_log_i) < 1e-12 * max(1.0, abs(want_log_i))
    assert abs(log_vmf_normalizer(k, r) - want_c) < 1e-12 * max(1.0, abs(want_c))


def test_k1_is_tanh_and_log_cosh():
    r = np.concatenate([[0.0], np.logspace(-6, 6, 49)])
    np.testing.assert_allclose(bessel_ratio(1, r), np.tanh(r), rtol=1e-15, atol=0)
    with mp.workdps(50):
        want = np.array([float(mp.log(mp.cosh(mp.mpf(float(x))))) for x in r])
    got = log_vmf_normalizer(1, r)
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-14, atol=0)
    assert got[0] == 0.0


def test_zero_concentration_is_exact():
    for k in KS:
        assert log_vmf_normalizer(k, 0.0) == 0.0
        assert bessel_ratio(k, 0.0) == 0.0
        assert log_vmf_normalizer(k, 0) == 0.0
    assert log_bessel_iv(0.0, 0.0) == 0.0
    assert log_bessel_iv(3.0, 0.0) == -np.inf


@pytest.mark.parametrize("k", KS)
def test_small_concentration_limits(k):
    r = 1e-7
    assert bessel_ratio(k, r) == pytest.approx(r / k, rel=1e-12)
    assert log_vmf_normalizer(k, r) == pytest.approx(r * r / (2 * k), rel=1e-9)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 16, 41, 42, 128, 1024, 4096])
def test_derivative_of_normalizer_is_ratio(k):
    r = np.array([1e-3, 0.3, 2.0, 9.5, 30.0, 150.0, 1000.0, 3e4])
    h = 1e-4 * r
    fd = (log_vmf_normalizer(k, r + h) - log_vmf_normalizer(k, r - h)) / (2 * h)
    np.testing.assert_allclose(fd, bessel_ratio(k, r), rtol=1e-7, atol=0)


@pytest.mark.parametrize(
    "k, r", [(4096, 1e-6), (4096, 100.0), (4096, 1000.0), (1024, 1.0), (1024, 100.0), (128, 1e-6)]
)
def test_finite_where_ive_underflows(k, r):
    nu = k / 2 - 1
    assert sc.ive(nu, r) == 0.0
    assert sc.ive(nu + 1, r) == 0.0
    a = bessel_ratio(k, r)
    log_i = log_bessel_iv(nu, r)
    c = log_vmf_normalizer(k, r)
    assert np.isfinite(a) and 0 < a < 1
    assert np.isfinite(log_i) and np.isfinite(c)
    want_a, want_log_i, want_c = _mp_reference(k, r)
    assert a == pytest.approx(want_a, rel=1e-12)
    assert log_i == pytest.approx(want_log_i, rel=1e-12)
    assert c == pytest.approx(want_c, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("k", [2, 3, 16, 64])
def test_beyond_scipy_argument_range(k):
    """ive returns NaN for arguments beyond ~1e9; the results stay accurate and finite."""
    r = 1e10
    assert np.isnan(sc.ive(k / 2 - 1, r))
    want_a, want_log_i, want_c = _mp_reference(k, r)
    assert bessel_ratio(k, r) == pytest.approx(want_a, rel=1e-14)
    assert log_bessel_iv(k / 2 - 1, r) == pytest.approx(want_log_i, rel=1e-14)
    assert log_vmf_normalizer(k, r) == pytest.approx(want_c, rel=1e-14)
    huge = 1e300
    assert 0 < bessel_ratio(k, huge) <= 1
    assert np.isfinite(log_vmf_normalizer(k, huge)) and np.isfinite(log_bessel_iv(k / 2 - 1, huge))


def test_ratio_is_monotone_and_bounded():
    r = np.logspace(-6, 6, 400)
    for k in [2, 3, 16, 128, 4096]:
        a = bessel_ratio(k, r)
        assert np.all(np.diff(a) >= 0)
        assert np.all((a > 0) & (a <= 1))
    a_k = np.array([bessel_ratio(k, 10.0) for k in [2, 3, 16, 128, 4096]])
    assert np.all(np.diff(a_k) < 0)


def test_broadcasting_and_scalars():
    ks = np.array([[1], [3], [512]])
    r = np.array([0.0, 0.5, 50.0, 5e3])
    a = bessel_ratio(ks, r)
    c = log_vmf_normalizer(ks, r)
    assert a.shape == c.shape == (3, 4)
    for i, k in enumerate(ks[:, 0]):
        for j, x in enumerate(r):
            assert a[i, j] == bessel_ratio(int(k), x)
            assert c[i, j] == log_vmf_normalizer(int(k), x)
    assert isinstance(bessel_ratio(3, 2.0), np.float64)
    assert np.ndim(log_vmf_normalizer(3, 2.0)) == 0
    assert log_bessel_iv(np.array([0.5, 1.5]), 2.0).shape == (2,)
    assert bessel_ratio(np.int64(5), [1.0, 2.0]).shape == (2,)
    assert bessel_ratio(5.0, 1.0) == bessel_ratio(5, 1.0)


@pytest.mark.parametrize(
    "func, args, match",
    [
        (bessel_ratio, (0, 1.0), "k"),
        (bessel_ratio, (-2, 1.0), "k"),
        (bessel_ratio, (2.5, 1.0), "k"),
        (bessel_ratio, (float("nan"), 1.0), "k"),
        (bessel_ratio, (3, -1e-3), "r"),
        (bessel_ratio, (3, float("nan")), "r"),
        (bessel_ratio, (3, np.array([1.0, np.nan])), "r"),
        (bessel_ratio, (3, np.inf), "r"),
        (log_vmf_normalizer, (0, 1.0), "k"),
        (log_vmf_normalizer, (np.array([2, 3.5]), 1.0), "k"),
        (log_vmf_normalizer, (3, -1.0), "r"),
        (log_vmf_normalizer, (3, float("nan")), "r"),
        (log_bessel_iv, (-0.75, 1.0), "v"),
        (log_bessel_iv, (float("nan"), 1.0), "v"),
        (log_bessel_iv, (1.0, -1.0), "x"),
        (log_bessel_iv, (1.0, float("nan")), "x"),
    ],
)
def test_bad_input_raises(func, args, match):
    with pytest.raises(ValueError, match=match):
        func(*args)


def test_non_real_input_raises_type_error():
    with pytest.raises(TypeError, match="k"):
        bessel_ratio(True, 1.0)
    with pytest.raises(TypeError, match="r"):
        log_vmf_normalizer(3, 1.0 + 2.0j)
