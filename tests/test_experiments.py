"""Tests of the experiment protocols (anchordiv.experiments) on small synthetic collections.

Each protocol is checked for the direction of its effect on data built to show it, for
its tidy frames and the files and columns it writes, for reproducibility with a seed,
and for clear errors on bad input; the ``eval`` subcommands for their options.
"""

import csv

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv import experiments as ex
from anchordiv.experiments.core import EvalData, score
from anchordiv.metrics import mean_average_precision, relevance_from_labels

D = 16
TAU = 0.1


def _unit(X):
    return X / np.linalg.norm(X, axis=1, keepdims=True)


@pytest.fixture(autouse=True)
def _one_thread():
    # Small LAPACK calls (eigh) can be very slow with several threads on a busy machine.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def world():
    """Items = factor-A direction + factor-B direction + noise; anchors near each factor's directions."""
    rng = np.random.default_rng(0)
    Da, Db = rng.normal(size=(4, D)), rng.normal(size=(3, D))
    n = 72
    a = np.arange(n) % 4
    b = rng.permutation(np.arange(n) % 3)
    X = _unit(Da[a] + Db[b] + 0.6 * rng.normal(size=(n, D)))

    def anchors(dirs, per, noise=0.3):
        return ad.AnchorSet(_unit(np.repeat(dirs, per, 0) + noise * rng.normal(size=(len(dirs) * per, D))))

    A, B = anchors(Da, 3), anchors(Db, 3)
    broad = anchors(np.vstack([Da, Db, rng.normal(size=(6, D))]), 12)
    data = EvalData.create(X, {"a": a, "b": b}, tau=TAU, name="synthetic")
    return {"data": data, "A": A, "B": B, "broad": broad}


def _read(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def _check_files(res, out, columns):
    name = res.protocol
    for suffix in (".csv", "_summary.csv", "_effects.csv", ".md", ".png", ".json"):
        assert (out / f"{name}{suffix}").is_file(), suffix
    assert (out / f"{name}.png").stat().st_size > 1000
    for key, cols in columns.items():
        header, rows = _read(out / f"{name}{'' if key == 'rows' else '_' + key}.csv")
        assert header == cols
        assert rows


def _auprc(res, **match):
    s = res.summary
    hits = s.loc[np.logical_and.reduce([(s[k] == v).to_numpy() for k, v in match.items()]), "auprc"].tolist()
    assert len(hits) == 1, (match, hits)
    return hits[0]


def _check_tidy(res, condition):
    """One observation per query, condition and draw; rows and summary are their means."""
    obs = res.observations
    assert list(obs.columns) == [*condition, "query", "ap"]
    assert not obs.duplicated([*condition, "query"]).any()
    means = obs.groupby([c for c in condition if c in res.rows.columns], dropna=False, sort=False)["ap"].mean()
    np.testing.assert_allclose(np.sort(means.to_numpy()), np.sort(res.rows["auprc"].to_numpy()), atol=1e-12)


# ----------------------------------------------------------------------------- core
def test_score_matches_exclude_self(world):
    data = world["data"]
    g = ad.Softmax(tau=TAU).fit(world["A"])
    ap = score(g, data, ["a"])["a"]
    D_ = g.pairwise(data.embeddings, data.embeddings)
    ref = mean_average_precision(D_, relevance_from_labels(data.labels["a"], data.labels["a"]), exclude_self=True)
    np.testing.assert_allclose(ap, ref.per_query, atol=1e-12)
    # chunked computation and an overlapping query/key split drop the pair (i, i) the same way
    np.testing.assert_allclose(score(g, data, ["a"], memory_budget=4000)["a"], ref.per_query, atol=1e-12)
    keys = np.arange(10, 72)
    split = EvalData.create(data.embeddings, data.labels, queries=np.arange(0, 20), keys=keys)
    got = score(g, split, ["a"])["a"]
    for i in (0, 15):
        mask = keys != i
        row = g.pairwise(data.embeddings[i:i + 1], data.embeddings[keys[mask]])
        rel = data.labels["a"][keys[mask]] == data.labels["a"][i]
        assert got[i] == pytest.approx(mean_average_precision(row, rel[None]).mean)


def test_noise_level_differences_are_ties(world):
    # one anchor: the softmax divergence is 0 for every pair, so every key ties and AP = prevalence
    data = world["data"]
    g = ad.Softmax(tau=TAU).fit(world["A"].subsample(1, seed=0))
    ap = score(g, data, ["a"])["a"]
    np.testing.assert_allclose(ap, 17 / 71)  # 18 items per value of a, the query itself excluded


# ----------------------------------------------------------------------- protocols
def test_coordinate_direction_and_files(world, tmp_path):
    res = ex.coordinate(world["data"], world["A"], world["B"], "a", "b", models=["softmax", "gaussian"],
                        proportions=[0, 0.5, 1], n_draws=2, out_dir=tmp_path, n_boot=200, progress=False)
    for m in ("softmax", "gaussian"):
        assert _auprc(res, model=m, p=1.0, factor="a") > _auprc(res, model=m, p=0.0, factor="a") + 0.1
        assert _auprc(res, model=m, p=0.0, factor="b") > _auprc(res, model=m, p=1.0, factor="b") + 0.1
    assert (res.effects["verdict"] == "holds").all()
    _check_tidy(res, ["model", "p", "draw", "factor", "role", "n_anchors"])
    assert res.observations.loc[res.observations["model"] == "cosine", "p"].isna().all()
    _check_files(res, tmp_path, {
        "rows": ["model", "p", "draw", "factor", "role", "auprc", "n_anchors"],
        "summary": ["model", "p", "factor", "role", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["model", "factor", "role", "comparison", "diff", "ci_low", "ci_high", "verdict"]})
    assert "Verdict" in (tmp_path / "coordinate.md").read_text()


def test_progress_log_prints_a_line_per_step(world, capsys):
    res = ex.budget(world["data"], world["A"], "a", models=["softmax"], baselines=["cosine"], budgets=[2, 12],
                    n_draws=2, n_boot=20, progress="log")
    err = capsys.readouterr().err
    steps = [ln for ln in err.splitlines() if ln.startswith("budget: ")]
    total = 2 + 1 + 1  # softmax: 2 draws at budget 2, one at the full set (12); cosine once
    assert steps[0] == f"budget: {total} steps" and steps[-1].startswith(f"budget: {total} steps in ")
    assert [ln.split(",")[0] for ln in steps[1:-1]] == [f"budget: step {i}/{total}" for i in range(1, total + 1)]
    assert "%|" not in err and len(res.rows)
    with pytest.raises(ValueError, match="progress must be True, False, None or 'log'"):
        ex.budget(world["data"], world["A"], "a", progress="lines")


def test_budget_softmax_improves_with_coverage(world, tmp_path):
    res = ex.budget(world["data"], world["A"], "a", budgets=[1, 2, 12], n_draws=3, out_dir=tmp_path, n_boot=200,
                    progress=False)
    assert _auprc(res, model="softmax", budget=12) >= _auprc(res, model="softmax", budget=2)
    # models that need two anchors skip the budget of one; cosine does not depend on the budget
    assert not ((res.summary["model"] == "gaussian") & (res.summary["budget"] == 1)).any()
    assert _auprc(res, model="cosine", budget=1) == _auprc(res, model="cosine", budget=12)
    _check_tidy(res, ["model", "budget", "draw", "n_anchors"])
    _check_files(res, tmp_path, {
        "rows": ["model", "budget", "draw", "auprc", "n_anchors"],
        "summary": ["model", "budget", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["budget", "model", "comparison", "diff", "ci_low", "ci_high", "verdict"]})


def test_adaptation_posterior_beats_target_only(world, tmp_path):
    mp = {"latent_gaussian": {"rank": 6}, "latent_spherical": {"rank": 6}, "gmm": {"n_components": 3}}
    res = ex.adaptation(world["data"], world["broad"], world["A"], "a", budgets=[2, 12], n_draws=3,
                        model_params=mp, out_dir=tmp_path, n_boot=200, progress=False)
    for m in ("gaussian", "gmm", "latent_gaussian", "latent_spherical"):
        assert _auprc(res, method=f"posterior {m}", budget=2) > _auprc(res, method=m, budget=2), m
    _check_tidy(res, ["method", "model", "kind", "budget", "draw"])
    _check_files(res, tmp_path, {
        "rows": ["method", "model", "kind", "budget", "draw", "auprc"],
        "summary": ["method", "budget", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["model", "budget", "comparison", "diff", "ci_low", "ci_high", "verdict"]})
    assert res.config["priors"]["latent_spherical"]["k"] == 6


def test_components_and_table_write_their_files(world, tmp_path):
    res = ex.components(world["data"], {"A": (world["A"], "a"), "B": (world["B"], "b")}, n_components=[1, 2, 16],
                        n_draws=2, out_dir=tmp_path / "c", n_boot=100, progress=False)
    assert any("M = 16" in s for s in res.config["skipped"])  # more components than anchors
    _check_tidy(res, ["anchor_set", "factor", "model", "n_components", "draw"])
    _check_files(res, tmp_path / "c", {
        "rows": ["anchor_set", "factor", "model", "n_components", "draw", "auprc"],
        "summary": ["anchor_set", "model", "n_components", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["anchor_set", "factor", "n_components", "comparison", "diff", "ci_low", "ci_high", "verdict"]})
    res = ex.table(world["data"], [("A", world["A"], "a"), ("B", world["B"], "b")], models=["softmax", "gaussian"],
                   per_value=True, n_draws=2, anchor_fraction=0.8, out_dir=tmp_path / "t", n_boot=100,
                   progress=False)
    assert len(res.effects) == (4 + 3) * 2 * 2  # values × models × baselines
    assert set(res.effects["class"]) <= {"better", "tie", "worse"}
    # anchors of the factor beat cosine on it
    assert res.effects.loc[res.effects["baseline"] == "cosine", "diff"].mean() > 0
    # a value's row is over the queries that have that value
    assert (res.effects.loc[res.effects["label"] == "A", "n_queries"] == 18).all()
    obs = res.observations
    assert list(obs.columns) == ["tau", "label", "factor", "model", "draw", "query", "ap"]
    assert not obs.duplicated(["tau", "label", "factor", "model", "draw", "query"]).any()
    # table.csv holds one mean per value and draw; their means are the summary
    means = res.rows.groupby(["tau", "label", "value", "model"], sort=False)["auprc"].mean()
    summ = res.summary.set_index(["tau", "label", "value", "model"])["auprc"]
    np.testing.assert_allclose(means.loc[summ.index].to_numpy(), summ.to_numpy(), atol=1e-12)
    _check_files(res, tmp_path / "t", {
        "rows": ["tau", "label", "factor", "value", "model", "draw", "auprc"],
        "summary": ["tau", "label", "value", "model", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["tau", "label", "factor", "value", "model", "baseline", "diff", "ci_low", "ci_high", "class",
                    "n_queries"]})


def test_runtime_times_fit_and_search(tmp_path):
    res = ex.runtime(models=["cosine", "softmax", "gaussian"], n_anchors=[32, 64], n_queries=8, n_gallery=40,
                     repeats=1, out_dir=tmp_path, progress=False)
    assert res.config["benchmark"] == "anchordiv.experiments.timing.worker"
    assert res.config["benchmark_params"]["softmax"] == {"tau": 0.01}
    assert set(zip(res.rows["model"], res.rows["n_anchors"])) == {(m, n) for m in ("cosine", "softmax", "gaussian")
                                                                  for n in (32, 64)}
    assert (res.rows["seconds"] > 0).all()
    _check_files(res, tmp_path, {
        "rows": ["model", "n_anchors", "n_queries", "n_gallery", "seconds", "fit_s", "search_s", "samples"],
        "effects": ["model", "n_small", "n_large", "seconds_small", "seconds_large", "growth", "fit_growth",
                    "search_growth"]})


def test_timing_data_is_the_benchmark_data():
    import sys
    from pathlib import Path

    from anchordiv.experiments import timing

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    if not (bench / "benchlib.py").is_file():
        pytest.skip("no benchmarks/ folder")
    sys.path.insert(0, str(bench))
    try:
        import benchlib
    finally:
        sys.path.remove(str(bench))
    for ours, theirs in zip(timing.make_data(40, 5, 12), benchlib.make_data(40, 5, 12)):
        assert torch.equal(ours, theirs)
    assert timing.DIM == benchlib.DIM and timing.TAU == benchlib.TAU
    for m in ("softmax", "gmm", "cosine"):
        assert timing.params(m) == benchlib.MODEL_PARAMS[m]


# ------------------------------------------------------------------- reproducibility
def test_same_seed_same_files(world, tmp_path):
    kw = dict(models=["softmax", "gmm"], proportions=[0, 0.5, 1], n_draws=2, anchor_fraction=0.7, n_boot=100,
              progress=False)
    ex.coordinate(world["data"], world["A"], world["B"], "a", "b", out_dir=tmp_path / "1", seed=3, **kw)
    ex.coordinate(world["data"], world["A"], world["B"], "a", "b", out_dir=tmp_path / "2", seed=3, **kw)
    ex.coordinate(world["data"], world["A"], world["B"], "a", "b", out_dir=tmp_path / "3", seed=4, **kw)
    for name in ("coordinate.csv", "coordinate_summary.csv", "coordinate_effects.csv"):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes()
    assert (tmp_path / "1" / "coordinate.csv").read_bytes() != (tmp_path / "3" / "coordinate.csv").read_bytes()


# ----------------------------------------------------------------------- bad input
def test_bad_input_raises_clear_errors(world):
    data, A = world["data"], world["A"]
    with pytest.raises(ValueError, match="unknown protocol 'figure9'"):
        ex.run_protocol("figure9", data)
    with pytest.raises(ValueError, match="unknown anchor model 'kmeans'"):
        ex.budget(data, A, "a", models=["kmeans"], progress=False)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        ex.coordinate(data, A, world["B"], "a", "b", models=["nope"], progress=False)
    with pytest.raises(ValueError, match="anchors is empty"):
        ex.budget(data, np.zeros((0, D)), "a", progress=False)
    with pytest.raises(ValueError, match="labels 'a' has 5 entries but embeddings has 72 rows"):
        EvalData.create(data.embeddings, {"a": np.arange(5)})
    with pytest.raises(ValueError, match="unknown factor 'colour'"):
        ex.budget(data, A, "colour", progress=False)
    with pytest.raises(ValueError, match="budget 99 exceeds the 12 anchors"):
        ex.budget(data, A, "a", budgets=[2, 99], progress=False)
    with pytest.raises(ValueError, match="dimension 3"):
        ex.table(data, {"A": (ad.AnchorSet(np.eye(3)), "a")}, progress=False)
    with pytest.raises(ValueError, match="need a temperature"):
        ex.budget(EvalData.create(data.embeddings, data.labels), A, "a", progress=False)


# ----------------------------------------------------------------------------- CLI
@pytest.fixture
def cli_files(world, tmp_path):
    import pandas as pd

    data = world["data"]
    coll = tmp_path / "coll.parquet"
    pd.DataFrame({"embedding": list(data.embeddings.astype(np.float32)), "a": data.labels["a"],
                  "b": data.labels["b"]}).to_parquet(coll)
    a_npy, b_npy = tmp_path / "A.npy", tmp_path / "B.npy"
    np.save(a_npy, world["A"].embeddings.numpy())
    np.save(b_npy, world["B"].embeddings.numpy())
    return coll, a_npy, b_npy


def test_eval_command(cli_files, tmp_path):
    from click.testing import CliRunner

    from anchordiv.experiments.cli import eval_command

    coll, a_npy, b_npy = cli_files
    runner = CliRunner()
    out = tmp_path / "out"
    r = runner.invoke(eval_command(), ["budget", str(coll), "--anchors", str(a_npy), "--factor", "a", "--tau", "0.1",
                                       "--budgets", "2,12", "--draws", "2", "--model", "softmax,gaussian",
                                       "--n-boot", "50", "--out", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    assert "few anchors (n = 2)" in r.output
    header, rows = _read(out / "budget_summary.csv")
    assert {row[0] for row in rows} == {"softmax", "gaussian", "cosine", "iti"}
    r = runner.invoke(eval_command(), ["coordinate", str(coll), "--anchors", str(a_npy), "--factor", "a",
                                       "--tau", "0.1", "--out", str(out)])
    assert r.exit_code == 2 and "coordinate takes exactly 2 --anchors, got 1" in r.output
    r = runner.invoke(eval_command(), ["budget", str(coll), "--anchors", str(a_npy), "--factor", "a",
                                       "--model", "kmeans", "--out", str(out)])
    assert r.exit_code == 2 and "unknown model 'kmeans'" in r.output
    r = runner.invoke(eval_command(), ["figure9", str(coll), "--out", str(out)])
    assert r.exit_code == 2 and "figure9" in r.output
    r = runner.invoke(eval_command(), ["budget", str(coll), "--anchors", str(a_npy), "--factor", "a",
                                       "--metric", "ndcg@0", "--out", str(out)])
    assert r.exit_code == 2 and "unknown metric 'ndcg@0'" in r.output
    # a τ list: one run per τ, one summary with a tau column, each equal to its own run
    sweep = ["budget", str(coll), "--anchors", str(a_npy), "--factor", "a", "--budgets", "12", "--draws", "1",
             "--model", "softmax", "--n-boot", "20", "--no-progress"]
    r = runner.invoke(eval_command(), [*sweep, "--tau", "0.05,0.2", "--out", str(out / "sweep")])
    assert r.exit_code == 0, r.output
    assert "τ = 0.05: " in r.output and "τ = 0.2: " in r.output
    header, rows = _read(out / "sweep" / "budget_summary.csv")
    assert header[0] == "tau" and {row[0] for row in rows} == {"0.050000", "0.200000"}
    for t in ("0.05", "0.2"):
        r = runner.invoke(eval_command(), [*sweep, "--tau", t, "--out", str(out / t)])
        assert r.exit_code == 0, r.output
        _, single = _read(out / t / "budget_summary.csv")
        assert [row[1:] for row in rows if float(row[0]) == float(t)] == single
        assert (out / "sweep" / f"tau={t}" / "budget.png").is_file()
    assert "# τ = 0.2" in (out / "sweep" / "budget.md").read_text()
    r = runner.invoke(eval_command(), ["budget", str(coll), "--anchors", str(a_npy), "--factor", "a", "--tau", "0.1",
                                       "--budgets", "12", "--draws", "1", "--model", "softmax", "--metric", "mrr",
                                       "--n-boot", "20", "--out", str(out / "mrr"), "--no-progress"])
    assert r.exit_code == 0 and "metric: mrr (in place of AUPRC)" in r.output, r.output
    header, _ = _read(out / "mrr" / "budget_summary.csv")
    assert "mrr" in header and "auprc" not in header
    md = (out / "mrr" / "budget.md").read_text()
    assert "mrr" in md and "AUPRC" not in md


def test_eval_model_options(cli_files, tmp_path):
    from click.testing import CliRunner

    from anchordiv.experiments.cli import eval_command

    coll, a_npy, b_npy = cli_files
    runner = CliRunner()
    base = ["--tau", "0.1", "--n-boot", "30", "--draws", "2", "--no-progress"]
    comp = ["components", str(coll), "--anchors", str(a_npy), "--factor", "a", "--components", "1,2",
            "--baseline", "softmax", *base]
    # KEY=VALUE goes to every model that takes KEY (here only gmm), MODEL.KEY=VALUE to that model
    for name, param in (("any", "reg_covar=1e-3"), ("one", "gmm.reg_covar=1e-3")):
        r = runner.invoke(eval_command(), [*comp, "--param", param, "--out", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        assert (tmp_path / name / "components.json").read_text().count('"reg_covar": 0.001') == 1
    assert (tmp_path / "any" / "components_summary.csv").read_bytes() == \
        (tmp_path / "one" / "components_summary.csv").read_bytes()
    # --components M is the gmm's number of components; --gmm-components is its deprecated alias
    coord = ["coordinate", str(coll), "--anchors", str(a_npy), "--anchors", str(b_npy), "--factor", "a",
             "--factor", "b", "--model", "gmm", "--proportions", "0,1", *base]
    r = runner.invoke(eval_command(), [*coord, "--components", "2", "--out", str(tmp_path / "new")])
    assert r.exit_code == 0, r.output
    with pytest.warns(FutureWarning, match="--gmm-components is deprecated"):
        r = runner.invoke(eval_command(), [*coord, "--gmm-components", "2", "--out", str(tmp_path / "old")])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "new" / "coordinate.csv").read_bytes() == (tmp_path / "old" / "coordinate.csv").read_bytes()
    assert '"n_components": 2' in (tmp_path / "new" / "coordinate.json").read_text()
    no_gmm = [a if a != "gmm" else "softmax" for a in coord]
    for args, message in (([*no_gmm, "--components", "2"], "gmm, which this run"),
                          ([*comp, "--param", "foo=1"], "takes 'foo'"),
                          ([*comp, "--param", "softmax.rank=2"], "softmax is not fitted")):
        r = runner.invoke(eval_command(), [*args, "--out", str(tmp_path / "x")])
        assert r.exit_code == 2 and message in r.output, r.output


# ------------------------------------------------------------- metrics, multi-label
def _brute_recall_at(D, rel, k):
    """recall@k per query in float64 (no ties in D here), self excluded by D = inf."""
    order = np.argsort(D, axis=1, kind="stable")[:, :k]
    hits = np.take_along_axis(rel, order, 1).sum(1)
    total = rel.sum(1)
    return np.where(total > 0, hits / np.maximum(total, 1), np.nan)


@pytest.mark.parametrize("protocol", ["budget", "components", "coordinate", "adaptation", "table"])
def test_every_protocol_scores_with_the_chosen_metric(world, protocol):
    data = world["data"]
    kw = dict(n_boot=20, progress=False, metric="recall@5", seed=0)
    if protocol == "budget":
        res = ex.budget(data, world["A"], "a", models=["softmax"], baselines=["cosine"], budgets=[12], n_draws=1, **kw)
    elif protocol == "components":
        res = ex.components(data, {"A": (world["A"], "a")}, n_components=[1], n_draws=1, references=["softmax"], **kw)
    elif protocol == "coordinate":
        res = ex.coordinate(data, world["A"], world["B"], "a", "b", models=["softmax"], baselines=["cosine"],
                            proportions=[1.0], n_draws=1, anchor_fraction=1.0, **kw)
    elif protocol == "adaptation":
        res = ex.adaptation(data, world["broad"], world["A"], "a", models=["gaussian"], references=["cosine"],
                            budgets=[12], n_draws=1, **kw)
    else:
        res = ex.table(data, {"A": (world["A"], "a")}, models=["softmax"], baselines=["cosine"], **kw)
    assert res.config["metric"] == "recall@5"
    assert "recall@5" in res.rows.columns and "auprc" not in res.rows.columns
    if protocol == "budget":  # the plot's axes name the metric too
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from anchordiv.experiments.report import name_metric

        fig, ax = plt.subplots()
        ax.set_ylabel("AUPRC (a)")
        ax.set_xlabel("AUPRC difference")
        name_metric(fig, "recall@5")
        assert (ax.get_ylabel(), ax.get_xlabel()) == ("recall@5 (a)", "recall@5 difference")
        plt.close(fig)
    assert "recall@5" in res.summary.columns
    # the cosine observations are recall@5 of cosine, computed directly
    X = data.embeddings
    D = 1 - X @ X.T
    np.fill_diagonal(D, np.inf)
    lab = data.labels["a"]
    rel = lab[:, None] == lab[None, :]
    np.fill_diagonal(rel, False)
    model_col = "method" if protocol == "adaptation" else "model"
    obs = res.observations[res.observations[model_col] == "cosine"]
    if "factor" in obs.columns:
        obs = obs[obs["factor"] == "a"]
    first = obs.drop_duplicates("query")
    np.testing.assert_allclose(first["ap"].to_numpy(), _brute_recall_at(D, rel, 5)[first["query"].to_numpy()],
                               atol=1e-12)
    with pytest.raises(ValueError, match="unknown metric 'recall@x'"):
        ex.table(data, {"A": (world["A"], "a")}, metric="recall@x", progress=False)


def test_multilabel_table_in_python_matches_brute_force():
    rng = np.random.default_rng(1)
    names = ["Pleural Effusion", "lung_opacity", "Cardiomegaly"]
    dirs = rng.normal(size=(3, D))
    Y = rng.random((50, 3)) < 0.4
    X = _unit(Y @ dirs + 0.7 * rng.normal(size=(50, D)))
    cells = ["|".join(n for n, y in zip(names, row) if y) for row in Y]
    cells[0] = ""  # an item without any finding
    Y[0] = False
    data = EvalData.create(X, {"findings": cells}, multilabel=["findings"], tau=TAU)
    assert data.label_names("findings") == sorted(names)
    # parquet-style list cells give the same labels
    lists = EvalData.create(X, {"findings": [c.split("|") if c else [] for c in cells]}, multilabel="findings")
    assert (lists.multilabels["findings"] == data.multilabels["findings"]).all()
    sets = {"pleural effusion": ad.AnchorSet(_unit(dirs[[0]] + 0.2 * rng.normal(size=(4, D)))),
            "Lung Opacity": ad.AnchorSet(_unit(dirs[[1]] + 0.2 * rng.normal(size=(4, D)))),
            "heart": ad.AnchorSet(_unit(dirs[[2]] + 0.2 * rng.normal(size=(4, D))))}
    entries = {"pleural effusion": (sets["pleural effusion"], "findings"),
               "Lung Opacity": (sets["Lung Opacity"], "findings"),
               "heart": (sets["heart"], "findings=cardiomegaly")}
    res = ex.table(data, entries, models=["softmax"], baselines=["cosine"], n_boot=20, progress=False)
    assert set(res.config["settings"].values()) == {
        "per-label on multi-label findings: queries = the items carrying the label, relevant = the other items "
        "carrying it"}
    for name, col in (("pleural effusion", 0), ("Lung Opacity", 1), ("heart", 2)):
        g = ad.Softmax(tau=TAU).fit(sets[name])
        Dm = g.pairwise(X, X).astype(np.float64)
        np.fill_diagonal(Dm, np.inf)
        has = Y[:, col]
        rel = has[:, None] & has[None, :]
        np.fill_diagonal(rel, False)
        ref = mean_average_precision(Dm[has], rel[has])
        got = res.summary[(res.summary["label"] == name) & (res.summary["model"] == "softmax")]
        assert float(got["auprc"].iloc[0]) == pytest.approx(ref.mean, abs=1e-9)
        assert int(got["n_queries"].iloc[0]) == int(has.sum())
    # a 0/1 factor gets the per-label setting by default; all_queries via per_value=False
    flags = EvalData.create(X, {"effusion": Y[:, 0].astype(int)}, tau=TAU)
    res = ex.table(flags, {"e": (sets["pleural effusion"], "effusion")}, n_boot=20, progress=False)
    assert res.summary["value"].unique().tolist() == ["1"]
    res = ex.table(flags, {"e": (sets["pleural effusion"], "effusion")}, per_value=False, n_boot=20, progress=False)
    assert res.summary["value"].unique().tolist() == ["all"]
    assert "all items as queries" in res.config["settings"]["e"]
    with pytest.raises(ValueError, match="no label of 'findings' matches 'heart'"):
        ex.table(data, {"heart": (sets["heart"], "findings")}, progress=False)
    with pytest.raises(ValueError, match="multilabel names \\['nope'\\]"):
        EvalData.create(X, {"findings": cells}, multilabel=["nope"])


def test_multilabel_parquet_lists_and_custom_separator(tmp_path):
    import pandas as pd

    from anchordiv.io import load_collection

    rng = np.random.default_rng(2)
    X = _unit(rng.normal(size=(6, D))).astype(np.float32)
    lists = [["a", "b"], ["b"], [], ["a"], ["a", "c"], ["c"]]
    pd.DataFrame({"embedding": list(X), "tags": lists, "flat": [";".join(x) for x in lists]}).to_parquet(
        tmp_path / "c.parquet")
    coll = load_collection(tmp_path / "c.parquet")
    data = EvalData.from_collection(coll, factors=["tags"], multilabel=["tags"])
    semi = EvalData.from_collection(coll, factors=["flat"], multilabel=["flat"], sep=";")
    assert data.label_names("tags") == semi.label_names("flat") == ["a", "b", "c"]
    flagged, name = data.flag_factor("tags", "a")
    assert name == "tags=a" and flagged.labels[name].tolist() == [True, False, False, True, True, False]
    assert "tags (3 labels, multi-label)" in data.describe()
    with pytest.raises(ValueError, match="sep must be a non-empty string"):
        EvalData.from_collection(coll, factors=["flat"], multilabel=["flat"], sep="")
