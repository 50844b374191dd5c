"""Posterior anchor models (App. D) against independent float64 references."""

import numpy as np
import pytest
import scipy.optimize as so
import torch
from scipy.stats import invwishart, multivariate_normal

import anchordiv as ad
from anchordiv.models.posterior import MatrixBingham, NormalInverseWishart, niw_update

from conftest import unit_rows

TAU = 0.07


def spd(rng, d, scale=1.0):
    A = rng.normal(size=(d, d))
    return scale * (A @ A.T / d + 0.5 * np.eye(d))


def random_niw(rng, d, batch=None):
    shape = () if batch is None else (batch,)
    M = 1 if batch is None else batch
    mean = rng.normal(size=(M, d))
    scale = np.stack([spd(rng, d) for _ in range(M)])
    t = lambda a: torch.as_tensor(a.reshape(shape + a.shape[1:]))
    return NormalInverseWishart(t(rng.uniform(1, 4, size=M)), t(d + 2 + rng.uniform(1, 5, size=M)), t(mean), t(scale))


def reference_niw(k0, v0, m0, P0, X, c):
    """App. D.2 step 3 written out in numpy."""
    N = c.sum()
    xbar = c @ X / N
    S = ((X - xbar) * c[:, None]).T @ (X - xbar)
    dev = xbar - m0
    return k0 + N, v0 + N, (k0 * m0 + N * xbar) / (k0 + N), P0 + S + k0 * N / (k0 + N) * np.outer(dev, dev)


def niw_logpdf(mu, Sigma, p):
    kappa, nu, m, Psi = float(p.kappa), float(p.nu), p.mean.numpy(), p.scale.numpy()
    return invwishart.logpdf(Sigma, df=nu, scale=Psi) + multivariate_normal.logpdf(mu, mean=m, cov=Sigma / kappa)


def projector(components):
    U = np.asarray(components).T
    return U @ U.T


def overlap(A, B):
    """‖UᵀV‖²_F / k for components (k, d) given as rows."""
    return float(np.linalg.norm(np.asarray(A) @ np.asarray(B).T) ** 2 / np.asarray(A).shape[0])


def top_components(C, k):
    vals, vecs = np.linalg.eigh(C)
    return vecs[:, ::-1][:, :k].T


@pytest.fixture
def pair(rng):
    """Broad anchors around one direction, target anchors (9) around another, d = 10."""
    d = 10
    center = rng.normal(size=d)
    broad = unit_rows(rng, 120, d, center, spread=0.6)
    target = unit_rows(rng, 9, d, center + 1.5 * rng.normal(size=d), spread=0.6)
    Q, G = unit_rows(rng, 5, d, center), unit_rows(rng, 8, d, center)
    return broad, target, Q, G


# ------------------------------------------------------------------ NIW (D.2)
@pytest.mark.parametrize("weighted", [False, True])
def test_niw_conjugacy(weighted, rng):
    d, n = 3, 6
    prior = random_niw(rng, d)
    X = rng.normal(size=(n, d)) + 0.5
    c = rng.uniform(0.2, 2.0, size=n) if weighted else np.ones(n)
    post = niw_update(prior, torch.as_tensor(X), torch.as_tensor(c))
    consts = []
    for _ in range(12):
        Sigma = invwishart.rvs(df=d + 4, scale=spd(rng, d), random_state=rng)
        mu = rng.normal(size=d)
        loglik = sum(ci * multivariate_normal.logpdf(x, mean=mu, cov=Sigma) for x, ci in zip(X, c))
        consts.append(niw_logpdf(mu, Sigma, prior) + loglik - niw_logpdf(mu, Sigma, post))
    assert np.ptp(consts) < 1e-8 * max(1.0, np.abs(consts).max()), consts
    ref = reference_niw(float(prior.kappa), float(prior.nu), prior.mean.numpy(), prior.scale.numpy(), X, c)
    for got, want in zip((post.kappa, post.nu, post.mean, post.scale), ref):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)


def test_niw_sequential_equals_batch(rng):
    d = 4
    prior = random_niw(rng, d)
    X1, X2 = torch.as_tensor(rng.normal(size=(5, d))), torch.as_tensor(rng.normal(size=(7, d)) + 1)
    c1, c2 = torch.as_tensor(rng.uniform(0.1, 2, 5)), torch.as_tensor(rng.uniform(0.1, 2, 7))
    seq = niw_update(niw_update(prior, X1, c1), X2, c2)
    batch = niw_update(prior, torch.cat([X1, X2]), torch.cat([c1, c2]))
    for a, b in zip((seq.kappa, seq.nu, seq.mean, seq.scale), (batch.kappa, batch.nu, batch.mean, batch.scale)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-13)


def test_niw_empty_target_is_the_broad_fit_exactly(rng):
    d = 5
    broad = rng.normal(size=(40, d))
    g = ad.Gaussian(tau=TAU).fit(broad)
    prior = NormalInverseWishart.from_estimate(g.mean_, g.covariance_, kappa0=5, nu0=d + 20)
    post = niw_update(prior, torch.zeros(0, d, dtype=torch.float64))
    for a, b in zip((post.kappa, post.nu, post.mean, post.scale), (prior.kappa, prior.nu, prior.mean, prior.scale)):
        assert torch.equal(a, b)
    np.testing.assert_allclose(post.covariance("mean").numpy(), g.covariance_.numpy(), rtol=1e-15, atol=0)
    np.testing.assert_array_equal(post.mean.numpy(), g.mean_.numpy())


def test_niw_large_target_tends_to_target_mle(rng):
    d = 4
    broad = rng.normal(size=(300, d))
    L = np.linalg.cholesky(spd(rng, d, 0.3))
    errors = []
    for n in (50, 5000):
        target = rng.normal(size=(n, d)) @ L.T + 2.0
        adapted = ad.Gaussian(tau=TAU).fit(target, prior=broad)
        mle = ad.Gaussian(tau=TAU).fit(target)
        errors.append((float((adapted.covariance_ - mle.covariance_).abs().max()),
                       float((adapted.mean_ - mle.mean_).abs().max())))
    (cov_small, mean_small), (cov_large, mean_large) = errors
    # the prior weighs ν0 − d − 1 = 19 and κ0 = 5 target anchors: the gap is O(1/n)
    assert cov_large < 2e-2 * float(mle.covariance_.abs().max()) and mean_large < 5e-3
    assert cov_large < cov_small / 20 and mean_large < mean_small / 20


def test_niw_mode_is_the_joint_map(rng):
    d = 3
    p = random_niw(rng, d)
    Psi, nu, m = p.scale.numpy(), float(p.nu), p.mean.numpy()
    mode = p.covariance("mode").numpy()
    np.testing.assert_allclose(mode, Psi / (nu + d + 2), rtol=1e-14)
    best = niw_logpdf(m, mode, p)
    # along Σ = sΨ the joint density peaks at s = 1/(ν + d + 2), not at the marginal IW mode 1/(ν + d + 1)
    res = so.minimize_scalar(lambda s: -niw_logpdf(m, s * Psi, p), bounds=(1e-3, 1.0), method="bounded",
                             options={"xatol": 1e-12})
    assert abs(res.x - 1 / (nu + d + 2)) < 1e-7
    for _ in range(30):
        E = rng.normal(size=(d, d)) * 1e-2
        assert niw_logpdf(m + rng.normal(size=d) * 1e-2, mode + E @ E.T - np.trace(E @ E.T) / d * 0.5 * np.eye(d), p) < best
    adapted = ad.Gaussian(tau=TAU, summary="mode").fit(rng.normal(size=(4, d)), prior=rng.normal(size=(30, d)))
    post = adapted.posterior_
    np.testing.assert_allclose(adapted.covariance_.numpy(), post.scale.numpy() / (float(post.nu) + d + 2), rtol=1e-14)


def test_gaussian_posterior_model_and_weighted_target(pair, rng):
    broad, target, Q, G = pair
    d, n = broad.shape[1], len(target)
    g = ad.Gaussian(tau=TAU).fit(broad)
    w = rng.uniform(0.2, 2, size=n)
    m = ad.Gaussian(tau=TAU).fit(ad.AnchorSet(target, weights=w), prior=g)
    assert m.prior_ is g and float(m.posterior_.kappa) == 5 + n and float(m.posterior_.nu) == d + 20 + n
    Psi0 = 19 * np.cov(broad.T, bias=True)
    ref = reference_niw(5.0, d + 20.0, broad.mean(0), Psi0, target, n * w / w.sum())
    np.testing.assert_allclose(m.mean_.numpy(), ref[2], rtol=1e-12)
    np.testing.assert_allclose(m.covariance_.numpy(), ref[3] / (ref[1] - d - 1), rtol=1e-11, atol=1e-14)
    # uniform weights are the unweighted update; an array prior is fitted with the same parameters
    a = ad.Gaussian(tau=TAU).fit(ad.AnchorSet(target, weights=np.full(n, 3.0)), prior=broad)
    b = ad.Gaussian(tau=TAU).fit(target, prior=ad.AnchorSet(broad))
    np.testing.assert_allclose(a.covariance_.numpy(), b.covariance_.numpy(), rtol=1e-13)
    # closed-form divergence with Σ̂, after refitting an object that held another fit (cache rebuilt)
    m2 = ad.Gaussian(tau=TAU).fit(broad)
    m2.pairwise(Q, G)
    m2.fit(target, prior=g)
    S = m2.covariance_.numpy()
    diff = Q[:, None] - G[None]
    np.testing.assert_allclose(m2.pairwise(Q, G), np.einsum("qgi,ij,qgj->qg", diff, S, diff) / (2 * TAU**2), rtol=1e-9)
    # a single target anchor is a legitimate NIW update (S = 0)
    one = ad.Gaussian(tau=TAU).fit(target[:1], prior=g)
    assert float(one.posterior_.kappa) == 6


# ------------------------------------------------------------ Bingham (D.3, D.4)
def test_bingham_mode_maximises_trace(pair, rng):
    broad, target, _, _ = pair
    m = ad.LatentSpherical(rank=3, tau=TAU).fit(target, prior=broad)
    A = m.posterior_.parameter.numpy()
    U = m.components_.numpy().T
    best = np.trace(U.T @ A @ U)
    np.testing.assert_allclose(best, np.sort(np.linalg.eigvalsh(A))[::-1][:3].sum(), rtol=1e-12)
    for _ in range(200):
        V = np.linalg.qr(rng.normal(size=(A.shape[0], 3)))[0]
        assert np.trace(V.T @ A @ V) <= best + 1e-10
    # A_post = α U_b U_bᵀ + β Cov̂(target), β = 4 α n / tr Cov̂ by default
    C = np.cov(target.T, bias=True)
    assert m.beta_ == pytest.approx(4 * 50 * len(target) / np.trace(C), rel=1e-12)
    np.testing.assert_allclose(A, 50 * projector(m.prior_.components_) + m.beta_ * C, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [ad.LatentGaussian, ad.LatentSpherical])
def test_bingham_beta_zero_or_no_target_returns_broad(cls, pair):
    broad, target, _, _ = pair
    prior = cls(rank=4, tau=TAU).fit(broad)
    B = MatrixBingham.from_subspace(prior.components_, 50.0)
    U, _ = B.update(torch.as_tensor(np.cov(target.T, bias=True)), 0.0).mode(4)
    np.testing.assert_allclose(projector(U), projector(prior.components_), atol=1e-12)
    if cls is ad.LatentSpherical:
        m = cls(rank=4, tau=TAU, beta=0).fit(target, prior=prior)
        np.testing.assert_allclose(projector(m.components_), projector(prior.components_), atol=1e-12)


def test_latent_gaussian_target_subspace_dominates(pair):
    broad, target, _, _ = pair
    k = 4
    for n in (k + 1, len(target)):
        m = ad.LatentGaussian(rank=k, tau=TAU).fit(target[:n], prior=broad)
        assert m.beta_ == pytest.approx(n / 2 * (1e8 - 1 / (1 + 1e-8)), rel=1e-12)
        U_target = top_components(np.cov(target[:n].T, bias=True), k)
        assert overlap(m.components_, U_target) > 1 - 1e-6
    # with fewer than k + 1 anchors the target fills rank(Cov̂) = n − 1 directions, the broad prior the rest
    m = ad.LatentGaussian(rank=k, tau=TAU).fit(target[:3], prior=broad)
    U_target = top_components(np.cov(target[:3].T, bias=True), 2)
    assert overlap(U_target, m.components_) > 1 - 1e-6
    assert overlap(m.components_, m.prior_.components_) > 0.2


def test_latent_spherical_moves_monotonically_toward_target(pair):
    broad, target, _, _ = pair
    k = 3
    prior = ad.LatentSpherical(rank=k, tau=TAU).fit(broad)
    C = np.cov(target.T, bias=True)
    U_target = top_components(C, k)
    to_broad, captured, to_target = [], [], []
    for beta in [0, 1, 10, 30, 100, 300, 1e3, 1e4, 1e7]:
        U = ad.LatentSpherical(rank=k, tau=TAU, beta=beta).fit(target, prior=prior).components_.numpy()
        to_broad.append(overlap(U, prior.components_))
        to_target.append(overlap(U, U_target))
        captured.append(np.trace(U @ C @ U.T))
    assert np.all(np.diff(to_broad) <= 1e-12) and np.all(np.diff(captured) >= -1e-12)
    assert np.all(np.diff(to_target) >= -1e-9)
    assert to_broad[0] > 1 - 1e-12 and to_target[-1] > 1 - 1e-6 and to_target[0] < 0.9


def test_latent_spherical_default_beta_follows_target_budget(rng):
    d, k = 24, 4
    basis = np.linalg.qr(rng.normal(size=(d, d)))[0]
    center = 2 * basis[:, -1]
    broad = unit_rows(rng, 400, d) * 0.3 + center
    broad = broad / np.linalg.norm(broad, axis=1, keepdims=True)
    target_dirs = basis[:, :k]
    target_pool = center + rng.normal(size=(400, k)) @ target_dirs.T * 0.6 + rng.normal(size=(400, d)) * 0.05
    target_pool /= np.linalg.norm(target_pool, axis=1, keepdims=True)
    U_target = top_components(np.cov(target_pool.T, bias=True), k)
    prior = ad.LatentSpherical(rank=k, tau=TAU).fit(broad)
    fits = [ad.LatentSpherical(rank=k, tau=TAU).fit(target_pool[:n], prior=prior) for n in (2, 8, 32, 128)]
    to_target = [overlap(m.components_, U_target) for m in fits]
    to_broad = [overlap(m.components_, prior.components_) for m in fits]
    assert to_broad[0] > 0.7 and to_target[0] < 0.5 and to_target[-1] > 0.95, (to_target, to_broad)
    assert np.all(np.diff(to_target) > 0) and np.all(np.diff(to_broad) < 0), (to_target, to_broad)


# --------------------------------------------------------- Dirichlet–NIW (D.5)
def separated_mixture(rng, d=4, M=3, per=60):
    centers = np.eye(d)[:M] * 40.0  # far enough apart that cross-responsibilities underflow to 0
    broad = np.concatenate([c + rng.normal(size=(per, d)) * 0.5 for c in centers])
    return centers, broad


def test_dirichlet_niw_one_hot_reproduces_per_component_niw(rng):
    d, M = 4, 3
    centers, broad = separated_mixture(rng, d, M)
    prior = ad.GaussianMixture(n_components=M, tau=TAU).fit(broad)
    labels = [0, 0, 1, 1, 1, 2, 0]
    near = [int(np.argmin(np.linalg.norm(prior.means_.numpy() - centers[j], axis=1))) for j in range(M)]
    target = np.stack([centers[j] + rng.normal(size=d) * 0.5 for j in labels])
    m = ad.GaussianMixture(n_components=M, tau=TAU).fit(target, prior=prior)
    nu0 = d + 20.0
    for j in range(M):
        c = np.array([1.0 if lab == j else 0.0 for lab in labels])
        comp = near[j]
        ref = reference_niw(5.0, nu0, prior.means_[comp].numpy(), (nu0 - d - 1) * prior.covariances_[comp].numpy(),
                            target, c)
        np.testing.assert_allclose(m.means_[comp].numpy(), ref[2], rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(m.covariances_[comp].numpy(), ref[3] / (ref[1] - d - 1), rtol=1e-10, atol=1e-12)
        assert float(m.concentration_[comp]) == pytest.approx(1 + c.sum(), rel=1e-12)
    # the batched update with one-hot counts equals M single updates
    batch = random_niw(rng, d, batch=M)
    onehot = torch.nn.functional.one_hot(torch.as_tensor(labels), M).double()
    post = niw_update(batch, torch.as_tensor(target), onehot)
    for j in range(M):
        single = NormalInverseWishart(batch.kappa[j], batch.nu[j], batch.mean[j], batch.scale[j])
        s = niw_update(single, torch.as_tensor(target[np.array(labels) == j]))
        np.testing.assert_allclose(post.scale[j].numpy(), s.scale.numpy(), rtol=1e-12)
        np.testing.assert_allclose(post.mean[j].numpy(), s.mean.numpy(), rtol=1e-12)


def test_dirichlet_niw_zero_mass_component_keeps_its_prior(rng):
    d, M = 4, 3
    centers, broad = separated_mixture(rng, d, M)
    prior = ad.GaussianMixture(n_components=M, tau=TAU).fit(broad)
    target = centers[0] + rng.normal(size=(5, d)) * 0.3
    m = ad.GaussianMixture(n_components=M, tau=TAU).fit(target, prior=prior)
    counts = m.concentration_.numpy() - 1.0
    empty = np.flatnonzero(counts == 0)
    assert len(empty) == M - 1
    for comp in empty:
        np.testing.assert_array_equal(m.means_[comp].numpy(), prior.means_[comp].numpy())
        np.testing.assert_allclose(m.covariances_[comp].numpy(), prior.covariances_[comp].numpy(), rtol=1e-14)
        assert float(m.posterior_.kappa[comp]) == 5 and float(m.posterior_.nu[comp]) == d + 20


@pytest.mark.parametrize("alpha", [1.0, 3.5])
def test_dirichlet_weights_follow_alpha_plus_counts(alpha, pair, rng):
    broad, target, _, _ = pair
    prior = ad.GaussianMixture(n_components=3, tau=TAU, seed=2).fit(broad)
    w = rng.uniform(0.5, 2, size=len(target))
    m = ad.GaussianMixture(n_components=3, tau=TAU, seed=2, dirichlet_alpha=alpha).fit(
        ad.AnchorSet(target, weights=w), prior=prior)
    pi, mus, covs = prior.weights_.numpy(), prior.means_.numpy(), prior.covariances_.numpy()
    logp = np.stack([np.log(pi[j]) + multivariate_normal.logpdf(target, mus[j], covs[j]) for j in range(3)], 1)
    resp = np.exp(logp - logp.max(1, keepdims=True))
    resp /= resp.sum(1, keepdims=True)
    N = (resp * (len(target) * w / w.sum())[:, None]).sum(0)
    np.testing.assert_allclose(m.concentration_.numpy(), alpha + N, rtol=1e-10)
    np.testing.assert_allclose(m.weights_.numpy(), (alpha + N) / (alpha + N).sum(), rtol=1e-10)
    assert m.weights_.sum().item() == pytest.approx(1.0, abs=1e-14)


# ----------------------------------------------------------------- bad input
def test_bad_prior_and_target(pair):
    broad, target, _, _ = pair
    d = broad.shape[1]
    with pytest.raises(ValueError, match="prior is a fitted Gaussian but this model is a LatentGaussian"):
        ad.LatentGaussian(tau=TAU).fit(target, prior=ad.Gaussian(tau=TAU).fit(broad))
    with pytest.raises(ValueError, match="prior is a fitted Cosine"):
        ad.Gaussian(tau=TAU).fit(target, prior=ad.Cosine().fit())
    with pytest.raises(ValueError, match="dimension 10 but the target anchors have dimension 6"):
        ad.Gaussian(tau=TAU).fit(target[:, :6], prior=broad)
    gmm2 = ad.GaussianMixture(n_components=2, tau=TAU).fit(broad)
    with pytest.raises(ValueError, match="dimension"):
        ad.GaussianMixture(n_components=2, tau=TAU).fit(target[:, :6], prior=gmm2)
    with pytest.raises(ad.NotFittedError, match="not fitted"):
        ad.Gaussian(tau=TAU).fit(target, prior=ad.Gaussian(tau=TAU))
    with pytest.raises(ValueError, match="rank=3 differs from the prior's rank=0.95"):
        ad.LatentSpherical(rank=3, tau=TAU).fit(target, prior=ad.LatentSpherical(tau=TAU).fit(broad))
    with pytest.raises(ValueError, match="n_components=3 differs"):
        ad.GaussianMixture(n_components=3, tau=TAU).fit(target, prior=gmm2)
    for nu0 in (d + 1, d, -3):
        for model in (ad.Gaussian(tau=TAU, nu0=nu0), ad.GaussianMixture(n_components=2, tau=TAU, nu0=nu0)):
            with pytest.raises(ValueError, match="nu0"):
                model.fit(target, prior=broad)
    for cls in (ad.LatentGaussian, ad.LatentSpherical):
        with pytest.raises(ValueError, match="at least 2 target anchors"):
            cls(rank=3, tau=TAU).fit(target[:1], prior=broad)
        with pytest.raises(ValueError, match="alpha"):
            cls(rank=3, tau=TAU, alpha=0).fit(target, prior=broad)
    with pytest.raises(ValueError, match="beta"):
        ad.LatentSpherical(rank=3, tau=TAU, beta=-1).fit(target, prior=broad)
    with pytest.raises(ValueError, match="kappa0"):
        ad.Gaussian(tau=TAU, kappa0=0).fit(target, prior=broad)
    with pytest.raises(ValueError, match="summary"):
        ad.Gaussian(tau=TAU, summary="median").fit(target, prior=broad)
    with pytest.raises(ValueError, match="dirichlet_alpha"):
        ad.GaussianMixture(n_components=2, tau=TAU, dirichlet_alpha=-1).fit(target, prior=broad)
    with pytest.raises(ValueError, match="Softmax is nonparametric"):
        ad.Softmax(tau=TAU).fit(target, prior=broad)
    with pytest.raises(ValueError, match="prior must be an AnchorSet"):
        ad.Gaussian(tau=TAU).fit(target, prior="wordnet")


def test_plain_refit_drops_posterior_and_self_prior(pair):
    broad, target, _, _ = pair
    m = ad.LatentGaussian(rank=3, tau=TAU).fit(broad)
    before = m.components_.clone()
    m.fit(target, prior=m)  # the current fit becomes the prior
    assert torch.equal(m.prior_.components_, before) and m.prior_ is not m
    m.to("cpu")
    m.fit(broad)
    assert not any(hasattr(m, a) for a in ("prior_", "posterior_", "beta_"))


# --------------------------------------------- adapted models are ordinary models
ADAPTED = {
    "gaussian": {},
    "gmm": {"n_components": 2, "seed": 1},
    "latent_gaussian": {"rank": 4},
    "latent_spherical": {"rank": 4},
}


@pytest.mark.parametrize("name", list(ADAPTED))
def test_adapted_models_divergences_features_and_search(name, pair):
    broad, target, Q, G = pair
    m = ad.make_model(name, tau=TAU, **ADAPTED[name]).fit(target[:5], prior=broad)
    assert isinstance(m.prior_, type(m))
    for symmetric in (True, False):
        D = m.pairwise(Q, G, symmetric=symmetric)
        direct = np.array([[m.divergence(q[None], g[None])[0] for g in G] for q in Q])
        if symmetric:
            direct = 0.5 * (direct + np.array([[m.divergence(g[None], q[None])[0] for g in G] for q in Q]))
        via = m.query_offsets(Q, symmetric)[:, None] - m.query_features(Q, symmetric) @ m.key_features(G, symmetric).T
        np.testing.assert_allclose(D, direct, rtol=1e-8, atol=1e-9)
        np.testing.assert_allclose(via, direct, rtol=1e-8, atol=1e-9)
        dist, idx = m.search(Q, G, k=3, symmetric=symmetric)
        np.testing.assert_array_equal(idx, np.argsort(D, axis=1, kind="stable")[:, :3])
        np.testing.assert_allclose(dist, np.take_along_axis(D, idx, 1), rtol=1e-12, atol=1e-12)
    assert all(t.dtype == torch.float64 for t in vars(m).values() if isinstance(t, torch.Tensor))
