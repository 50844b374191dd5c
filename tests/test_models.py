"""Every anchor model against independent float64 brute force."""

import math

import numpy as np
import pytest
import scipy.special as sp
import torch

import anchordiv as ad
from anchordiv.models.mixture import em, kmeans_labels, m_step

from conftest import GEOMETRY_PARAMS, unit_rows

from anchordiv.testing import float32_rounding

pytestmark = pytest.mark.numeric

TAU = 0.07
#: The anchor models' parameters of conftest.GEOMETRY_PARAMS, the temperature set per test.
MODEL_PARAMS = {name: {k: v for k, v in p.items() if k != "tau"} for name, p in GEOMETRY_PARAMS.items() if "tau" in p}


def fitted(name, anchors, tau=TAU, **extra):
    return ad.make_model(name, tau=tau, **{**MODEL_PARAMS[name], **extra}).fit(ad.AnchorSet(anchors))


# ---------------------------------------------------------------- references
def reference_cgf(model):
    """κ written from the fitted parameters, independently of the library's code paths."""
    if isinstance(model, ad.Softmax):
        G = torch.as_tensor(model.anchors_, dtype=torch.float64)
        logw = torch.as_tensor(model.log_weights_, dtype=torch.float64)
        return lambda eta: torch.logsumexp(eta @ G.T + logw, dim=-1)
    if isinstance(model, ad.Gaussian):
        mu, S = model.mean_.double(), model.covariance_.double()
        return lambda eta: eta @ mu + 0.5 * ((eta @ S) * eta).sum(-1)
    if isinstance(model, ad.GaussianMixture):
        pi, mus, Ss = model.weights_, model.means_, model.covariances_
        def kappa(eta):
            terms = [torch.log(pi[m]) + eta @ mus[m] + 0.5 * ((eta @ Ss[m]) * eta).sum(-1) for m in range(len(pi))]
            return torch.logsumexp(torch.stack(terms, -1), -1)
        return kappa
    if isinstance(model, ad.LatentGaussian):
        return lambda eta: 0.5 * (eta * eta).sum(-1)
    raise TypeError(model)


def reference_natural_params(model, X):
    if isinstance(model, (ad.Softmax, ad.Gaussian, ad.GaussianMixture)):
        return X / TAU
    P = X @ model.components_.numpy().T
    if isinstance(model, ad.LatentGaussian):
        return P / TAU
    return P / np.linalg.norm(P, axis=1, keepdims=True) / TAU


def softmax_kl_loop(anchors, weights, tau, x, y):
    """KL(P(.|x) || P(.|y)) with explicit loops over anchors."""
    def probs(lam):
        logits = [math.log(w) + float(lam @ g) / tau for g, w in zip(anchors, weights)]
        top = max(logits)
        e = [math.exp(v - top) for v in logits]
        s = sum(e)
        return [v / s for v in e]
    p, q = probs(x), probs(y)
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)


# --------------------------------------------------------------------- tests
def test_softmax_equals_explicit_kl_of_softmaxes(data, rng):
    anchors, Q, G = data
    w = rng.uniform(0.1, 2.0, size=len(anchors))
    m = ad.Softmax(tau=TAU).fit(ad.AnchorSet(anchors, weights=w))
    wn = w / w.sum()
    D = m.pairwise(Q, G, symmetric=False)
    ref = np.array([[softmax_kl_loop(anchors, wn, TAU, q, g) for g in G] for q in Q])
    np.testing.assert_allclose(D, ref, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(m.divergence(Q, G[: len(Q)]), np.diag(ref[:, : len(Q)]), rtol=1e-9, atol=1e-10)


def test_softmax_anchor_batch_sizeing_is_exact(data):
    anchors, Q, G = data
    a = ad.Softmax(tau=0.01, anchor_batch_size=7).fit(anchors)
    b = ad.Softmax(tau=0.01, anchor_batch_size=10_000).fit(anchors)
    np.testing.assert_allclose(a.pairwise(Q, G, symmetric=False), b.pairwise(Q, G, symmetric=False), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["softmax", "gaussian", "gmm", "latent_gaussian"])
def test_bregman_form_with_autograd(name, data, rng):
    anchors, Q, G = data
    m = fitted(name, anchors)
    kappa = reference_cgf(m)
    # cgf and grad_cgf at arbitrary natural parameters
    eta = torch.as_tensor(rng.normal(size=(6, m.natural_dim_)) * 5, dtype=torch.float64).requires_grad_(True)
    k = kappa(eta)
    (grad,) = torch.autograd.grad(k.sum(), eta)
    np.testing.assert_allclose(m.cgf(eta.detach()).numpy(), k.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(m.grad_cgf(eta.detach()).numpy(), grad.numpy(), rtol=1e-9, atol=1e-10)
    # d(x||y) = B_κ(η_y || η_x) from the reference κ and its autograd gradient
    X, Y = Q, G[: len(Q)]
    ex = torch.as_tensor(reference_natural_params(m, X)).requires_grad_(True)
    ey = torch.as_tensor(reference_natural_params(m, Y))
    kx = kappa(ex)
    (gx,) = torch.autograd.grad(kx.sum(), ex)
    ref = (kappa(ey) - kx - (gx * (ey - ex)).sum(1)).detach().numpy()
    np.testing.assert_allclose(m.divergence(X, Y), ref, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(m.natural_params(X), ex.detach().numpy(), rtol=1e-12)


def test_latent_spherical_cgf_by_finite_differences(data, rng):
    anchors, _, _ = data
    m = fitted("latent_spherical", anchors)
    k = m.n_components_
    eta = rng.normal(size=(5, k)) * 3
    h = 1e-5
    fd = np.stack([(m.cgf(eta + h * e) - m.cgf(eta - h * e)) / (2 * h) for e in np.eye(k)], axis=1)
    np.testing.assert_allclose(m.grad_cgf(eta), fd, rtol=1e-6, atol=1e-8)
    # κ against the closed form with scipy's iv where finite
    r = np.linalg.norm(eta, axis=1)
    closed = sp.gammaln(k / 2) + (k / 2 - 1) * np.log(2 / r) + np.log(sp.iv(k / 2 - 1, r))
    np.testing.assert_allclose(m.cgf(eta), closed, rtol=1e-10)


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_latent_spherical_closed_form(tau, data):
    anchors, Q, G = data
    m = fitted("latent_spherical", anchors, tau=tau)
    k, r = m.n_components_, 1 / tau
    A = sp.iv(k / 2, r) / sp.iv(k / 2 - 1, r)
    U = m.components_.numpy().T
    P, R = Q @ U, G @ U
    cos = (P @ R.T) / np.linalg.norm(P, axis=1)[:, None] / np.linalg.norm(R, axis=1)[None, :]
    ref = r * A * (1 - cos)
    np.testing.assert_allclose(m.pairwise(Q, G, symmetric=False), ref, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(m.pairwise(Q, G, symmetric=True), ref, rtol=1e-9, atol=1e-10)


def test_gaussian_and_latent_gaussian_closed_forms(data):
    anchors, Q, G = data
    S = np.cov(anchors.T, bias=True)
    g = fitted("gaussian", anchors)
    np.testing.assert_allclose(g.covariance_.numpy(), S, atol=1e-12)
    np.testing.assert_allclose(g.mean_.numpy(), anchors.mean(0), atol=1e-12)
    diff = Q[:, None, :] - G[None, :, :]
    ref = np.einsum("qgi,ij,qgj->qg", diff, S, diff) / (2 * TAU**2)
    np.testing.assert_allclose(g.pairwise(Q, G), ref, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(g.pairwise(Q, G, symmetric=False), ref, rtol=1e-8, atol=1e-9)

    lg = fitted("latent_gaussian", anchors, rank=0.9)  # a variance fraction
    vals, vecs = np.linalg.eigh(S)
    vals, vecs = vals[::-1], vecs[:, ::-1]
    k = int(np.searchsorted(np.cumsum(vals) / vals.sum(), 0.9) + 1)
    assert lg.n_components_ == k
    U = vecs[:, :k]
    np.testing.assert_allclose(lg.components_.numpy().T @ lg.components_.numpy(), U @ U.T, atol=1e-9)
    proj = np.einsum("qgi,ik->qgk", diff, U)
    np.testing.assert_allclose(lg.pairwise(Q, G), (proj**2).sum(-1) / (2 * TAU**2), rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("name", list(MODEL_PARAMS))
def test_symmetrized_identity_F1(name, data):
    anchors, Q, G = data
    m = fitted(name, anchors)
    sym = m.pairwise(Q, G, symmetric=True)
    both = 0.5 * (m.pairwise(Q, G, symmetric=False) + m.pairwise(G, Q, symmetric=False).T)
    np.testing.assert_allclose(sym, both, rtol=1e-8, atol=1e-9)
    eq, eg = m.natural_params(Q), m.natural_params(G)
    gq, gg = m.grad_cgf(eq), m.grad_cgf(eg)
    loop = np.array([[0.5 * (eq[i] - eg[j]) @ (gq[i] - gg[j]) for j in range(len(G))] for i in range(len(Q))])
    np.testing.assert_allclose(sym, loop, rtol=1e-8, atol=1e-9)
    asym = np.array([[m.divergence(Q[i:i + 1], G[j:j + 1])[0] for j in range(len(G))] for i in range(len(Q))])
    np.testing.assert_allclose(m.pairwise(Q, G, symmetric=False), asym, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("name", list(MODEL_PARAMS) + ["cosine", "iti"])
def test_feature_map_contract(name, symmetric, data):
    anchors, Q, G = data
    m = fitted(name, anchors) if name in MODEL_PARAMS else ad.make_model(name).fit(anchors)
    o = m.query_offsets(Q, symmetric=symmetric)
    phi = m.query_features(Q, symmetric=symmetric)
    psi = m.key_features(G, symmetric=symmetric)
    assert phi.shape[1] == psi.shape[1] and o.shape == (len(Q),)
    via_features = o[:, None] - phi @ psi.T
    direct = np.array([[m.divergence(Q[i:i + 1], G[j:j + 1])[0] for j in range(len(G))] for i in range(len(Q))])
    if symmetric and name in MODEL_PARAMS:
        direct = 0.5 * (direct + np.array([[m.divergence(G[j:j + 1], Q[i:i + 1])[0] for j in range(len(G))] for i in range(len(Q))]))
    np.testing.assert_allclose(via_features, direct, rtol=1e-8, atol=1e-9)
    np.testing.assert_allclose(m.pairwise(Q, G, symmetric=symmetric), direct, rtol=1e-8, atol=1e-9)


@pytest.mark.parametrize("name", list(MODEL_PARAMS))
def test_mixture_endpoints_reduce_to_single_sets(name, rng):
    d = 8
    A = unit_rows(rng, 30, d, center=np.ones(d))
    B = unit_rows(rng, 25, d, center=-np.ones(d))
    Q, G = unit_rows(rng, 4, d), unit_rows(rng, 6, d)
    setA, setB = ad.AnchorSet(A), ad.AnchorSet(B)
    for p, single in [(1.0, setA), (0.0, setB)]:
        mixed = ad.make_model(name, tau=TAU, **MODEL_PARAMS[name]).fit(ad.AnchorSet.mixture([setA, setB], [p, 1 - p]))
        alone = ad.make_model(name, tau=TAU, **MODEL_PARAMS[name]).fit(single)
        np.testing.assert_allclose(mixed.pairwise(Q, G), alone.pairwise(Q, G), rtol=1e-9, atol=1e-10)


def test_theorem3_softmax_converges_to_population_gaussian(rng):
    d, tau = 4, 1.0
    mu = rng.normal(size=d) * 0.3
    cov = 0.05 * np.eye(d)
    lam = unit_rows(rng, 6, d)
    population = ad.Gaussian.from_moments(mu, cov, tau=tau)
    target = population.pairwise(lam, lam, symmetric=False)
    gaps = []
    for n in [100, 1_000, 10_000, 100_000]:
        gap = []
        for seed in range(3):
            samples = np.random.default_rng(seed).multivariate_normal(mu, cov, size=n)
            sm = ad.Softmax(tau=tau).fit(samples)
            gap.append(np.abs(sm.pairwise(lam, lam, symmetric=False) - target).max())
        gaps.append(np.mean(gap))
    assert gaps[-1] < gaps[0] / 5, gaps
    assert gaps[2] < gaps[0] and gaps[3] < gaps[1], gaps


def test_gmm_em_matches_sklearn_from_same_labels(rng):
    from sklearn.mixture import GaussianMixture as SkGMM

    X = np.concatenate([rng.normal(size=(80, 5)) * 0.3 + c for c in (0, 2, -2)])
    labels = torch.as_tensor(rng.integers(0, 3, size=len(X)))
    Xt = torch.as_tensor(X)
    w = torch.full((len(X),), 1 / len(X), dtype=torch.float64)
    resp = torch.nn.functional.one_hot(labels, 3).double()
    w0, mu0, cov0, _ = m_step(Xt, w, resp, 1e-5)
    ours = em(Xt, w, resp, reg_covar=1e-5, tol=1e-3, max_iter=200)
    sk = SkGMM(3, covariance_type="full", reg_covar=1e-5, tol=1e-3, max_iter=200,
               weights_init=w0.numpy(), means_init=mu0.numpy(), precisions_init=np.linalg.inv(cov0.numpy())).fit(X)
    np.testing.assert_allclose(ours[0].numpy(), sk.weights_, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(ours[1].numpy(), sk.means_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(ours[2].numpy(), sk.covariances_, rtol=1e-6, atol=1e-9)
    assert ours[3] == sk.n_iter_
    assert abs(ours[5] - sk.lower_bound_) < 1e-8

    # the library's fit equals sklearn started from the library's k-means labels
    model = ad.GaussianMixture(n_components=3, seed=4, tau=TAU).fit(X)
    lab = kmeans_labels(Xt, w, 3, seed=4)
    w0, mu0, cov0, _ = m_step(Xt, w, torch.nn.functional.one_hot(lab, 3).double(), 1e-5)
    sk = SkGMM(3, reg_covar=1e-5, tol=1e-3, max_iter=200, weights_init=w0.numpy(), means_init=mu0.numpy(),
               precisions_init=np.linalg.inv(cov0.numpy())).fit(X)
    np.testing.assert_allclose(model.means_.numpy(), sk.means_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(model.covariances_.numpy(), sk.covariances_, rtol=1e-6, atol=1e-9)


def test_gmm_is_deterministic_for_a_seed(data):
    anchors, Q, G = data
    a, b = fitted("gmm", anchors), fitted("gmm", anchors)
    np.testing.assert_array_equal(a.pairwise(Q, G), b.pairwise(Q, G))
    assert a.converged_ and a.n_iter_ <= 200


@pytest.mark.parametrize("name", list(MODEL_PARAMS) + ["cosine", "iti"])
def test_numpy_and_torch_agree_and_keep_kind(name, data):
    anchors, Q, G = data
    m = fitted(name, anchors) if name in MODEL_PARAMS else ad.make_model(name).fit(anchors)
    out_np = m.pairwise(Q, G)
    out_t = m.pairwise(torch.as_tensor(Q), torch.as_tensor(G))
    assert isinstance(out_np, np.ndarray) and isinstance(out_t, torch.Tensor)
    assert out_np.dtype == np.float64 and out_t.dtype == torch.float64
    np.testing.assert_array_equal(out_np, out_t.numpy())
    out32 = m.pairwise(Q.astype(np.float32), G.astype(np.float32))
    assert out32.dtype == np.float32
    t32 = m.divergence(torch.as_tensor(Q, dtype=torch.float32), torch.as_tensor(G[: len(Q)], dtype=torch.float32))
    assert t32.dtype == torch.float32


@pytest.mark.parametrize("name", list(MODEL_PARAMS))
@pytest.mark.parametrize("symmetric", [True, False])
def test_float32_agrees_with_float64(name, symmetric, rng):
    """float32 divergences are the float64 ones of the same (float32-rounded) inputs up to the
    float32 rounding of the terms they are computed from (anchordiv.testing.float32_rounding)."""
    d, tau = 64, 0.01
    center = rng.normal(size=d) * 2
    anchors, Q, G = unit_rows(rng, 300, d, center), unit_rows(rng, 20, d, center), unit_rows(rng, 40, d, center)
    m = ad.make_model(name, tau=tau, **MODEL_PARAMS[name]).fit(anchors)
    Q32, G32 = Q.astype(np.float32), G.astype(np.float32)
    d64 = m.pairwise(Q32.astype(np.float64), G32.astype(np.float64), symmetric=symmetric)
    d32 = m.pairwise(Q32, G32, symmetric=symmetric)
    tol = float32_rounding(m, Q32, G32, symmetric=symmetric)
    err = np.abs(d32 - d64).max(1)
    assert (err <= tol).all(), (err / tol).max()
    assert np.median(tol / np.abs(d64).max(1)) < 1e-2  # the bound is tighter than the divergences it bounds


def test_float32_calls_convert_a_fitted_map_once_and_follow_its_changes(rng):
    """float32 inputs use a float32 copy of the float64 fitted map, made once per version of the
    map: the values of converting on every call, and never stale once the map changes."""
    from anchordiv._backend import in_dtype

    d = 16
    anchors, Q = unit_rows(rng, 100, d), unit_rows(rng, 7, d).astype(np.float32)
    m = ad.Gaussian(tau=TAU).fit(anchors)
    q = torch.from_numpy(Q)
    assert m.embedding_map_.dtype == torch.float64
    copy = in_dtype(m.embedding_map_, torch.float32)
    assert in_dtype(m.embedding_map_, torch.float32) is copy and torch.equal(copy, m.embedding_map_.float())
    def check():  # φ(q) = [2 z, −1], z = q L with the map rounded to float32: float64 truth, GEMM rounding
        got = m._query_terms(q, True)[1]
        L32 = m.embedding_map_.float().double()
        z = q.double() @ L32
        tol = 2 * 4 * (d + 2) * 2.0 ** -24 * (q.double().abs() @ L32.abs())
        assert got.dtype == torch.float32 and (got[:, -1] == -1).all()
        assert ((got[:, :-1].double() - 2 * z).abs() <= tol).all()
    check()
    m.embedding_map_.mul_(2.0)  # an in-place change: a new version of the same tensor
    check()
    assert in_dtype(m.embedding_map_, torch.float32) is not copy
    m.fit(unit_rows(rng, 100, d) * -1)  # refitting replaces the tensor
    check()
    D = m.pairwise(Q, Q[::-1].copy())
    ref = m.pairwise(Q.astype(np.float64), Q[::-1].astype(np.float64))
    assert (np.abs(D - ref).max(1) <= float32_rounding(m, Q, Q[::-1].copy())).all()


@pytest.mark.parametrize("name", list(MODEL_PARAMS))
def test_stable_at_tau_1e_3(name, rng):
    d = 32
    center = rng.normal(size=d)
    anchors, Q = unit_rows(rng, 200, d, center), unit_rows(rng, 10, d, center)
    m = ad.make_model(name, tau=1e-3, **MODEL_PARAMS[name]).fit(anchors)
    for dtype in (np.float32, np.float64):
        for sym in (True, False):
            D = m.pairwise(Q.astype(dtype), Q.astype(dtype), symmetric=sym)
            assert np.isfinite(D).all()
            assert np.abs(np.diag(D)).max() <= 1e-6 * max(1.0, np.abs(D).max()) * (1e3 if dtype == np.float32 else 1)
        assert np.isfinite(m.divergence(Q, Q[::-1])).all()
        assert (m.divergence(Q, Q[::-1]) >= -1e-6 * np.abs(m.divergence(Q, Q[::-1])).max()).all()


def test_logit_scale_equals_inverse_tau(data):
    anchors, Q, G = data
    a = ad.Softmax(tau=0.02).fit(anchors)
    b = ad.Softmax(logit_scale=50.0).fit(anchors)
    np.testing.assert_allclose(a.pairwise(Q, G), b.pairwise(Q, G), rtol=1e-12)


def test_rank_float_picks_smallest_k(rng):
    anchors = unit_rows(rng, 100, 10)
    S = np.cov(anchors.T, bias=True)
    vals = np.sort(np.linalg.eigvalsh(S))[::-1]
    ratio = np.cumsum(vals) / vals.sum()
    for frac in [0.3, 0.5, 0.95, 1.0]:
        k = ad.LatentGaussian(rank=frac, tau=1).fit(anchors).n_components_
        assert ratio[k - 1] >= frac - 1e-9 and (k == 1 or ratio[k - 2] < frac)
    assert ad.LatentGaussian(rank=4, tau=1).fit(anchors).components_.shape == (4, 10)


# ----------------------------------------------------------------- bad input
@pytest.mark.parametrize("name", list(MODEL_PARAMS))
def test_bad_input_errors(name, data):
    anchors, Q, G = data
    m = ad.make_model(name, tau=TAU, **MODEL_PARAMS[name])
    with pytest.raises(ad.NotFittedError, match="fit"):
        m.pairwise(Q, G)
    m.fit(anchors)
    with pytest.raises(ValueError, match="dimension"):
        m.pairwise(Q[:, :5], G)
    with pytest.raises(ValueError, match="dimension"):
        m.divergence(Q, G[: len(Q), :5])
    bad = Q.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        m.pairwise(bad, G)
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match="NaN or inf"):
        m.divergence(bad, Q)
    with pytest.raises(ValueError, match="rows"):
        m.divergence(Q, G)
    with pytest.raises(ValueError, match="2-D"):
        m.pairwise(Q[0], G)


@pytest.mark.parametrize("kwargs", [dict(tau=0), dict(tau=-1), dict(logit_scale=0), dict(), dict(tau=1, logit_scale=1), dict(tau=float("nan"))])
def test_bad_temperature(kwargs, data):
    with pytest.raises(ValueError, match="tau|logit_scale"):
        ad.Softmax(**kwargs).fit(data[0])


def test_too_few_anchors_and_components(data):
    anchors = data[0]
    with pytest.raises(ValueError, match="n_components=61 exceeds"):
        ad.GaussianMixture(n_components=61, tau=1).fit(anchors)
    with pytest.raises(ValueError, match="at least 2 anchors"):
        ad.Gaussian(tau=1).fit(anchors[:1])
    with pytest.raises(ValueError, match="zero variance"):
        ad.LatentGaussian(tau=1).fit(np.repeat(anchors[:1], 3, axis=0))


@pytest.mark.parametrize("rank", [0, -1, 13, 0.0, 1.5, True, "all"])
def test_rank_out_of_range(rank, data):
    with pytest.raises(ValueError, match="rank"):
        ad.LatentSpherical(rank=rank, tau=1).fit(data[0])


def test_latent_spherical_zero_projection(data):
    anchors, Q, _ = data
    m = ad.LatentSpherical(rank=3, tau=1).fit(anchors)
    U = m.components_.numpy()
    orth = np.linalg.svd(U, full_matrices=True)[2][-1]  # a direction orthogonal to the subspace
    X = np.vstack([Q[:2], orth])
    with pytest.raises(ValueError, match="project to zero"):
        m.pairwise(X, Q)


def test_unknown_model_name():
    with pytest.raises(ValueError, match="Unknown model 'kde'"):
        ad.make_model("kde")
    with pytest.raises(ValueError, match="Bad parameters"):
        ad.make_model("softmax", bandwidth=2)


@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_attention_path_equals_streaming(weighted, rng):
    from anchordiv.models.softmax import attention_grad

    d = 32
    anchors = unit_rows(rng, 500, d, rng.normal(size=d)).astype(np.float32)
    w = rng.uniform(0.2, 1.0, size=500) if weighted else None
    m = ad.Softmax(tau=0.01, anchor_batch_size=64).fit(ad.AnchorSet(anchors, weights=w))
    eta = torch.as_tensor(unit_rows(rng, 40, d), dtype=torch.float32) / 0.01
    fused = attention_grad(eta, m.anchors_, m.log_weights_, uniform=not weighted)
    streamed = m._cgf_and_grad(eta)[1]
    np.testing.assert_allclose(fused.numpy(), streamed.numpy(), atol=2e-5)


def test_streamed_covariance_matches_numpy(rng):
    from anchordiv.linalg import weighted_mean_cov

    X = unit_rows(rng, 103, 9, center=np.ones(9))
    w = rng.uniform(0.1, 1, size=103)
    w /= w.sum()
    mean, cov = weighted_mean_cov(torch.as_tensor(X), torch.as_tensor(w), chunk=7)
    ref_mean = w @ X
    ref_cov = ((X - ref_mean) * w[:, None]).T @ (X - ref_mean)
    np.testing.assert_allclose(mean.numpy(), ref_mean, atol=1e-14)
    np.testing.assert_allclose(cov.numpy(), ref_cov, atol=1e-14)
    # float32 anchors: float32 GEMMs accumulated in float64
    mean32, cov32 = weighted_mean_cov(torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(w), chunk=7)
    assert mean32.dtype == torch.float64
    np.testing.assert_allclose(cov32.numpy(), ref_cov, atol=1e-6 * np.abs(ref_cov).max())


def test_symmetric_eigh_leaves_thread_counts_alone():
    import threading

    from anchordiv.linalg import symmetric_eigh

    rng = np.random.default_rng(0)
    A = rng.normal(size=(40, 40))
    A = torch.as_tensor(A @ A.T)
    before = torch.get_num_threads()
    seen = []
    worker = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    values, vectors = symmetric_eigh(A)
    worker.start()
    worker.join()
    assert torch.get_num_threads() == before and seen == [before]
    np.testing.assert_allclose((vectors * values) @ vectors.T, A.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(values.numpy(), np.linalg.eigvalsh(A.numpy()), rtol=1e-10)


@pytest.mark.parametrize("cls", [ad.Gaussian, ad.GaussianMixture, ad.LatentGaussian, ad.LatentSpherical, ad.Softmax])
def test_constructor_parameters_are_keyword_only(cls):
    with pytest.raises(TypeError):
        cls(0.01)


def test_gaussian_from_moments_equals_the_fit_of_those_moments(rng):
    X = unit_rows(rng, 50, 6)
    fitted = ad.Gaussian(tau=0.1).fit(X)
    direct = ad.Gaussian.from_moments(fitted.mean_, fitted.covariance_, tau=0.1)
    Q = unit_rows(rng, 4, 6)
    np.testing.assert_array_equal(direct.pairwise(Q, Q), fitted.pairwise(Q, Q))
    with pytest.raises(ValueError, match="positive semi-definite"):
        ad.Gaussian.from_moments(np.zeros(2), [[1.0, 0.0], [0.0, -1.0]], tau=0.1)
    with pytest.raises(ValueError, match=r"mean must be \(d,\)"):
        ad.Gaussian.from_moments(np.zeros(3), np.eye(2), tau=0.1)
