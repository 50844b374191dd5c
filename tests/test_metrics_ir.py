"""Ranking metrics of anchordiv.metrics: hand-computed cases, ties, ranx, run export."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from anchordiv import metrics as M

TOL = 1e-12


# --------------------------------------------------------------------------- #
# An independent, loop-based reference (one query, no ties)
# --------------------------------------------------------------------------- #
def _untied(rel_sorted, name, k=None, gain="linear"):
    """The textbook metric of one ranked list of grades (rank 1 first)."""
    r = np.asarray(rel_sorted, dtype=float)
    hits = (r > 0).astype(float)
    n_rel = hits.sum()
    if n_rel == 0:
        return math.nan
    if name == "recall":
        return hits[:k].sum() / n_rel
    if name == "precision":
        return hits[:k].sum() / k
    if name == "r_precision":
        return hits[: int(n_rel)].sum() / n_rel
    if name == "map@r":
        total, seen = 0.0, 0
        for i in range(int(n_rel)):
            seen += hits[i]
            total += hits[i] * seen / (i + 1)
        return total / n_rel
    if name == "rr":
        first = int(np.argmax(hits > 0))
        return 0.0 if k is not None and first >= k else 1.0 / (first + 1)
    if name == "ndcg":
        g = r if gain == "linear" else 2.0 ** r - 1
        kk = min(k, len(g))
        disc = [1 / math.log2(i + 2) for i in range(kk)]
        ideal = sorted(g, reverse=True)
        return sum(g[i] * disc[i] for i in range(kk)) / sum(ideal[i] * disc[i] for i in range(kk))
    raise AssertionError(name)


def _ours(name, d, r, k=None, gain="linear", **kw):
    if name == "recall":
        return M.recall_at_k(d, r, k, **kw)
    if name == "precision":
        return M.precision_at_k(d, r, k, **kw)
    if name == "r_precision":
        return M.r_precision(d, r, **kw)
    if name == "map@r":
        return M.map_at_r(d, r, **kw)
    if name == "rr":
        return M.reciprocal_rank(d, r, k=k, **kw)
    if name == "ndcg":
        return M.ndcg_at_k(d, r, k, gain=gain, **kw)
    raise AssertionError(name)


def _expected_over_tie_orders(d, r, name, k=None, gain="linear"):
    """Mean of the untied metric over every order of the tied blocks (brute force)."""
    d, r = np.asarray(d), np.asarray(r, dtype=float)
    blocks = [np.flatnonzero(d == v) for v in np.unique(d)]
    values = [
        _untied(r[np.concatenate(perm)], name, k, gain)
        for perm in itertools.product(*[itertools.permutations(b) for b in blocks])
    ]
    return float(np.mean(values))


NAMES = ["recall", "precision", "r_precision", "map@r", "rr", "ndcg"]


# --------------------------------------------------------------------------- #
# Hand-computed cases
# --------------------------------------------------------------------------- #
def test_hand_computed_binary():
    d = [0.1, 0.2, 0.3, 0.4, 0.5]
    r = [1, 0, 1, 0, 0]  # R = 2; hits at ranks 1 and 3
    assert M.recall_at_k(d, r, 1) == pytest.approx(0.5, abs=TOL)
    assert M.recall_at_k(d, r, 2) == pytest.approx(0.5, abs=TOL)
    assert M.recall_at_k(d, r, 3) == pytest.approx(1.0, abs=TOL)
    assert M.recall_at_k(d, r, 50) == pytest.approx(1.0, abs=TOL)
    assert M.precision_at_k(d, r, 2) == pytest.approx(0.5, abs=TOL)
    assert M.precision_at_k(d, r, 3) == pytest.approx(2 / 3, abs=TOL)
    assert M.precision_at_k(d, r, 10) == pytest.approx(0.2, abs=TOL)  # denominator k
    assert M.r_precision(d, r) == pytest.approx(0.5, abs=TOL)          # P@2
    assert M.map_at_r(d, r) == pytest.approx(0.5, abs=TOL)             # (1 + 0) / 2
    assert M.reciprocal_rank(d, r) == pytest.approx(1.0, abs=TOL)
    # DCG@3 = 1 + 1/log2(4), IDCG@3 = 1 + 1/log2(3)
    assert M.ndcg_at_k(d, r, 3) == pytest.approx(1.5 / (1 + 1 / math.log2(3)), abs=TOL)
    # the first hit at rank 3
    assert M.reciprocal_rank(d, [0, 0, 1, 0, 1]) == pytest.approx(1 / 3, abs=TOL)
    assert M.reciprocal_rank(d, [0, 0, 1, 0, 1], k=2) == 0.0
    # AP@R counts only the top R: hits at ranks 2 and 3, R = 2 -> (1/2 * 1/2)
    assert M.map_at_r(d, [0, 1, 1, 0, 0]) == pytest.approx(0.25, abs=TOL)
    # ... while AP counts them all: (1/2 + 2/3) / 2
    assert M.average_precision(d, [0, 1, 1, 0, 0]) == pytest.approx(7 / 12, abs=TOL)


def test_hand_computed_graded_ndcg():
    d = [0.1, 0.2, 0.3, 0.4]
    g = [0, 3, 1, 2]
    dcg = 0 + 3 / math.log2(3) + 1 / 2 + 2 / math.log2(5)
    idcg = 3 + 2 / math.log2(3) + 1 / 2 + 0
    assert M.ndcg_at_k(d, g, 4) == pytest.approx(dcg / idcg, abs=TOL)
    e = [0, 7, 1, 3]  # 2^g - 1
    dcg_e = 7 / math.log2(3) + 1 / 2 + 3 / math.log2(5)
    idcg_e = 7 + 3 / math.log2(3) + 1 / 2
    assert M.ndcg_at_k(d, g, 4, gain="exponential") == pytest.approx(dcg_e / idcg_e, abs=TOL)
    # @2: DCG = 3/log2(3); IDCG = 3 + 2/log2(3)
    assert M.ndcg_at_k(d, g, 2) == pytest.approx((3 / math.log2(3)) / (3 + 2 / math.log2(3)), abs=TOL)
    # a perfect ranking scores 1; non-integer grades are fine
    assert M.ndcg_at_k([0, 1, 2], [2.5, 1.0, 0.0], 3) == pytest.approx(1.0, abs=TOL)


def test_hand_computed_ties():
    # [(hit, miss, miss) tied, hit]: R = 2
    d = [0.0, 0.0, 0.0, 1.0]
    r = [1, 0, 0, 1]
    assert M.precision_at_k(d, r, 1) == pytest.approx(1 / 3, abs=TOL)
    assert M.recall_at_k(d, r, 1) == pytest.approx(1 / 6, abs=TOL)
    assert M.recall_at_k(d, r, 3) == pytest.approx(1 / 2, abs=TOL)
    assert M.r_precision(d, r) == pytest.approx(1 / 3, abs=TOL)
    # the hit is 1st, 2nd or 3rd with probability 1/3 each
    assert M.reciprocal_rank(d, r) == pytest.approx((1 + 1 / 2 + 1 / 3) / 3, abs=TOL)
    # AP@2 is 1/2, 1/4 or 0 in those three orders
    assert M.map_at_r(d, r) == pytest.approx(0.25, abs=TOL)
    # everything tied: precision@k is the fraction of hits
    assert M.precision_at_k(np.zeros(8), [1, 0, 0, 1, 0, 1, 0, 0], 2) == pytest.approx(3 / 8, abs=TOL)


@pytest.mark.parametrize("seed", range(60))
def test_ties_are_the_mean_over_tie_orders(seed):
    rng = np.random.default_rng(seed)
    g = int(rng.integers(2, 8))
    d = rng.integers(0, 3, g).astype(float)
    r = rng.random(g) < 0.4
    r[rng.integers(g)] = True
    k = int(rng.integers(1, g + 2))
    for name in NAMES:
        got = _ours(name, d, r, k)
        assert got == pytest.approx(_expected_over_tie_orders(d, r, name, k), abs=1e-12), name
    grades = rng.integers(0, 4, g).astype(float)
    grades[rng.integers(g)] = 2.0
    for gain in ("linear", "exponential"):
        assert M.ndcg_at_k(d, grades, k, gain=gain) == pytest.approx(
            _expected_over_tie_orders(d, grades, "ndcg", k, gain), abs=1e-12)


def test_tie_order_does_not_matter():
    rng = np.random.default_rng(1)
    d = rng.integers(0, 4, size=(20, 30)).astype(float)
    r = rng.random((20, 30)) < 0.3
    r[:, 0] = True
    perm = rng.permutation(30)
    for name in NAMES:
        np.testing.assert_allclose(_ours(name, d, r, 5), _ours(name, d[:, perm], r[:, perm], 5),
                                   rtol=0, atol=TOL)


# --------------------------------------------------------------------------- #
# Matrices, exclude_self, batching, inputs
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name", NAMES)
def test_matrix_matches_rows_and_batching(name):
    rng = np.random.default_rng(2)
    d = rng.normal(size=(25, 40))
    r = rng.random((25, 40)) < 0.2
    r[3] = False  # a query without hits
    rows = np.array([_untied(r[i][np.argsort(d[i])], name, 7) for i in range(25)])
    got = _ours(name, d, r, 7)
    assert np.isnan(got[3]) and np.isnan(rows[3])
    np.testing.assert_allclose(got, rows, rtol=0, atol=TOL)
    np.testing.assert_array_equal(_ours(name, d, r, 7, batch_size=4), got)


@pytest.mark.parametrize("name", NAMES)
def test_exclude_self(name):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 4))
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    labels = rng.integers(0, 3, 30)
    r = M.relevance_from_labels(labels, labels)
    got = _ours(name, d, r, 5, exclude_self=True, batch_size=7)
    keep = ~np.eye(30, dtype=bool)
    ref = _ours(name, d[keep].reshape(30, 29), r[keep].reshape(30, 29), 5)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL)
    with pytest.raises(ValueError, match="square"):
        _ours(name, d[:5], r[:5], 5, exclude_self=True)


def test_torch_input_and_scalar_output():
    torch = pytest.importorskip("torch")
    d = torch.tensor([[0.3, 0.1, 0.2]], dtype=torch.float16)
    r = torch.tensor([[True, False, True]])
    assert M.recall_at_k(d, r, 2).tolist() == [0.5]
    assert isinstance(M.recall_at_k([0.3, 0.1, 0.2], [1, 0, 1], 2), float)


def test_errors():
    with pytest.raises(ValueError, match="k"):
        M.recall_at_k([0.1, 0.2], [1, 0], 0)
    with pytest.raises(ValueError, match="k"):
        M.precision_at_k([0.1, 0.2], [1, 0], 1.5)
    with pytest.raises(ValueError, match="0 and 1"):
        M.r_precision([0.1, 0.2], [2, 0])
    with pytest.raises(ValueError, match=">= 0"):
        M.ndcg_at_k([0.1, 0.2], [-1, 0], 2)
    with pytest.raises(ValueError, match="gain"):
        M.ndcg_at_k([0.1, 0.2], [1, 0], 2, gain="log")
    with pytest.raises(ValueError, match="NaN"):
        M.map_at_r([np.nan, 0.2], [1, 0])
    with pytest.raises(ValueError, match="same shape"):
        M.reciprocal_rank([0.1, 0.2], [1, 0, 1])
    assert math.isnan(M.ndcg_at_k([0.1, 0.2], [0, 0], 2))


# --------------------------------------------------------------------------- #
# Registry
# --------------------------------------------------------------------------- #
def test_registry_has_one_signature():
    rng = np.random.default_rng(4)
    d = rng.normal(size=(12, 12))
    r = rng.random((12, 12)) < 0.3
    np.fill_diagonal(r, True)
    for name, fn in M.METRICS.items():
        out = fn(d, r, exclude_self=True, batch_size=5)
        assert out.shape == (12,), name
        assert isinstance(fn(d[0], r[0]), float), name
    np.testing.assert_array_equal(M.METRICS["auprc"](d, r), M.average_precision(d, r))
    np.testing.assert_array_equal(M.METRICS["recall@5"](d, r), M.recall_at_k(d, r, 5))
    np.testing.assert_array_equal(M.get_metric(" NDCG@3 ")(d, r), M.ndcg_at_k(d, r, 3))
    np.testing.assert_array_equal(M.get_metric("ndcg_exp@3")(d, r * 2.0),
                                  M.ndcg_at_k(d, r * 2.0, 3, gain="exponential"))
    np.testing.assert_array_equal(M.get_metric("mrr@2")(d, r), M.reciprocal_rank(d, r, k=2))
    assert M.get_metric("map@r") is M.map_at_r
    for bad in ("recall@0", "recall@x", "f1@3", "ndcg", 3):
        with pytest.raises(ValueError, match="metric"):
            M.get_metric(bad)


# --------------------------------------------------------------------------- #
# Run export
# --------------------------------------------------------------------------- #
def test_to_trec_and_run_dict(tmp_path):
    d = np.array([[0.3, 0.1, 0.2], [0.0, 0.5, 0.5]])
    run = M.to_run_dict(d, query_ids=["a", "b"], doc_ids=["x", "y", "z"], k=2)
    assert run == {"a": {"y": -0.1, "z": -0.2}, "b": {"x": -0.0, "y": -0.5}}
    assert list(run["a"]) == ["y", "z"]  # rank order
    text = M.to_trec(d, tmp_path / "run.txt", query_ids=["a", "b"], doc_ids=["x", "y", "z"], k=2, tag="t1")
    assert text.splitlines() == ["a Q0 y 1 -0.1 t1", "a Q0 z 2 -0.2 t1",
                                 "b Q0 x 1 -0.0 t1", "b Q0 y 2 -0.5 t1"]
    assert (tmp_path / "run.txt").read_text() == text
    # exclude_self drops the diagonal; default ids are row numbers
    sq = np.array([[0.0, 0.2, 0.1], [0.3, 0.0, 0.4], [0.5, 0.6, 0.0]])
    assert M.to_run_dict(sq, exclude_self=True) == {
        "0": {"2": -0.1, "1": -0.2}, "1": {"0": -0.3, "2": -0.4}, "2": {"0": -0.5, "1": -0.6}}
    # search output: (distances, indices), -1 = no neighbour
    run = M.to_run_dict([[0.2, 0.1, 9.0]], indices=[[4, 2, -1]])
    assert run == {"0": {"2": -0.1, "4": -0.2}}
    qrels = M.to_qrels_dict([[1, 0, 2], [0, 0, 0.5]], doc_ids=["x", "y", "z"])
    assert qrels == {"0": {"x": 1, "z": 2}, "1": {"z": 0.5}}
    assert M.to_qrels_dict(np.eye(2, dtype=bool), exclude_self=True) == {"0": {}, "1": {}}
    with pytest.raises(ValueError, match="whitespace"):
        M.to_trec(d, query_ids=["a b", "c"])
    with pytest.raises(ValueError, match="unique"):
        M.to_run_dict(d, doc_ids=["x", "x", "z"])
    with pytest.raises(ValueError, match="tag"):
        M.to_trec(d, tag="my run")


# --------------------------------------------------------------------------- #
# Against ranx
# --------------------------------------------------------------------------- #
pytestmark = pytest.mark.filterwarnings("ignore::Warning:numba")


@pytest.fixture(scope="module")
def ranx():
    return pytest.importorskip("ranx")


def _ranx(ranx, qrels, run, metrics):
    """ranx's per-query scores, in the order of ``qrels`` (ranx sorts query ids itself)."""
    r = ranx.Run(run)
    ranx.evaluate(ranx.Qrels(qrels), r, metrics, return_mean=False, save_results_in_run=True)
    return {m: np.array([r.scores[m][q] for q in qrels]) for m in metrics}


@pytest.fixture(scope="module")
def case():
    """40 queries x 60 items, continuous distances (no ties), every query with a hit."""
    rng = np.random.default_rng(5)
    d = rng.normal(size=(40, 60))
    r = rng.random((40, 60)) < rng.uniform(0.03, 0.3, size=(40, 1))
    r[np.arange(40), rng.integers(0, 60, 40)] = True
    grades = np.where(r, rng.integers(1, 4, size=r.shape), 0)
    return d, r, grades


def test_agrees_with_ranx_binary(ranx, case):
    d, r, _ = case
    qrels, run = M.to_qrels_dict(r), M.to_run_dict(d)
    names = ["recall@1", "recall@5", "recall@20", "precision@1", "precision@5", "precision@20",
             "r-precision", "mrr", "mrr@3", "ndcg@5", "ndcg@20", "map"]
    ref = _ranx(ranx, qrels, run, names)
    ours = {
        "recall@1": M.recall_at_k(d, r, 1), "recall@5": M.recall_at_k(d, r, 5),
        "recall@20": M.recall_at_k(d, r, 20), "precision@1": M.precision_at_k(d, r, 1),
        "precision@5": M.precision_at_k(d, r, 5), "precision@20": M.precision_at_k(d, r, 20),
        "r-precision": M.r_precision(d, r), "mrr": M.reciprocal_rank(d, r),
        "mrr@3": M.reciprocal_rank(d, r, k=3), "ndcg@5": M.ndcg_at_k(d, r, 5),
        "ndcg@20": M.ndcg_at_k(d, r, 20), "map": M.average_precision(d, r),
    }
    for name in names:
        np.testing.assert_allclose(ours[name], ref[name], rtol=0, atol=1e-12, err_msg=name)


def test_map_at_r_agrees_with_ranx_map_at_k(ranx, case):
    # ranx's map@k is sum_{i<=k} P(i) rel_i / R, i.e. AP@R at k = R (query by query).
    d, r, _ = case
    qrels, run = M.to_qrels_dict(r), M.to_run_dict(d)
    ours = M.map_at_r(d, r)
    for n_rel in np.unique(r.sum(1)):
        qs = [str(i) for i in np.flatnonzero(r.sum(1) == n_rel)]
        ref = _ranx(ranx, {q: qrels[q] for q in qs}, {q: run[q] for q in qs}, [f"map@{n_rel}"])
        np.testing.assert_allclose(ours[[int(q) for q in qs]], ref[f"map@{n_rel}"], rtol=0, atol=1e-12)


def test_agrees_with_ranx_graded(ranx, case):
    d, _, grades = case
    qrels, run = M.to_qrels_dict(grades), M.to_run_dict(d)
    ref = _ranx(ranx, qrels, run, ["ndcg@10", "ndcg_burges@10", "ndcg@60"])
    np.testing.assert_allclose(M.ndcg_at_k(d, grades, 10), ref["ndcg@10"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(M.ndcg_at_k(d, grades, 10, gain="exponential"), ref["ndcg_burges@10"],
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(M.ndcg_at_k(d, grades, 60), ref["ndcg@60"], rtol=0, atol=1e-12)


def test_agrees_with_ranx_exclude_self_and_trec_file(ranx, tmp_path):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(30, 5))
    d = ((x[:, None] - x[None]) ** 2).sum(-1)
    labels = rng.integers(0, 4, 30)
    r = M.relevance_from_labels(labels, labels)
    path = tmp_path / "run.trec"
    M.to_trec(d, path, exclude_self=True)
    run = ranx.Run.from_file(str(path), kind="trec")
    qrels = M.to_qrels_dict(r, exclude_self=True)
    read, written = run.to_dict(), M.to_run_dict(d, exclude_self=True)
    assert read.keys() == written.keys()
    for q in written:  # the TREC text round-trips every score exactly
        assert read[q] == written[q]
    metrics = ["recall@5", "ndcg@5", "mrr"]
    ranx.evaluate(ranx.Qrels(qrels), run, metrics, return_mean=False, save_results_in_run=True)
    for name, ours in (("recall@5", M.recall_at_k(d, r, 5, exclude_self=True)),
                       ("ndcg@5", M.ndcg_at_k(d, r, 5, exclude_self=True)),
                       ("mrr", M.reciprocal_rank(d, r, exclude_self=True))):
        ref = np.array([run.scores[name][q] for q in qrels])
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-12, err_msg=name)
