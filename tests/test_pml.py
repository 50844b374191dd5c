"""anchordiv.integrations.pml: exact search as pytorch-metric-learning's knn_func."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv import metrics as M

pml_acc = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
pml_inf = pytest.importorskip("pytorch_metric_learning.utils.inference")
pml_dist = pytest.importorskip("pytorch_metric_learning.distances")

CPU = torch.device("cpu")
INCLUDE = ("precision_at_1", "r_precision", "mean_average_precision_at_r",
           "mean_average_precision", "mean_reciprocal_rank")


def _clustered(n_per_class=20, n_classes=6, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, dim, generator=g)
    labels = torch.arange(n_classes).repeat_interleave(n_per_class)
    x = centres[labels] + 0.9 * torch.randn(len(labels), dim, generator=g)
    perm = torch.randperm(len(labels), generator=g)
    x, labels = x[perm], labels[perm]
    return x / x.norm(dim=1, keepdim=True), labels


def _calc(knn=None, k=None):
    return pml_acc.AccuracyCalculator(include=INCLUDE, k=k, device=CPU, knn_func=knn)


def _assert_same(a, b, tol=1e-6):  # pml computes MRR in float32
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=tol), key


@pytest.fixture(scope="module")
def data():
    """float64 embeddings: this data has pairs whose divergences differ by less than float32 can
    resolve, one relevant and one not, so float32 rankings (and the metrics) could differ by CPU."""
    x, y = _clustered()
    return x.double(), y


# --------------------------------------------------------------------------- #
# Cosine: the same numbers as pml's own knn
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("k", [None, "max_bin_count", 5])
def test_cosine_matches_pml_default_knn(data, k):
    x, y = data
    ours = _calc(ad.integrations.pml.knn_func(ad.Cosine()), k)
    # (pml's default FaissKNN searches in float32, whose order of near ties depends on the CPU)
    custom = _calc(pml_inf.CustomKNN(pml_dist.CosineSimilarity()), k)
    q, yq = x[:40], y[:40]
    g, yg = x[40:], y[40:]
    cases = [
        ((x, y), {}),                                                   # reference = query
        ((q, yq, x, y), {"ref_includes_query": True}),                  # query subset of reference
        ((q, yq, g, yg), {"ref_includes_query": False}),                # disjoint sets
    ]
    for args, kw in cases:
        got = ours.get_accuracy(*args, **kw)
        _assert_same(got, custom.get_accuracy(*args, **kw))


def test_cosine_knn_outputs_match_custom_knn(data):
    x, _ = data
    ours = ad.integrations.pml.knn_func(ad.Cosine())
    theirs = pml_inf.CustomKNN(pml_dist.CosineSimilarity())
    for q, ref, inc in ((x[:30], x, True), (x, x, True), (x[:30], x[30:], False)):
        d, i = ours(q, 7, ref, inc)
        s, j = theirs(q, 7, ref, inc)
        assert i.dtype == torch.int64 and i.shape == (len(q), 7) and d.shape == (len(q), 7)
        torch.testing.assert_close(i, j)
        torch.testing.assert_close(d, 1 - s, atol=1e-5, rtol=0)  # cosine distance, ascending
        if inc:
            assert not (i == torch.arange(len(q))[:, None]).any()  # no self-match


def test_self_duplicate_is_kept_like_pml(data):
    # A duplicate of a query (distance 0) is another item: pml keeps it, so do we.
    x, y = data
    ref = torch.cat([x[:5], x[:1]])  # row 5 duplicates row 0
    d, i = ad.integrations.pml.knn_func(ad.Cosine())(x[:5], 2, ref, True)
    _, j = pml_inf.CustomKNN(pml_dist.CosineSimilarity())(x[:5], 2, ref, True)
    assert i[0, 0].item() == 5 and j[0, 0].item() == 5
    assert d[0, 0].item() == pytest.approx(0.0, abs=1e-6)


# --------------------------------------------------------------------------- #
# An anchor model: against a brute-force computation
# --------------------------------------------------------------------------- #
def _brute_distances(model, q, g):
    """½[d(q‖g) + d(g‖q)] for every pair, from model.divergence on paired rows."""
    nq, ng = len(q), len(g)
    qq = q.repeat_interleave(ng, dim=0)
    gg = g.repeat(nq, 1)
    return (0.5 * (model.divergence(qq, gg) + model.divergence(gg, qq))).reshape(nq, ng)


def _brute_metrics(dist, yq, yg, self_rows):
    """pml's five accuracies from a full distance matrix, by loops."""
    p1, rp, mapr, ap, rr = [], [], [], [], []
    for i in range(len(yq)):
        order = [j for j in np.argsort(dist[i], kind="stable") if j != self_rows[i]]
        rel = (yg[order] == yq[i]).astype(float)
        n_rel = int(rel.sum())
        prec = np.cumsum(rel) / np.arange(1, len(rel) + 1)
        p1.append(rel[0])
        rp.append(rel[:n_rel].sum() / n_rel)
        mapr.append((prec[:n_rel] * rel[:n_rel]).sum() / n_rel)
        ap.append((prec * rel).sum() / n_rel)
        rr.append(1.0 / (np.flatnonzero(rel)[0] + 1))
    return {"precision_at_1": np.mean(p1), "r_precision": np.mean(rp),
            "mean_average_precision_at_r": np.mean(mapr), "mean_average_precision": np.mean(ap),
            "mean_reciprocal_rank": np.mean(rr)}


@pytest.fixture(scope="module")
def softmax(data):
    anchors, _ = _clustered(n_per_class=6, n_classes=6, dim=16, seed=1)
    return ad.Softmax(tau=0.1).fit(anchors)


@pytest.mark.parametrize("n_query", [120, 50])
def test_anchor_model_matches_brute_force(data, softmax, n_query):
    x, y = data
    q, yq = x[:n_query], y[:n_query]
    dist = _brute_distances(softmax, q, x).numpy()
    expected = _brute_metrics(dist, yq.numpy(), y.numpy(), self_rows=np.arange(n_query))
    got = _calc(ad.integrations.pml.knn_func(softmax)).get_accuracy(q, yq, x, y, ref_includes_query=True)
    _assert_same(got, expected)
    # the knn itself: the brute-force top-k without the query's own row
    d, i = ad.integrations.pml.knn_func(softmax)(q, 6, x, True)
    masked = dist.copy()
    masked[np.arange(n_query), np.arange(n_query)] = np.inf
    top = np.argsort(masked, axis=1, kind="stable")[:, :6]
    np.testing.assert_array_equal(i.numpy(), top)
    np.testing.assert_allclose(d.numpy(), np.take_along_axis(masked, top, 1), atol=1e-5)


def test_anchor_model_disjoint_sets_and_asymmetric(data, softmax):
    x, y = data
    q, yq, g, yg = x[:30], y[:30], x[30:], y[30:]
    dist = _brute_distances(softmax, q, g).numpy()
    expected = _brute_metrics(dist, yq.numpy(), yg.numpy(), self_rows=[-1] * 30)
    got = _calc(ad.integrations.pml.knn_func(softmax)).get_accuracy(q, yq, g, yg)
    _assert_same(got, expected)
    # symmetric=False ranks by d(q‖g)
    d, i = ad.integrations.pml.knn_func(softmax, symmetric=False)(q, 4, g)
    ref = softmax.search(q, g, 4, symmetric=False)
    torch.testing.assert_close(i, ref[1])
    torch.testing.assert_close(d, ref[0])


def test_pml_numbers_equal_anchordiv_metrics(data, softmax):
    # A second reference for R-precision, mAP@R, MRR and AP: pml's AccuracyCalculator.
    x, y = data
    got = _calc(ad.integrations.pml.knn_func(softmax)).get_accuracy(x, y)
    dist = softmax.pairwise(x, x).numpy()
    rel = M.relevance_from_labels(y.numpy(), y.numpy())
    ours = {
        "precision_at_1": M.precision_at_k(dist, rel, 1, exclude_self=True),
        "r_precision": M.r_precision(dist, rel, exclude_self=True),
        "mean_average_precision_at_r": M.map_at_r(dist, rel, exclude_self=True),
        "mean_average_precision": M.average_precision(dist, rel, exclude_self=True),
        "mean_reciprocal_rank": M.reciprocal_rank(dist, rel, exclude_self=True),
    }
    _assert_same(got, {k: float(np.mean(v)) for k, v in ours.items()}, tol=1e-6)


def test_errors_and_repr(softmax):
    with pytest.raises(TypeError, match="search"):
        ad.integrations.pml.knn_func(object())
    knn = ad.integrations.pml.knn_func(softmax)
    with pytest.raises(ValueError, match="first rows"):
        knn(torch.zeros(5, 16), 1, torch.zeros(3, 16), True)
    assert "Softmax" in repr(knn)
    # reference=None searches the queries among themselves, without self-matches
    x, _ = _clustered(n_per_class=3, n_classes=2)
    _, i = knn(x, 2)
    assert not (i == torch.arange(len(x))[:, None]).any()
