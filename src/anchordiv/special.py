r"""Bessel-function helpers for the von Mises--Fisher distribution.

The latent spherical anchor model (Kannan, Park, Veitch 2026, App. B.4)
places a von Mises--Fisher distribution on the unit sphere
:math:`S^{k-1} \subset \mathbb{R}^k` with concentration :math:`r = 1/\tau`.
It needs two quantities, for integer dimensions :math:`k` up to several
thousand and concentrations from :math:`10^{-6}` to :math:`10^{6}`:

* the log-normaliser relative to the uniform distribution on the sphere,

  .. math::

      c_k(r) = \log \int_{S^{k-1}} e^{r z^\top e}\,
               \mathrm{Unif}(S^{k-1})(\mathrm{d}z)
             = \log\Gamma(k/2) + (k/2 - 1)\log(2/r)
               + \log I_{k/2-1}(r),

* its derivative, the Bessel ratio (mean resultant length)

  .. math::

      A_k(r) = c_k'(r) = \frac{I_{k/2}(r)}{I_{k/2-1}(r)}.

Here :math:`I_\nu` is the modified Bessel function of the first kind.
Evaluating these through :func:`scipy.special.ive` fails in part of that
range: for a large order and a comparatively small argument
:math:`I_\nu(r)\,e^{-r}` is below the smallest double and ``ive`` returns 0.
This module therefore splits the :math:`(\nu, x)` plane into three regions,
each handled by a method that keeps a relative error near :math:`10^{-14}`
there:

``series``  (:math:`x \le 2\sqrt{\nu + 1}`)
    The ascending series
    :math:`I_\nu(x) = (x/2)^\nu/\Gamma(\nu+1)\,
    \sum_{m\ge0} (x^2/4)^m / (m!\,(\nu+1)_m)`, whose terms are bounded by
    :math:`1/m!` in this region (21 terms are used).
``debye``   (otherwise, if :math:`\nu \ge 20` or :math:`x \ge 10^4`)
    The uniform (Debye) asymptotic expansion in the order,
    :math:`I_\nu(x) \sim e^{\nu\eta}\,(2\pi s)^{-1/2}
    \sum_{j\ge0} u_j(t)/\nu^j` with :math:`s = \sqrt{\nu^2 + x^2}`,
    :math:`t = \nu/s`, :math:`\nu\eta = s + \nu\log(x/(\nu+s))`
    (DLMF 10.41.3), truncated after 20 correction terms; the polynomials
    :math:`u_j` are generated exactly from their recurrence (DLMF 10.41.9).
    Ratios and the log-normaliser are formed from differences of these
    expressions rewritten without cancellation. For a small order and a
    large argument the same expansion is the large-argument (Hankel)
    expansion in powers of :math:`1/s`.
``ive``     (otherwise: :math:`\nu < 20`, :math:`2\sqrt{\nu+1} < x < 10^4`)
    :func:`scipy.special.ive`, which neither underflows nor overflows there.

References
----------
Kannan, Park, Veitch (2026), App. B.4 (latent spherical anchor model).

NIST Digital Library of Mathematical Functions, §10.25 and §10.41.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np
from scipy import special as _sc

__all__ = ["bessel_ratio", "log_bessel_iv", "log_vmf_normalizer"]

#: Orders at or above this use the Debye expansion outside the series region.
_NU_DEBYE = 20.0
#: Arguments at or above this use the Debye expansion for every order (it
#: then reduces to the large-argument expansion; ``ive`` fails beyond ~1e9).
_X_DEBYE = 1.0e4
#: Number of correction terms u_1 .. u_N in the Debye expansion.
_N_DEBYE = 20
#: Highest power m kept in the ascending series.
_M_SERIES = 20

_LOG2 = math.log(2.0)
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

# Stirling series log Gamma(nu+1) - [nu log nu - nu + log(2 pi nu)/2]
# = sum_j B_{2j} / (2j (2j-1) nu^(2j-1)).
_STIRLING = (
    1.0 / 12.0,
    -1.0 / 360.0,
    1.0 / 1260.0,
    -1.0 / 1680.0,
    1.0 / 1188.0,
    -691.0 / 360360.0,
    1.0 / 156.0,
    -3617.0 / 122400.0,
)


def _debye_polynomials(n: int) -> tuple[np.ndarray, ...]:
    r"""Coefficients of the Debye polynomials in the form :math:`u_j(t) = t^j P_j(t^2)`.

    Uses the exact recurrence
    :math:`u_{j+1}(t) = \tfrac12 t^2 (1-t^2) u_j'(t)
    + \tfrac18 \int_0^t (1 - 5 s^2) u_j(s)\,\mathrm{d}s`, :math:`u_0 = 1`.

    Returns
    -------
    tuple of ndarray
        Entry ``j - 1`` holds the coefficients of :math:`P_j`, highest power
        first (the order expected by Horner's rule), for ``j = 1 .. n``.
    """
    u = [Fraction(1)]
    out = []
    for _ in range(n):
        new = [Fraction(0)] * (len(u) + 3)
        for i in range(1, len(u)):
            c = i * u[i] / 2
            new[i + 1] += c
            new[i + 3] -= c
        for i, c in enumerate(u):
            new[i + 1] += c / (8 * (i + 1))
            new[i + 3] -= 5 * c / (8 * (i + 3))
        while new and new[-1] == 0:
            new.pop()
        u = new
        j = len(out) + 1
        coeffs = [float(u[p]) for p in range(j, len(u), 2)]
        out.append(np.array(coeffs[::-1]))
    return tuple(out)


_DEBYE_P = _debye_polynomials(_N_DEBYE)


# ----------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------


def _real_array(value, name: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise TypeError(
            f"{name} must be a real number or an array of real numbers, got dtype {arr.dtype}"
        )
    arr = arr.astype(np.float64, copy=False)
    if np.isnan(arr).any():
        raise ValueError(f"{name} must not be NaN")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite")
    return arr


def _check_dimension(k) -> np.ndarray:
    if isinstance(k, bool) or (isinstance(k, np.ndarray) and k.dtype == bool):
        raise TypeError("k must be an integer >= 1, got a boolean")
    if isinstance(k, numbers.Integral):
        if k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k}")
        return np.asarray(float(k))
    arr = _real_array(k, "k")
    frac = arr != np.floor(arr)
    if frac.any():
        raise ValueError(f"k must be an integer >= 1, got non-integer value(s) {arr[frac][:3]}")
    if (arr < 1).any():
        raise ValueError(f"k must be an integer >= 1, got {arr[arr < 1][:3]}")
    return arr


def _check_nonneg(x, name: str) -> np.ndarray:
    arr = _real_array(x, name)
    if (arr < 0).any():
        raise ValueError(f"{name} must be >= 0, got {arr[arr < 0][:3]}")
    return arr


def _scalar_or_array(out: np.ndarray):
    return out[()] if out.ndim == 0 else out


# ----------------------------------------------------------------------------
# Building blocks (1-d float64 arrays in, 1-d arrays out)
# ----------------------------------------------------------------------------


def _series_tail(nu: np.ndarray, y: np.ndarray) -> np.ndarray:
    r""":math:`\sum_{m=1}^{M} y^m / (m!\,(\nu+1)_m)` for :math:`y = x^2/4`."""
    term = np.ones_like(y)
    total = np.zeros_like(y)
    for m in range(1, _M_SERIES + 1):
        term = term * (y / (m * (nu + m)))
        total += term
    return total


def _debye_tail(t2: np.ndarray, w: np.ndarray) -> np.ndarray:
    r""":math:`\sum_{j=1}^{N} u_j(t)/\nu^j = \sum_j P_j(t^2)\, s^{-j}`, ``w = 1/s``."""
    acc = np.zeros_like(t2)
    for coeffs in reversed(_DEBYE_P):
        p = np.full_like(t2, coeffs[0])
        for c in coeffs[1:]:
            p = p * t2 + c
        acc = (acc + p) * w
    return acc


def _stirling_corr(nu: np.ndarray) -> np.ndarray:
    r"""Stirling remainder of :math:`\log\Gamma(\nu+1)`, for :math:`\nu \ge 20`.

    .. math::

        C(\nu) = \log\Gamma(\nu+1) - \nu\log\nu + \nu - \tfrac12\log(2\pi\nu).
    """
    inv = 1.0 / nu
    inv2 = inv * inv
    acc = np.zeros_like(nu)
    for c in reversed(_STIRLING):
        acc = acc * inv2 + c
    return acc * inv


def _regions(nu: np.ndarray, x: np.ndarray, large_x: bool = True):
    zero = x == 0
    series = ~zero & (x <= 2.0 * np.sqrt(nu + 1.0))
    rest = ~zero & ~series
    use_debye = nu >= _NU_DEBYE
    if large_x:
        use_debye = use_debye | (x >= _X_DEBYE)
    debye = rest & use_debye
    ive = rest & ~debye
    return zero, series, debye, ive


def _log_iv(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    zero, series, debye, ive = _regions(nu, x)

    out[zero] = np.where(nu[zero] == 0, 0.0, np.where(nu[zero] > 0, -np.inf, np.inf))

    if series.any():
        v, z = nu[series], x[series]
        out[series] = (
            v * np.log(0.5 * z) - _sc.gammaln(v + 1.0) + np.log1p(_series_tail(v, 0.25 * z * z))
        )

    if debye.any():
        v, z = nu[debye], x[debye]
        s = np.hypot(v, z)
        out[debye] = (
            s
            + v * np.log(z / (v + s))
            - _HALF_LOG_2PI
            - 0.5 * np.log(s)
            + np.log1p(_debye_tail((v / s) ** 2, 1.0 / s))
        )

    if ive.any():
        v, z = nu[ive], x[ive]
        out[ive] = np.log(_sc.ive(v, z)) + z
    return out


def _ratio(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    r""":math:`I_{\nu+1}(x) / I_\nu(x)`."""
    out = np.empty_like(x)
    zero, series, debye, ive = _regions(nu, x)

    out[zero] = 0.0

    if series.any():
        v, z = nu[series], x[series]
        y = 0.25 * z * z
        out[series] = (
            z / (2.0 * (v + 1.0)) * (1.0 + _series_tail(v + 1.0, y)) / (1.0 + _series_tail(v, y))
        )

    # log I_{v+1} - log I_v from the Debye forms, rearranged so that no large
    # terms cancel:  s1 - s0 = (2v+1)/(s0+s1) =: delta and
    # (v+1) log(x/(v+1+s1)) - v log(x/(v+s0))
    #     = log(x/(v+1+s1)) - v log1p((1+delta)/(v+s0)).
    if debye.any():
        v, z = nu[debye], x[debye]
        s0 = np.hypot(v, z)
        s1 = np.hypot(v + 1.0, z)
        delta = (2.0 * v + 1.0) / (s0 + s1)
        log_a = (
            delta
            + np.log(z / (v + 1.0 + s1))
            - v * np.log1p((1.0 + delta) / (v + s0))
            - 0.5 * np.log1p(delta / s0)
            + np.log1p(_debye_tail(((v + 1.0) / s1) ** 2, 1.0 / s1))
            - np.log1p(_debye_tail((v / s0) ** 2, 1.0 / s0))
        )
        out[debye] = np.exp(log_a)

    if ive.any():
        v, z = nu[ive], x[ive]
        out[ive] = _sc.ive(v + 1.0, z) / _sc.ive(v, z)
    return out


def _log_vmf(nu: np.ndarray, x: np.ndarray) -> np.ndarray:
    r""":math:`\log\Gamma(\nu+1) + \nu\log(2/x) + \log I_\nu(x)` (:math:`\nu = k/2-1`)."""
    out = np.empty_like(x)
    zero, series, debye, other = _regions(nu, x, large_x=False)

    out[zero] = 0.0

    if series.any():
        v, z = nu[series], x[series]
        out[series] = np.log1p(_series_tail(v, 0.25 * z * z))

    # With d = s - v = x^2/(s+v) and the Stirling remainder C(v):
    # c = d - v log1p(d/(2v)) - log1p(d/v)/2 + C(v) + log(sum_j u_j(t)/v^j).
    if debye.any():
        v, z = nu[debye], x[debye]
        s = np.hypot(v, z)
        d = z * (z / (s + v))
        out[debye] = (
            d
            - v * np.log1p(d / (2.0 * v))
            - 0.5 * np.log1p(d / v)
            + _stirling_corr(v)
            + np.log1p(_debye_tail((v / s) ** 2, 1.0 / s))
        )

    # Order below 20 and x > 2 sqrt(v+1): the terms are of moderate size.
    if other.any():
        v, z = nu[other], x[other]
        out[other] = _sc.gammaln(v + 1.0) + v * (_LOG2 - np.log(z)) + _log_iv(v, z)
    return out


def _log_cosh(x: np.ndarray) -> np.ndarray:
    small = x < 1.0
    out = np.empty_like(x)
    xs = x[small]
    out[small] = np.log1p(2.0 * np.sinh(0.5 * xs) ** 2)
    xl = x[~small]
    out[~small] = xl + np.log1p(np.exp(-2.0 * xl)) - _LOG2
    return out


# ----------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------


def log_bessel_iv(v, x):
    r"""Logarithm of the modified Bessel function of the first kind.

    .. math::

        \log I_v(x), \qquad
        I_v(x) = \sum_{m=0}^{\infty} \frac{(x/2)^{2m+v}}{m!\,\Gamma(m+v+1)}.

    The result is finite wherever :math:`\log I_v(x)` is, including where
    :math:`I_v(x)` itself overflows or underflows in double precision
    (e.g. :math:`v = 2047`, :math:`x = 10^{-6}`, or :math:`x = 10^{6}`).
    Used for the von Mises--Fisher normaliser of the latent spherical anchor
    model (Kannan, Park, Veitch 2026, App. B.4).

    Parameters
    ----------
    v : float or array_like
        Real order, :math:`v \ge -1/2`.
    x : float or array_like
        Argument, :math:`x \ge 0`; broadcast against `v`. At :math:`x = 0`
        the limit is returned (0 for :math:`v = 0`, :math:`-\infty` for
        :math:`v > 0`, :math:`+\infty` for :math:`v < 0`).

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`\log I_v(x)`, with the broadcast shape of `v` and `x`.

    Raises
    ------
    ValueError
        If `v` < -1/2, `x` < 0, or either is NaN or infinite.
    TypeError
        If `v` or `x` is not real-valued.

    Examples
    --------
    >>> float(log_bessel_iv(2047.0, 1e-6)) < -40000
    True
    """
    v = _real_array(v, "v")
    if (v < -0.5).any():
        raise ValueError(f"v must be >= -1/2, got {v[v < -0.5][:3]}")
    x = _check_nonneg(x, "x")
    v, x = np.broadcast_arrays(v, x)
    shape = x.shape
    out = _log_iv(v.ravel().copy(), x.ravel().copy())
    return _scalar_or_array(out.reshape(shape))


def bessel_ratio(k, r):
    r"""Bessel ratio :math:`A_k(r)`, the mean resultant length of a vMF law on :math:`S^{k-1}`.

    .. math::

        A_k(r) = \frac{I_{k/2}(r)}{I_{k/2-1}(r)} = \frac{\mathrm{d}}{\mathrm{d}r} c_k(r),

    where :math:`c_k` is :func:`log_vmf_normalizer`. It increases from
    :math:`A_k(r) \approx r/k` as :math:`r \to 0` to 1 as :math:`r \to \infty`;
    for :math:`k = 1`, :math:`A_1(r) = \tanh r`. In the latent spherical
    anchor model (Kannan, Park, Veitch 2026, App. B.4) :math:`r = 1/\tau`
    for a temperature :math:`\tau`.

    Parameters
    ----------
    k : int or array_like of int
        Ambient dimension of the sphere :math:`S^{k-1}`, :math:`k \ge 1`.
    r : float or array_like
        Concentration, :math:`r \ge 0`; broadcast against `k`.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`A_k(r)`, in :math:`(0, 1)` for :math:`r > 0` (up to rounding
        to 1 for very large `r`) and 0 at :math:`r = 0`.

    Raises
    ------
    ValueError
        If `k` is not an integer >= 1, or `r` is negative, NaN or infinite.
    TypeError
        If `k` or `r` is not real-valued.

    Examples
    --------
    >>> round(float(bessel_ratio(3, 2.0)), 12)  # coth(2) - 1/2
    0.537314720728
    """
    k = _check_dimension(k)
    r = _check_nonneg(r, "r")
    k, r = np.broadcast_arrays(k, r)
    shape = r.shape
    kf, rf = k.ravel(), r.ravel().copy()
    out = np.empty_like(rf)
    one = kf == 1
    out[one] = np.tanh(rf[one])
    rest = ~one
    out[rest] = _ratio(0.5 * kf[rest] - 1.0, rf[rest])
    return _scalar_or_array(out.reshape(shape))


def log_vmf_normalizer(k, r):
    r"""Log-normaliser :math:`c_k(r)` of the von Mises--Fisher law on :math:`S^{k-1}`.

    .. math::

        c_k(r) = \log \int_{S^{k-1}} e^{r z^\top e}\,
                 \mathrm{Unif}(S^{k-1})(\mathrm{d}z)
               = \log\Gamma\!\left(\frac{k}{2}\right)
                 + \left(\frac{k}{2} - 1\right)\log\frac{2}{r}
                 + \log I_{k/2-1}(r),

    for any unit vector :math:`e`. It is normalised against the uniform
    distribution, so :math:`c_k(0) = 0`, :math:`c_k(r) \approx r^2/(2k)` for
    small :math:`r`, :math:`c_1(r) = \log\cosh r`, and
    :math:`c_k'(r) = A_k(r)` (:func:`bessel_ratio`). This is the normaliser
    of the latent spherical anchor model (Kannan, Park, Veitch 2026,
    App. B.4), with :math:`r = 1/\tau`.

    Parameters
    ----------
    k : int or array_like of int
        Ambient dimension of the sphere :math:`S^{k-1}`, :math:`k \ge 1`.
    r : float or array_like
        Concentration, :math:`r \ge 0`; broadcast against `k`. ``r = 0``
        returns exactly 0.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        :math:`c_k(r) \ge 0`, finite for all finite `r`.

    Raises
    ------
    ValueError
        If `k` is not an integer >= 1, or `r` is negative, NaN or infinite.
    TypeError
        If `k` or `r` is not real-valued.

    Examples
    --------
    >>> float(log_vmf_normalizer(1024, 0.0))
    0.0
    """
    k = _check_dimension(k)
    r = _check_nonneg(r, "r")
    k, r = np.broadcast_arrays(k, r)
    shape = r.shape
    kf, rf = k.ravel(), r.ravel().copy()
    out = np.empty_like(rf)
    one = kf == 1
    out[one] = _log_cosh(rf[one])
    rest = ~one
    out[rest] = _log_vmf(0.5 * kf[rest] - 1.0, rf[rest])
    return _scalar_or_array(out.reshape(shape))
