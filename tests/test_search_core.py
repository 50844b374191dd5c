"""The one exact top-k primitive (anchordiv.exact) against float64 brute force."""

import importlib.util

import numpy as np
import pytest
import torch

import anchordiv as ad
import anchordiv.exact as S

from conftest import unit_rows

from anchordiv.testing import assert_topk_up_to_rounding

pytestmark = pytest.mark.numeric


def brute_topk(D, k, exclude=None):
    """k smallest per row ordered by (distance, index), skipping excluded columns."""
    out_d, out_i = [], []
    for r, row in enumerate(D):
        skip = set() if exclude is None else {int(e) for e in np.atleast_1d(exclude[r]) if e >= 0}
        cand = sorted((float(v), j) for j, v in enumerate(row) if j not in skip)[:k]
        out_d.append([c[0] for c in cand])
        out_i.append([c[1] for c in cand])
    return np.array(out_d), np.array(out_i)


@pytest.fixture(scope="module")
def tied():
    """Integer-valued features: many exact ties, also at the k-th place."""
    rng = np.random.default_rng(5)
    phi = torch.from_numpy(rng.integers(-2, 3, size=(23, 6)).astype(np.float64))
    psi = torch.from_numpy(rng.integers(-2, 3, size=(101, 6)).astype(np.float64))
    offsets = torch.from_numpy(rng.integers(0, 4, size=23).astype(np.float64))
    D = (offsets[:, None] - phi @ psi.T).numpy()
    return offsets, phi, psi, D


@pytest.fixture(params=["python", "kernels"])
def small_result(request, monkeypatch):
    """Small results resolved in Python (the default), or by the tensor path used for large ones."""
    if request.param == "kernels":
        monkeypatch.setattr(S, "SMALL_RESULT", 0)
    return request.param


@pytest.mark.parametrize("budget", [1, 700, 5000, S.DEFAULT_MEMORY_BUDGET])
@pytest.mark.parametrize("k", [1, 4, 17, 101])
def test_knn_equals_brute_force_with_ties(tied, budget, k, small_result):
    offsets, phi, psi, D = tied
    assert len(np.unique(D)) < D.size / 4  # ties everywhere
    d, i = S.knn(offsets, phi, psi, k, memory_budget=budget)
    ref_d, ref_i = brute_topk(D, k)
    np.testing.assert_array_equal(i.numpy(), ref_i)
    np.testing.assert_array_equal(d.numpy(), ref_d)


@pytest.mark.parametrize("n_q", [3, 120])
def test_one_block_knn_orders_float32_ties_by_index(n_q, small_result):
    """All keys in one block: scores that tie, and distinct scores whose sums o − s round to one
    float32, both come back ordered by (distance, lower index)."""
    rng = np.random.default_rng(11)
    base = rng.uniform(0.2, 0.9, size=40).astype(np.float32)
    up = np.nextafter(base, np.float32(1))  # scores above the base's whose o − s rounds onto the base's sum
    # rounding ties before and after their base's column, and exact duplicates at higher columns
    values = np.concatenate([up[:10], base, base[:10], up[10:20]])
    psi = torch.from_numpy(values[:, None])
    phi = torch.from_numpy(rng.choice([0.5, 1.0, 2.0], size=(n_q, 1)).astype(np.float32))
    offsets = torch.from_numpy(rng.choice([1.0, 8.0, 64.0], size=n_q).astype(np.float32))
    scores = phi.numpy() * values[None, :]  # float32, exactly what the GEMM gives for one column
    D = offsets.numpy()[:, None] - scores
    rounded_together = [len(np.unique(D[r])) < len(np.unique(scores[r])) for r in range(n_q)]
    assert any(rounded_together) and (np.diff(np.sort(scores, 1), axis=1) == 0).any()
    for k in (1, 5, 12, 59):
        d, i = S.knn(offsets, phi, psi, k)
        order = np.lexsort((np.broadcast_to(np.arange(D.shape[1]), D.shape), D), axis=1)[:, :k]
        np.testing.assert_array_equal(i.numpy(), order)
        np.testing.assert_array_equal(d.numpy(), np.take_along_axis(D, order, 1))


def test_knn_streams_blocks_and_excludes_pairs(tied):
    offsets, phi, psi, D = tied
    rng = np.random.default_rng(1)
    exclude = rng.integers(-1, psi.shape[0], size=(phi.shape[0], 3))
    exclude[0] = [5, 5, -1]  # a repeated index and an empty slot
    blocks = (psi[s:s + 13] for s in range(0, psi.shape[0], 13))  # a one-pass iterator
    d, i = S.knn(offsets, phi, blocks, 9, n_keys=psi.shape[0], exclude=torch.from_numpy(exclude),
                 memory_budget=2000, keys_given=False)
    ref_d, ref_i = brute_topk(D, 9, exclude)
    np.testing.assert_array_equal(i.numpy(), ref_i)
    np.testing.assert_array_equal(d.numpy(), ref_d)
    assert not any(int(e) in row for row, ex in zip(i.numpy(), exclude) for e in ex if e >= 0)


def test_smallest_k_breaks_ties_by_lower_index(small_result):
    scores = torch.tensor([[3.0, 1.0, 1.0, 2.0, 1.0, 0.0]])
    for k, want in ((3, [5, 1, 2]), (2, [5, 1]), (5, [5, 1, 2, 4, 3])):  # column positions, ties at the k-th
        d, i = S.smallest_k(scores, None, k)
        assert i.tolist() == [want] and d.tolist() == [scores[0, want].tolist()]
        d, i = S.largest_k(scores, None, k)
        want_large = sorted(range(6), key=lambda j: (-float(scores[0, j]), j))[:k]
        assert i.tolist() == [want_large] and d.tolist() == [scores[0, want_large].tolist()]
    index = torch.tensor([10, 4, 7, 2, 1, 9])
    d, i = S.smallest_k(scores, index, 3)
    assert d.tolist() == [[0.0, 1.0, 1.0]] and i.tolist() == [[9, 1, 4]]
    d, i = S.smallest_k(scores, index, 6)  # k = n: a full ordered sort
    assert i.tolist() == [[9, 1, 4, 7, 2, 10]]


def test_tied_rows_are_resolved_a_few_at_a_time(tied, monkeypatch):
    """Rows tied at the k-th place are resolved in row chunks of TIE_ROWS_BYTES (one row here):
    the result equals the brute force with the whole batch at once."""
    offsets, phi, psi, D = tied
    monkeypatch.setattr(S, "SMALL_RESULT", 0)  # the tensor path, which large results take
    whole = S.knn(offsets, phi, psi, 7)
    monkeypatch.setattr(S, "TIE_ROWS_BYTES", 1)
    d, i = S.knn(offsets, phi, psi, 7)
    ref_d, ref_i = brute_topk(D, 7)
    np.testing.assert_array_equal(i.numpy(), ref_i)
    np.testing.assert_array_equal(d.numpy(), ref_d)
    assert torch.equal(i, whole[1])


def test_topk_heap_merges_blocks_in_index_order():
    heap = S.TopK(2, 3, torch.float64, torch.device("cpu"))
    heap.push(slice(0, 2), torch.tensor([[5.0, 1.0], [2.0, 2.0]]), torch.tensor([0, 1]))
    heap.close_block(2)
    heap.push(slice(0, 2), torch.tensor([[1.0, 0.5, 9.0], [2.0, 2.0, 0.0]]), torch.tensor([2, 3, 4]))
    heap.close_block(3)
    d, i = heap.result()
    assert i.tolist() == [[3, 1, 2], [4, 0, 1]]
    assert d.tolist() == [[0.5, 1.0, 1.0], [0.0, 2.0, 2.0]]


@pytest.mark.parametrize("n_q,n_keys,D,item,k", [(1, 10**6, 1025, 4, 10), (10000, 10**6, 513, 4, 10),
                                                  (2000, 200000, 1025, 8, 100), (3, 5, 7, 4, 2)])
@pytest.mark.parametrize("budget", [2**20, 64 * 2**20, 256 * 2**20])
def test_block_shape_fits_the_budget(n_q, n_keys, D, item, k, budget):
    q_rows, g_rows = S.block_shape(n_q, n_keys, D, item, k, budget)
    assert 1 <= q_rows <= n_q and 1 <= g_rows <= min(n_keys, S.MAX_KEY_BLOCK)
    keys = g_rows * D * item * S.FEATURE_TRANSIENT
    # a score block and the GEMM's buffer of the same size
    scores = q_rows * g_rows * item * S.GEMM_TRANSIENT + 4 * q_rows * k * (item + 8)
    assert keys <= S.KEY_SHARE * budget or g_rows == 1
    assert scores <= S.SCORE_SHARE * budget or q_rows == 1
    # the blocks are as large as their share allows: one more query row would not fit
    if q_rows < n_q:
        assert scores + g_rows * item * S.GEMM_TRANSIENT + 4 * k * (item + 8) > S.SCORE_SHARE * budget


def test_distance_matrix_equals_brute_force(tied):
    offsets, phi, psi, D = tied
    got = S.distance_matrix(offsets, phi, (psi[s:s + 7] for s in range(0, 101, 7)), n_keys=101,
                            memory_budget=900, keys_given=False)
    np.testing.assert_array_equal(got.numpy(), D)


@pytest.fixture(scope="module")
def geo():
    rng = np.random.default_rng(8)
    d = 9
    c = rng.normal(size=d)
    return unit_rows(rng, 30, d, c), unit_rows(rng, 11, d, c), unit_rows(rng, 64, d, c)


@pytest.mark.parametrize("name", ["softmax", "gaussian", "cosine", "iti"])
def test_search_exclude_equals_brute_force(geo, name):
    anchors, Q, G = geo
    params = {"softmax": dict(tau=0.05), "gaussian": dict(tau=0.05)}.get(name, {})
    m = ad.make_model(name, **params).fit(anchors)
    D = m.pairwise(Q, G)
    exclude = np.array([[3], [-1], [0], [63], [5], [5], [-1], [1], [2], [9], [40]])
    dist, idx = m.search(Q, G, k=6, exclude=exclude, memory_budget=3000)
    ref_d, ref_i = brute_topk(D, 6, exclude)
    np.testing.assert_array_equal(idx, ref_i)
    np.testing.assert_allclose(dist, ref_d, rtol=1e-12, atol=1e-12)
    dist_t, idx_t = m.search(torch.from_numpy(Q), torch.from_numpy(G), k=6, exclude=torch.from_numpy(exclude[:, 0]))
    np.testing.assert_array_equal(idx_t.numpy(), ref_i)


def test_search_exclude_bad_input(geo):
    anchors, Q, G = geo
    m = ad.Cosine()
    with pytest.raises(ValueError, match="one row per query"):
        m.search(Q, G, k=2, exclude=np.zeros(3, dtype=int))
    with pytest.raises(ValueError, match="outside"):
        m.search(Q, G, k=2, exclude=np.full(len(Q), 64))
    with pytest.raises(ValueError, match="integer"):
        m.search(Q, G, k=2, exclude=np.zeros(len(Q)))
    with pytest.raises(ValueError, match="k=64 exceeds the 63"):
        m.search(Q, G, k=64, exclude=np.zeros(len(Q), dtype=int))
    with pytest.raises(ValueError, match="not both"):
        m.search(G, G, k=2, exclude_self=True, exclude=np.zeros(len(G), dtype=int))


BACKENDS = ["exact", pytest.param("faiss", marks=pytest.mark.skipif(
    importlib.util.find_spec("faiss") is None, reason="needs faiss-cpu"))]


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_search_excludes_ids(geo, backend):
    anchors, Q, G = geo
    m = ad.Softmax(tau=0.05).fit(anchors)
    ids = np.arange(1000, 1000 + len(G))
    index = ad.Index(m, backend).add(G.astype(np.float32), ids=ids)
    own = np.array([3, -1, 0, 63, 5, 5, -1, 1, 2, 9, 40])
    dist, got = index.search(Q.astype(np.float32), k=5, exclude=np.where(own >= 0, ids[own], -1))
    assert np.isin(got, ids).all() and not (got == np.where(own >= 0, ids[own], -2)[:, None]).any()
    # against float64 divergences with the same exclusions, up to float32 rounding
    assert_topk_up_to_rounding(m, Q.astype(np.float32), G.astype(np.float32), got - 1000, dist, exclude=own[:, None])


def test_exact_index_and_search_share_results(geo):
    anchors, Q, G = geo
    m = ad.GaussianMixture(n_components=2, tau=0.05).fit(anchors)
    index = ad.Index(m, memory_budget=2000).add(G[:20]).add(G[20:])
    d1, i1 = index.search(Q, k=7)
    d2, i2 = m.search(Q, G, k=7)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_allclose(d1, d2, rtol=1e-12, atol=1e-12)


def test_index_add_streams_blocks_under_the_budget(geo):
    anchors, Q, G = geo
    m = ad.Softmax(tau=0.05).fit(anchors)
    seen = []
    index = ad.Index(m, memory_budget=int(5 * (2 * G.shape[1] + 1) * 8 * S.FEATURE_TRANSIENT / S.KEY_SHARE))  # 5 rows

    real_add = index._backend.add

    def record(psi, ids, stored, **kwargs):
        seen.append(psi.shape[0])
        return real_add(psi, ids, stored, **kwargs)

    index._backend.add = record
    index.add(G)
    assert seen == [5] * 12 + [4]
    np.testing.assert_array_equal(index.search(Q, k=4)[1], m.search(Q, G, k=4)[1])


def test_demo_and_eval_auprc_are_one_computation():
    from sklearn.metrics import average_precision_score

    from anchordiv.experiments import core

    rng = np.random.default_rng(2)
    d = 12
    centers = rng.normal(size=(3, d))
    labels = rng.integers(0, 3, size=90)
    X = centers[labels] + rng.normal(size=(90, d)) * 0.8
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    other = rng.integers(0, 2, size=90)
    # τ = 0.5: no divergences so close that the 9-digit noise-tie merge would join them
    m = ad.Softmax(tau=0.5).fit(centers / np.linalg.norm(centers, axis=1, keepdims=True))
    table = core.mean_auprc(m, X.astype(np.float32), {"a": labels, "b": other})
    data = core.EvalData.create(X.astype(np.float32), {"a": labels, "b": other})
    evals = {f: float(np.nanmean(v)) for f, v in core.score(m, data, ["a", "b"]).items()}
    assert table == evals
    # and both against sklearn on the float64 pairwise divergences, self excluded
    D = m.pairwise(X.astype(np.float32).astype(np.float64), X.astype(np.float32).astype(np.float64))
    for f, lab in (("a", labels), ("b", other)):
        aps = []
        for i in range(90):
            keep = np.arange(90) != i
            aps.append(average_precision_score(lab[keep] == lab[i], -D[i, keep]))
        assert abs(table[f] - np.mean(aps)) < 1e-9


def test_ad_search_is_the_search_function(geo):
    anchors, Q, G = geo
    m = ad.Softmax(tau=0.05).fit(anchors)
    assert callable(ad.search) and ad.search is ad.exact.search
    d1, i1 = ad.search(m, Q, G, k=5)
    d2, i2 = m.search(Q, G, k=5)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(d1, d2)
