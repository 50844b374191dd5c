"""Tests for anchordiv.metrics."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from anchordiv.metrics import (
    BootstrapCI,
    MAPResult,
    average_precision,
    bootstrap_ci,
    mean_average_precision,
    paired_difference,
    relevance_from_labels,
    relevance_from_multilabels,
)

TOL = 1e-12


def _sk_ap(distances_row, relevant_row):
    """Reference AP of one query; NaN when there is no relevant item."""
    relevant_row = np.asarray(relevant_row, dtype=bool)
    if not relevant_row.any():
        return np.nan
    return average_precision_score(relevant_row, -np.asarray(distances_row, dtype=float))


def _sk_ap_matrix(d, r):
    return np.array([_sk_ap(d[i], r[i]) for i in range(d.shape[0])])


def _random_case(rng, q, g, p=0.3, kind="normal"):
    if kind == "normal":
        d = rng.normal(size=(q, g))
    elif kind == "round1":
        d = np.round(rng.normal(size=(q, g)), 1)
    elif kind == "int":
        d = rng.integers(0, 4, size=(q, g))
    else:  # pragma: no cover
        raise AssertionError(kind)
    r = rng.random((q, g)) < p
    r[:, 0] |= ~r.any(axis=1)  # every query has at least one hit
    return d, r


# --------------------------------------------------------------------------- #
# average_precision against sklearn
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("kind", ["normal", "round1", "int"])
@pytest.mark.parametrize("seed", range(5))
def test_ap_matches_sklearn(kind, seed):
    rng = np.random.default_rng(seed)
    d, r = _random_case(rng, 30, int(rng.integers(2, 60)), kind=kind)
    got = average_precision(d, r)
    assert got.shape == (30,)
    np.testing.assert_allclose(got, _sk_ap_matrix(d, r), rtol=0, atol=TOL)


def test_ties_are_one_threshold():
    # Hit tied with a non-hit: precision taken after the whole block.
    assert average_precision([0.2, 0.2], [True, False]) == pytest.approx(0.5, abs=TOL)
    assert average_precision([0.2, 0.2], [False, True]) == pytest.approx(0.5, abs=TOL)
    # All tied: AP is the fraction of relevant items, whatever the order.
    r = np.array([1, 0, 0, 1, 0, 1, 0, 0], dtype=bool)
    assert average_precision(np.zeros(8), r) == pytest.approx(3 / 8, abs=TOL)
    # [hit, (hit, miss, miss) tied, hit]: 1/3 * (1 + 2/4 + 3/5)
    d = [0.0, 1.0, 1.0, 1.0, 2.0]
    rel = [1, 1, 0, 0, 1]
    expected = (1 + 2 / 4 + 3 / 5) / 3
    assert average_precision(d, rel) == pytest.approx(expected, abs=TOL)
    assert average_precision(d, rel) == pytest.approx(_sk_ap(d, rel), abs=TOL)


def test_ties_do_not_depend_on_item_order():
    rng = np.random.default_rng(3)
    d, r = _random_case(rng, 10, 40, kind="int")
    perm = rng.permutation(40)
    np.testing.assert_allclose(
        average_precision(d, r), average_precision(d[:, perm], r[:, perm]), rtol=0, atol=TOL
    )


def test_negative_distances():
    rng = np.random.default_rng(1)
    d, r = _random_case(rng, 20, 25, kind="round1")
    d = d - 5.0  # all negative
    assert (d < 0).all()
    got = average_precision(d, r)
    np.testing.assert_allclose(got, _sk_ap_matrix(d, r), rtol=0, atol=TOL)
    # A shift of all distances changes nothing.
    np.testing.assert_allclose(got, average_precision(d + 5.0, r), rtol=0, atol=TOL)
    # Perfect ranking with negative distances is 1, not treated as "not retrieved".
    assert average_precision([-3.0, -2.0, -1.0], [1, 1, 0]) == pytest.approx(1.0, abs=TOL)


def test_one_dimensional_returns_float():
    out = average_precision([0.3, 0.1, 0.2], [False, True, False])
    assert isinstance(out, float)
    assert out == pytest.approx(1.0, abs=TOL)
    assert np.isnan(average_precision([0.3, 0.1], [0, 0]))


def test_matrix_equals_loop_and_chunking():
    rng = np.random.default_rng(7)
    d, r = _random_case(rng, 23, 31, kind="round1")
    r[4] = False  # one query without hits
    full = average_precision(d, r)
    loop = np.array([average_precision(d[i], r[i]) for i in range(23)])
    np.testing.assert_array_equal(np.isnan(full), np.isnan(loop))
    assert np.isnan(full[4])
    np.testing.assert_allclose(full, loop, rtol=0, atol=TOL)
    for chunk in (1, 5, 23, 100):
        np.testing.assert_allclose(
            average_precision(d, r, batch_size=chunk), full, rtol=0, atol=TOL
        )


def test_relevance_dtypes_and_perfect_worst():
    d = np.array([[0.0, 1.0, 2.0, 3.0]])
    rel_bool = np.array([[True, True, False, False]])
    for rel in (rel_bool, rel_bool.astype(int), rel_bool.astype(float)):
        assert average_precision(d, rel)[0] == pytest.approx(1.0, abs=TOL)
    worst = average_precision(d, rel_bool[:, ::-1])[0]
    assert worst == pytest.approx((1 / 3 + 2 / 4) / 2, abs=TOL)


def test_torch_input():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    d, r = _random_case(rng, 8, 12, kind="round1")
    expected = average_precision(d, r)
    got = average_precision(torch.tensor(d), torch.tensor(r))
    np.testing.assert_allclose(got, expected, rtol=0, atol=TOL)
    res = mean_average_precision(torch.tensor(d, dtype=torch.float32), torch.tensor(r))
    # float32 rounding keeps the order of these values (one decimal, moderate range).
    assert res.mean == pytest.approx(np.mean(expected), abs=1e-9)


# --------------------------------------------------------------------------- #
# mean_average_precision
# --------------------------------------------------------------------------- #
def test_exclude_self_matches_manual_deletion():
    rng = np.random.default_rng(11)
    n = 25
    labels = rng.integers(0, 4, size=n)
    d = np.round(rng.normal(size=(n, n)), 1)
    np.fill_diagonal(d, -10.0)  # self would rank first if not removed
    rel = relevance_from_labels(labels, labels)
    res = mean_average_precision(d, rel, exclude_self=True)
    manual = []
    for i in range(n):
        keep = np.arange(n) != i
        manual.append(_sk_ap(d[i, keep], rel[i, keep]))
    manual = np.array(manual)
    np.testing.assert_array_equal(np.isnan(res.per_query), np.isnan(manual))
    np.testing.assert_allclose(res.per_query, manual, rtol=0, atol=TOL)
    assert res.mean == pytest.approx(np.nanmean(manual), abs=TOL)
    np.testing.assert_allclose(
        average_precision(d, rel, exclude_self=True), manual, rtol=0, atol=TOL
    )
    # Without exclusion the self match inflates AP.
    assert mean_average_precision(d, rel).mean > res.mean
    # Chunking across the diagonal gives the same result.
    np.testing.assert_allclose(
        mean_average_precision(d, rel, exclude_self=True, batch_size=4).per_query,
        manual,
        rtol=0,
        atol=TOL,
    )


def test_exclude_self_singleton_class_is_skipped():
    labels = np.array([0, 0, 1, 2, 2, 2])
    rng = np.random.default_rng(0)
    d = rng.random((6, 6))
    res = mean_average_precision(d, relevance_from_labels(labels, labels), exclude_self=True)
    assert res.n_queries == 6
    assert res.n_skipped == 1  # query 2 is the only member of class 1
    assert np.isnan(res.per_query[2])
    assert res.n_evaluated == 5


def test_skipped_queries_are_counted_not_averaged():
    rng = np.random.default_rng(5)
    d, r = _random_case(rng, 12, 20, kind="normal")
    r[[1, 6, 7]] = False
    res = mean_average_precision(d, r)
    assert isinstance(res, MAPResult)
    assert res.n_queries == 12
    assert res.n_skipped == 3
    assert np.isnan(res.per_query[[1, 6, 7]]).all()
    assert not np.isnan(np.delete(res.per_query, [1, 6, 7])).any()
    expected = np.mean([_sk_ap(d[i], r[i]) for i in range(12) if i not in (1, 6, 7)])
    assert res.mean == pytest.approx(expected, abs=TOL)
    assert float(res) == res.mean


def test_all_queries_skipped_gives_nan_mean():
    res = mean_average_precision(np.ones((3, 4)), np.zeros((3, 4), dtype=bool))
    assert np.isnan(res.mean)
    assert res.n_skipped == 3 and res.n_queries == 3


def test_map_single_query_1d():
    res = mean_average_precision([0.5, 0.1, 0.9], [0, 1, 1])
    assert res.n_queries == 1 and res.per_query.shape == (1,)
    assert res.mean == pytest.approx(_sk_ap([0.5, 0.1, 0.9], [0, 1, 1]), abs=TOL)


# --------------------------------------------------------------------------- #
# Relevance builders
# --------------------------------------------------------------------------- #
def test_relevance_from_labels():
    q = np.array([0, 2, 1, 2])
    k = np.array([2, 2, 0, 3, 1])
    rel = relevance_from_labels(q, k)
    assert rel.dtype == bool and rel.shape == (4, 5)
    for i in range(4):
        for j in range(5):
            assert rel[i, j] == (q[i] == k[j])
    rel_str = relevance_from_labels(np.array(["cat", "dog"]), np.array(["dog", "dog", "cat"]))
    np.testing.assert_array_equal(rel_str, [[False, False, True], [True, True, False]])


def test_relevance_from_multilabels_brute_force():
    rng = np.random.default_rng(9)
    q = (rng.random((15, 5)) < 0.35).astype(int)
    k = rng.random((20, 5)) < 0.35
    shared = relevance_from_multilabels(q, k)
    assert shared.dtype == bool and shared.shape == (15, 20)
    for i in range(15):
        for j in range(20):
            assert shared[i, j] == any(q[i, c] == 1 and k[j, c] for c in range(5))
    for c in range(5):
        per = relevance_from_multilabels(q, k, label=c)
        assert per.shape == (15, 20)
        for i in range(15):
            for j in range(20):
                assert per[i, j] == bool(q[i, c] == 1 and k[j, c])
        # Queries without label c have no relevant item and are skipped.
        res = mean_average_precision(rng.random((15, 20)), per)
        n_without = int((q[:, c] == 0).sum() + ((q[:, c] == 1) & (k[:, c].sum() == 0)).sum())
        assert res.n_skipped == n_without
    assert relevance_from_multilabels(q, k, label=np.int64(2)).shape == (15, 20)


# --------------------------------------------------------------------------- #
# Bootstrap
# --------------------------------------------------------------------------- #
def test_bootstrap_covers_true_mean():
    rng = np.random.default_rng(123)
    true_mean = 0.6
    covered = 0
    n_sim = 100
    for s in range(n_sim):
        x = rng.normal(true_mean, 0.2, size=150)
        ci = bootstrap_ci(x, n_boot=400, seed=s)
        assert ci.low <= ci.mean <= ci.high
        assert ci.mean == pytest.approx(x.mean(), abs=TOL)
        covered += ci.low <= true_mean <= ci.high
    assert 0.85 <= covered / n_sim <= 1.0
    # Interval width is about 2 * 1.96 * sd / sqrt(n).
    ci = bootstrap_ci(rng.normal(true_mean, 0.2, size=150), n_boot=2000)
    assert 0.7 * 2 * 1.96 * 0.2 / np.sqrt(150) < ci.high - ci.low < 1.3 * 2 * 1.96 * 0.2 / np.sqrt(150)


def test_bootstrap_reproducible_with_seed():
    x = np.random.default_rng(0).random(80)
    a = bootstrap_ci(x, seed=42)
    b = bootstrap_ci(x, seed=42)
    c = bootstrap_ci(x, seed=43)
    assert isinstance(a, BootstrapCI)
    assert (a.low, a.high, a.mean) == (b.low, b.high, b.mean)
    assert (a.low, a.high) != (c.low, c.high)
    assert a.n == 80 and a.n_draws == 1 and a.level == 0.95


def test_bootstrap_ignores_nan():
    x = np.random.default_rng(1).random(50)
    with_nan = np.insert(x, [3, 10, 10, 40], np.nan)
    a = bootstrap_ci(with_nan, seed=5)
    b = bootstrap_ci(x, seed=5)
    assert a.n == 50
    assert (a.mean, a.low, a.high) == pytest.approx((b.mean, b.low, b.high), abs=TOL)


def test_bootstrap_two_level():
    rng = np.random.default_rng(4)
    n_draws, n_q = 8, 200
    query_effect = rng.normal(0, 0.1, size=n_q)
    draw_effect = rng.normal(0, 0.05, size=(n_draws, 1))
    v = 0.5 + query_effect + draw_effect
    ci2 = bootstrap_ci(v, seed=0)
    assert ci2.n == n_q and ci2.n_draws == n_draws
    assert ci2.mean == pytest.approx(v.mean(axis=1).mean(), abs=TOL)
    # Averaging over draws first hides the draw-to-draw variability.
    ci1 = bootstrap_ci(v.mean(axis=0), seed=0)
    assert ci1.mean == pytest.approx(ci2.mean, abs=TOL)
    assert (ci2.high - ci2.low) > 1.5 * (ci1.high - ci1.low)
    # Identical draws: no extra width from resampling draws.
    same = np.tile(v[0], (n_draws, 1))
    ci_same = bootstrap_ci(same, seed=0)
    ci_row = bootstrap_ci(v[0], seed=0)
    assert ci_same.mean == pytest.approx(ci_row.mean, abs=TOL)
    assert ci_same.high - ci_same.low == pytest.approx(ci_row.high - ci_row.low, rel=0.3)


def test_bootstrap_groups():
    x = np.random.default_rng(8).random(40)
    # One query per group is the ordinary bootstrap.
    a = bootstrap_ci(x, seed=3, groups=np.arange(40))
    b = bootstrap_ci(x, seed=3)
    assert (a.low, a.high) == pytest.approx((b.low, b.high), abs=TOL)
    # A single group: every replicate is the full sample.
    c = bootstrap_ci(x, seed=3, groups=np.zeros(40))
    assert c.low == pytest.approx(x.mean(), abs=TOL)
    assert c.high == pytest.approx(x.mean(), abs=TOL)
    # Strongly clustered values: the cluster bootstrap is wider.
    g = np.repeat(np.arange(8), 5)
    y = np.repeat(np.random.default_rng(9).normal(size=8), 5)
    wide = bootstrap_ci(y, seed=0, groups=g)
    narrow = bootstrap_ci(y, seed=0)
    assert wide.high - wide.low > 1.5 * (narrow.high - narrow.low)


def test_paired_difference_identical_is_zero():
    x = np.random.default_rng(2).random((3, 30))
    for arr in (x[0], x):
        ci = paired_difference(arr, arr.copy())
        assert ci.mean == 0.0 and ci.low == 0.0 and ci.high == 0.0


def test_paired_difference_matches_bootstrap_of_difference():
    rng = np.random.default_rng(6)
    a = rng.random(60)
    b = a - 0.1 + rng.normal(0, 0.01, size=60)
    b[5] = np.nan
    d = paired_difference(a, b, seed=1)
    ref = bootstrap_ci(a - b, seed=1)
    assert (d.mean, d.low, d.high, d.n) == pytest.approx((ref.mean, ref.low, ref.high, ref.n))
    assert d.n == 59
    assert d.low > 0.09 and d.high < 0.11
    # A 1-D baseline against several draws is repeated across draws.
    a2 = np.stack([a, a + 0.01])
    d2 = paired_difference(a2, b, seed=1)
    assert d2.n_draws == 2
    assert d2.mean == pytest.approx(np.nanmean(a2 - b), abs=TOL)


# --------------------------------------------------------------------------- #
# Bad inputs
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: average_precision(np.zeros((2, 3)), np.zeros((2, 4))), "relevant"),
        (lambda: average_precision([0.1, np.nan], [1, 0]), "distances.*NaN"),
        (lambda: average_precision([0.1, 0.2], [1, 2]), "relevant.*0 and 1"),
        (lambda: average_precision([0.1, 0.2], [0.5, 1.0]), "relevant"),
        (lambda: average_precision([], []), "distances.*empty"),
        (lambda: average_precision(np.zeros((2, 0)), np.zeros((2, 0))), "distances.*empty"),
        (lambda: average_precision(np.zeros((2, 2, 2)), np.zeros((2, 2, 2))), "distances"),
        (lambda: average_precision(["a", "b"], [1, 0]), "distances"),
        (lambda: average_precision([0.1, 0.2], [1, 0], exclude_self=True), "exclude_self"),
        (lambda: mean_average_precision(np.zeros((2, 3)), np.ones((2, 3)), exclude_self=True), "exclude_self"),
        (lambda: average_precision(np.zeros((2, 3)), np.ones((2, 3)), batch_size=0), "batch_size"),
        (lambda: relevance_from_labels([], [1]), "query_labels"),
        (lambda: relevance_from_labels([1], np.zeros((2, 2))), "key_labels"),
        (lambda: relevance_from_multilabels(np.ones((2, 3)), np.ones((4, 2))), "number of labels"),
        (lambda: relevance_from_multilabels(np.ones((2, 3)), np.full((4, 3), 2)), "key_labels"),
        (lambda: relevance_from_multilabels(np.ones(3), np.ones((4, 3))), "query_labels"),
        (lambda: relevance_from_multilabels(np.ones((2, 3)), np.ones((4, 3)), label=3), "label"),
        (lambda: relevance_from_multilabels(np.ones((2, 3)), np.ones((4, 3)), label=-1), "label"),
        (lambda: relevance_from_multilabels(np.ones((2, 3)), np.ones((4, 3)), label=1.0), "label"),
        (lambda: bootstrap_ci([]), "per_query_values.*empty"),
        (lambda: bootstrap_ci([np.nan, np.nan]), "per_query_values.*NaN"),
        (lambda: bootstrap_ci(np.ones((2, 2, 2))), "per_query_values"),
        (lambda: bootstrap_ci([1.0, 2.0], n_boot=0), "n_boot"),
        (lambda: bootstrap_ci([1.0, 2.0], level=1.5), "level"),
        (lambda: bootstrap_ci([1.0, 2.0], groups=[0, 1, 2]), "groups"),
        (lambda: paired_difference(np.ones(3), np.ones(4)), "`a` and `b`"),
        (lambda: paired_difference(np.ones((2, 3)), np.ones((3, 3))), "`a` and `b`"),
    ],
)
def test_bad_inputs_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()
