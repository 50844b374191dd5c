"""The experiment protocols: one function per claim of Kannan, Park, Veitch (2026), §5 and App. F.

=============  ==============  ===========================================================
protocol       paper           sweeps
=============  ==============  ===========================================================
coordinate     §5.2, Fig. 3    mixture q_p = p·q_A + (1 − p)·q_B; AUPRC on factors A and B
budget         §5.3, Figs 4, 6 anchor budget over random subsets, every model and baseline
adaptation     §5.4, Fig. 5    target-anchor budget; posterior (broad → target) vs target-only
components     App. F.3, Fig 7 number of GMM components, per anchor set
table          Tables 2, 3     per-label AUPRC differences against cosine and ITI
runtime        App. F.4, Tab 4 fit + search time against the number of anchors
=============  ==============  ===========================================================

Each protocol takes an :class:`~anchordiv.experiments.core.EvalData` (embeddings and
labels; ``runtime`` draws its own data), anchor sets and model names, is seeded (the same
arguments give the same files), and returns a
:class:`~anchordiv.experiments.report.ProtocolResult` of tidy DataFrames: the per-query
observations, the mean AP per condition and draw, the summary (means with 95 %
bootstrap intervals over draws and queries) and the paired effects that test the claim.
With ``out_dir`` it writes ``<protocol>.csv``, ``_summary.csv``, ``_effects.csv``,
``.md`` (tables and a verdict), ``.png`` and ``.json`` (parameters and timings).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from .._util import positive_int
from ..anchors import AnchorSet
from ..models import model_names
from .core import (
    ANCHOR_MODELS,
    BASELINES,
    PARAMETRIC,
    POSTERIOR_MODELS,
    EvalData,
    Timer,
    build_geometry,
    check_anchor_set,
    check_entries,
    check_models,
    check_seed,
    draw_seed,
    fit_score,
    honours_progress,
    positive_value,
    progress_bar,
    resolve_entries,
    resolve_tau,
    run_config,
    score,
    subsample,
)
from .report import (
    TIE,
    EffectPlot,
    LinePlot,
    Observations,
    ProtocolResult,
    Report,
    broadcast,
    bullets,
    ci_text,
    color,
    groups,
    long_table,
    paired_effect,
    paired_effects,
    per_draw,
    pivot_table,
    summarize,
    tidy,
    verdict,
    write_outputs,
)

__all__ = ["coordinate", "budget", "adaptation", "components", "table", "table_setting", "runtime", "sweep_tau",
           "PROTOCOLS", "run_protocol"]

#: Columns of every summary after the condition columns.
STATS = ["auprc", "ci_low", "ci_high", "n_draws", "n_queries"]
#: Columns of every effects table after the labels of the comparison.
EFFECT = ["diff", "ci_low", "ci_high", "verdict"]
_DIFF = ("difference [95 %]", lambda e: ci_text(e, signed=True))


def _result(name: str, obs: pd.DataFrame, rows: pd.DataFrame, summary: list, by: Sequence[str], effects: list,
            effect_columns: Sequence[str], config: dict, seconds: float, report: Report, out_dir: Any,
            data: EvalData) -> ProtocolResult:
    """The frames of a protocol run, written to ``out_dir``; the value column is named after the metric."""
    res = ProtocolResult(name, obs, rows, tidy(summary, [*by, *STATS]), tidy(effects, effect_columns), config,
                         seconds=seconds)
    res = write_outputs(res, report, out_dir, data.describe())
    metric = config.get("metric", "auprc")
    if metric != "auprc":
        res.rows, res.summary = (f.rename(columns={"auprc": metric}) for f in (res.rows, res.summary))
    return res


def _budgets(budgets: Sequence[int] | None, n: int, what: str) -> list[int]:
    """Sorted budgets (default 2, 4, 8, ... below ``n``, and ``n``), each at most ``n``."""
    default = [b for b in (2 ** e for e in range(1, 20)) if b < n] + [n]
    out = sorted({int(positive_int(b, "budget")) for b in (budgets or default)})
    if out[-1] > n:
        raise ValueError(f"budget {out[-1]} exceeds the {n} {what}; use budgets <= {n}.")
    return out


def _fit_models(obs: Observations, bar: Any, names: Sequence[str], anchors: AnchorSet | None, data: EvalData,
                on: str, tau: float | None, params: Mapping | None, seed: int, /, **condition: Any) -> None:
    """Fit and score each geometry of ``names`` on ``anchors`` by factor ``on``; one observation
    block per geometry that could be fitted, with ``model`` and ``condition``."""
    for m in names:
        res = fit_score(m, anchors, data, [on], tau, params, seed)
        bar.update()
        if res is not None:
            obs.add(res[on], data.queries, model=m, **condition)


# ============================================================================ coordinate
@honours_progress
def coordinate(data: EvalData, anchors_a: AnchorSet, anchors_b: AnchorSet, factor_a: str, factor_b: str, *,
               models: Sequence[str] = ("softmax",), baselines: Sequence[str] = ("cosine",),
               proportions: Sequence[float] | None = None, n_draws: int = 5, anchor_fraction: float = 0.8,
               tau: float | None = None, model_params: Mapping[str, Mapping[str, Any]] | None = None,
               out_dir: Any = None, seed: int = 0, n_boot: int = 1000, progress: bool | str | None = None,
               names: tuple[str, str] | None = None) -> ProtocolResult:
    """Anchor distributions select the semantic coordinate (paper §5.2, Fig. 3).

    For each random draw of the two anchor sets and each proportion p, the mixture
    :math:`q_p = p\\,q_A + (1-p)\\,q_B` (:meth:`AnchorSet.mixture`) defines a geometry per
    model, scored by AUPRC on factor A and on factor B. The claim holds for a model when
    moving from p = 0 to p = 1 raises AUPRC on A and lowers it on B.

    Parameters
    ----------
    data : EvalData
        The collection; ``factor_a`` and ``factor_b`` are two of its label factors.
    anchors_a, anchors_b : AnchorSet
        Anchors naming the values of factor A and of factor B.
    factor_a, factor_b : str
        The factors the two anchor sets describe.
    models : sequence of str, optional
        Anchor models and/or ``iti`` fitted on every mixture.
    baselines : sequence of str, optional
        Geometries independent of p (``cosine``), shown as references.
    proportions : sequence of float, optional
        Values of p in [0, 1] (default 0, 0.1, ..., 1).
    n_draws : int, optional
        Random realisations of the anchor sets (paper: 10).
    anchor_fraction : float, optional
        Fraction of each set kept in a draw (1 keeps all; draws then differ only in the
        GMM seed).
    tau : float, optional
        Temperature (default: ``data.tau``).
    model_params : mapping, optional
        Per-model parameters, e.g. ``{"gmm": {"n_components": 8}}``.
    out_dir : path, optional
        Where to write the files (nothing is written when None).
    seed : int, optional
        Seed of the draws, the GMM initialisation and the bootstrap.
    n_boot : int, optional
        Bootstrap replicates of the intervals.
    progress : bool or "log", optional
        Show the progress bar (default: on a terminal); ``"log"`` prints one line per step.
    names : (str, str), optional
        Display names of the two anchor sets (default: the factor names).

    Returns
    -------
    ProtocolResult
        ``observations``: model, p, draw, factor, role (A/B), n_anchors, query, ap (p
        empty for the baselines); ``summary`` per (model, p, factor, role), baselines at
        every p; ``effects``: per model the change from p = 0 to p = 1 on each factor.
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = positive_int(n_draws, "n_draws")
    models = check_models(models)
    baselines = check_models(baselines, ("cosine",), "p-independent baseline")
    if not models:
        raise ValueError("models is empty; give at least one model.")
    tau = resolve_tau(tau, data, models)
    A = check_anchor_set(anchors_a, data, "anchors_a")
    B = check_anchor_set(anchors_b, data, "anchors_b")
    fa, fb = data.check_factor(factor_a), data.check_factor(factor_b)
    if fa == fb:
        raise ValueError("factor_a and factor_b are the same factor; pick two different ones.")
    ps = [round(float(p), 6) for p in (np.linspace(0, 1, 11) if proportions is None else proportions)]
    if not ps or any(not 0 <= p <= 1 for p in ps):
        raise ValueError(f"proportions must be values in [0, 1], got {ps}.")
    names = names or (fa, fb)
    role = {fa: "A", fb: "B"}

    obs = Observations()
    bar = progress_bar(n_draws * len(ps) * len(models) + len(baselines), "coordinate", progress)
    base = {}
    for b in baselines:
        base[b] = fit_score(b, None, data, [fa, fb], tau, model_params, seed)
        bar.update()
    for r in range(n_draws):
        A_r = subsample(A, anchor_fraction, draw_seed(seed, 0, r))
        B_r = subsample(B, anchor_fraction, draw_seed(seed, 1, r))
        for p in ps:
            mix = AnchorSet.mixture([A_r, B_r], [p, 1 - p])
            for m in models:
                res = fit_score(m, mix, data, [fa, fb], tau, model_params, draw_seed(seed, 2, r))
                bar.update()
                for f in (fa, fb) if res is not None else ():
                    obs.add(res[f], data.queries, model=m, p=p, draw=r, factor=f, role=role[f],
                            n_anchors=len(mix.support()))
    bar.close()
    for b, res in base.items():
        for f in (fa, fb):
            obs.add(res[f], data.queries, model=b, p=None, draw=0, factor=f, role=role[f], n_anchors=0)
    keys = ["model", "p", "draw", "factor", "role", "n_anchors"]
    obs = obs.frame(keys)
    rows = per_draw(obs, keys, ["model", "p", "draw", "factor", "role", "auprc", "n_anchors"])
    by = ["model", "p", "factor", "role"]
    mats = groups(broadcast(obs, "p", ps), by)
    summary = summarize(mats, by, n_boot, seed)

    p0, p1 = min(ps), max(ps)
    comparisons = []
    for m in models:
        hi_a, lo_a = (m, p1, fa, "A"), (m, p0, fa, "A")
        hi_b, lo_b = (m, p1, fb, "B"), (m, p0, fb, "B")
        comparisons += [({"model": m, "factor": fa, "role": "A", "comparison": f"AUPRC(p={p1:g}) - AUPRC(p={p0:g})"},
                         hi_a, lo_a),
                        ({"model": m, "factor": fb, "role": "B", "comparison": f"AUPRC(p={p0:g}) - AUPRC(p={p1:g})"},
                         lo_b, hi_b)]
    effects = paired_effects(mats, comparisons, n_boot, seed)
    verdicts = []
    for m in models:
        es = {e["role"]: e for e in effects if e["model"] == m}
        if "A" in es and "B" in es:
            ok = all(verdict(es[k]) == "holds" for k in "AB")
            on_b = {"diff": -es["B"]["diff"], "ci_low": -es["B"]["ci_high"], "ci_high": -es["B"]["ci_low"]}
            verdicts.append(f"{m}: p {p0:g} → {p1:g} changes AUPRC on {fa} by {ci_text(es['A'], signed=True)} and on "
                            f"{fb} by {ci_text(on_b, signed=True)} → {'holds' if ok else 'does not hold'}")
    seconds = timer()
    config = run_config("coordinate", data, seconds, verdicts, models=models, baselines=baselines, factor_a=fa,
                        factor_b=fb,
                        anchor_sets={"A": {"name": names[0], "n": len(A)}, "B": {"name": names[1], "n": len(B)}},
                        proportions=ps, n_draws=n_draws, anchor_fraction=anchor_fraction, tau=tau,
                        model_params=model_params or {}, seed=seed, n_boot=n_boot)

    at = {(s["model"], s["p"], s["factor"]): s for s in summary}
    sections = [("Mean AUPRC [95 % interval] against p", pivot_table(
        summary, [(p, [f"{p:g}"]) for p in ps], [((m, f), f"{m} · {role[f]} ({f})") for m in models for f in (fa, fb)],
        lambda s: s["p"], lambda s: (s["model"], s["factor"]), ci_text, ["p"]))]
    if baselines:
        sections.append((None, "References (independent of p): " + "; ".join(
            f"{b} · {role[f]} ({f}) {ci_text(at[(b, p0, f)])}" for b in baselines for f in (fa, fb))))
    sections += [("Verdict", bullets(verdicts)),
                 ("Effect of the mixture (paired over draws and queries)", long_table(effects, [
                     ("model", "model"), ("factor", lambda e: f"{e['role']} ({e['factor']})"),
                     ("comparison", "comparison"), _DIFF, ("verdict", "verdict")]))]
    report = Report(
        "Coordinate control: AUPRC on two factors as the anchor mixture moves from B to A",
        "Anchor distributions select the semantic coordinate (paper §5.2, Fig. 3): raising the mass p of "
        "factor-A anchors raises retrieval by factor A and lowers retrieval by factor B.",
        {"anchor set A": f"{names[0]} ({len(A)} anchors) → factor `{fa}`",
         "anchor set B": f"{names[1]} ({len(B)} anchors) → factor `{fb}`",
         "mixture": "q_p = p·q_A + (1 − p)·q_B", "temperature τ": tau,
         "draws": f"{n_draws} (each keeps {anchor_fraction:g} of each set), seed {seed}",
         "runtime": f"{seconds:.1f} s"},
        sections,
        LinePlot(x="p", series=("model", "factor"), xlabel=f"p (mass of {names[0]} anchors; 1 − p on {names[1]})",
                 title="Anchor mixture selects the semantic coordinate (solid: A, dashed: B)", title_size=10,
                 style=lambda s: "-" if s[1] == fa else "--", flat=lambda s: s[0] in baselines, figsize=(9.5, 5)))
    return _result("coordinate", obs, rows, summary, by, effects, ["model", "factor", "role", "comparison", *EFFECT],
                   config, seconds, report, out_dir, data)


# =============================================================================== budget
@honours_progress
def budget(data: EvalData, anchors: AnchorSet, factor: str, *, budgets: Sequence[int] | None = None,
           models: Sequence[str] = ANCHOR_MODELS, baselines: Sequence[str] = BASELINES, n_draws: int = 5,
           tau: float | None = None, model_params: Mapping[str, Mapping[str, Any]] | None = None,
           out_dir: Any = None, seed: int = 0, n_boot: int = 1000, progress: bool | str | None = None,
           name: str | None = None) -> ProtocolResult:
    """Parametric models with few anchors, softmax at full coverage (paper §5.3, Figs. 4, 6).

    For each budget n and random draw, ``n`` anchors are drawn from ``anchors`` without
    replacement; every model (and ITI) is fitted on the same subset and scored by AUPRC
    on ``factor``. Cosine needs no anchors and is scored once. At the full budget every
    draw holds the whole set, so it is evaluated once (GMM: with the first draw's seed).

    Models fit what a subset allows: a GMM has at most n components, an integer latent
    rank is at most n − 1, and models needing 2 anchors (Gaussian, GMM, latent) skip n = 1.

    Parameters
    ----------
    data : EvalData
        The collection.
    anchors : AnchorSet
        The full anchor set (e.g. one prompt per class name).
    factor : str
        The factor the anchors describe.
    budgets : sequence of int, optional
        Anchor counts (default: 2, 4, 8, ... below the set size, and the set size).
    models : sequence of str, optional
        Anchor models.
    baselines : sequence of str, optional
        ``cosine`` and/or ``iti``.
    n_draws : int, optional
        Random subsets per budget.
    tau, model_params, out_dir, seed, n_boot, progress
        As in :func:`coordinate`.
    name : str, optional
        Display name of the anchor set.

    Returns
    -------
    ProtocolResult
        ``observations``: model, budget, draw, n_anchors, query, ap (budget empty for
        cosine); ``summary`` per (model, budget), cosine at every budget; ``effects``:
        each parametric model minus softmax at each budget (paired).
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = positive_int(n_draws, "n_draws")
    models = check_models(models, {"anchor_model": True}, "anchor model")
    baselines = check_models(baselines, {"anchor_model": False}, "baseline")
    if not models and not baselines:
        raise ValueError("models and baselines are both empty.")
    tau = resolve_tau(tau, data, models)
    S = check_anchor_set(anchors, data, "anchors")
    f = data.check_factor(factor)
    N = len(S)
    budgets = _budgets(budgets, N, "anchors")
    fitted = list(models) + [b for b in baselines if b != "cosine"]

    obs = Observations()
    total = sum(1 if b == N else n_draws for b in budgets) * len(fitted) + ("cosine" in baselines)
    bar = progress_bar(total, "budget", progress)
    cos = None
    if "cosine" in baselines:
        cos = fit_score("cosine", None, data, [f], tau, model_params, seed)[f]
        bar.update()
    for b in budgets:
        for r in range(1 if b == N else n_draws):
            sub = S if b == N else S.subsample(b, seed=draw_seed(seed, b, r))
            _fit_models(obs, bar, fitted, sub, data, f, tau, model_params, draw_seed(seed, 1, r), budget=b, draw=r,
                        n_anchors=b)
    bar.close()
    if cos is not None:
        obs.add(cos, data.queries, model="cosine", budget=None, draw=0, n_anchors=0)
    obs = obs.frame(["model", "budget", "draw", "n_anchors"])
    rows = per_draw(obs, ["model", "budget", "draw", "n_anchors"], ["model", "budget", "draw", "auprc", "n_anchors"])
    by = ["model", "budget"]
    mats = groups(broadcast(obs, "budget", budgets), by)
    summary = summarize(mats, by, n_boot, seed)
    effects = paired_effects(mats, [({"budget": b, "model": m, "comparison": f"{m} - softmax"}, (m, b), ("softmax", b))
                                    for b in budgets for m in models if m != "softmax"], n_boot, seed)
    at = {(s["model"], s["budget"]): s for s in summary}
    verdicts = _budget_verdicts(budgets, models, mats, at, n_boot, seed, N)
    seconds = timer()
    config = run_config("budget", data, seconds, verdicts, models=models, baselines=baselines, factor=f,
                        anchor_set={"name": name or f, "n": N}, budgets=budgets, n_draws=n_draws, tau=tau,
                        model_params=model_params or {}, seed=seed, n_boot=n_boot)

    shown = models + list(baselines)
    report = Report(
        "Anchor budget: AUPRC against the number of anchors",
        "Parametric anchor models are strongest with limited anchors, while softmax improves with coverage and "
        "is strongest with the full anchor set (paper §5.3, Figs. 4 and 6).",
        {"anchors": f"{name or f} ({N} anchors) → factor `{f}`", "temperature τ": tau,
         "draws": f"{n_draws} random subsets per budget (the full set once), seed {seed}",
         "runtime": f"{seconds:.1f} s"},
        [("Mean AUPRC [95 % interval] (best per budget in bold)", pivot_table(
            summary, [(b, [b]) for b in budgets], [(m, m) for m in shown], lambda s: s["budget"],
            lambda s: s["model"], ci_text, ["budget"], best="auprc")),
         ("Verdict", bullets(verdicts)),
         ("Parametric minus softmax (paired over draws and queries)", long_table(effects, [
             ("budget", "budget"), ("comparison", "comparison"), _DIFF, ("verdict", "verdict")]))],
        LinePlot(x="budget", series=("model",), logx=2, xlabel="number of anchors", ylabel=f"AUPRC ({f})",
                 title="AUPRC against the anchor budget", style=lambda s: "--" if s[0] in BASELINES else "-",
                 order=[(m,) for m in shown],
                 legend_size=8, figsize=(8.5, 4.8)))
    return _result("budget", obs, rows, summary, by, effects, ["budget", "model", "comparison", *EFFECT], config,
                   seconds, report, out_dir, data)


def _budget_verdicts(budgets, models, mats, at, n_boot, seed, N) -> list[str]:
    """The budget claim at the smallest contested budget and at the full set."""
    para = [m for m in models if m in PARAMETRIC]
    if "softmax" not in models or not para:
        return ["needs softmax and at least one parametric model"]
    out = []
    small = [b for b in budgets if ("softmax", b) in mats and any((m, b) in mats for m in para)]
    if small:
        b0 = small[0]
        best = max((m for m in para if (m, b0) in at), key=lambda m: at[(m, b0)]["auprc"])
        e = paired_effect(mats[(best, b0)], mats[("softmax", b0)], n_boot, seed)
        out.append(f"few anchors (n = {b0}): best parametric (highest mean) {best} − softmax = "
                   f"{ci_text(e, signed=True)} → {verdict(e)}")
    if ("softmax", N) in mats:
        cands = [m for m in para if (m, N) in at]
        if cands:
            best = max(cands, key=lambda m: at[(m, N)]["auprc"])
            e = paired_effect(mats[("softmax", N)], mats[(best, N)], n_boot, seed)
            out.append(f"full set (n = {N}): softmax − best parametric (highest mean) {best} = "
                       f"{ci_text(e, signed=True)} → {verdict(e)}")
        contested = [b for b in budgets if ("softmax", b) in at and any((m, b) in at for m in para)]
        wins = [b for b in contested if all(at[("softmax", b)]["auprc"] >= at[(m, b)]["auprc"]
                                            for m in para if (m, b) in at)]
        if wins:
            out.append(f"softmax has the highest mean AUPRC of the anchor models from n = {min(wins)} on" if
                       all(b in wins for b in contested if b >= min(wins)) else
                       f"softmax has the highest mean AUPRC of the anchor models at n ∈ {wins}")
        else:
            out.append("softmax never has the highest mean AUPRC of the anchor models")
    return out


# =========================================================================== adaptation
_ADAPT_DEFAULTS = {"latent_gaussian": {"rank": 128}, "latent_spherical": {"rank": 128}}


@honours_progress
def adaptation(data: EvalData, broad: AnchorSet, target: AnchorSet, factor: str, *,
               budgets: Sequence[int] | None = None, models: Sequence[str] = POSTERIOR_MODELS,
               references: Sequence[str] = ("softmax", "cosine"), include_broad: bool = True, n_draws: int = 5,
               tau: float | None = None, model_params: Mapping[str, Mapping[str, Any]] | None = None,
               out_dir: Any = None, seed: int = 0, n_boot: int = 1000, progress: bool | str | None = None,
               names: tuple[str, str] | None = None) -> ProtocolResult:
    """Posterior models adapt a broad geometry with few target anchors (paper §5.4, Fig. 5).

    Each model in ``models`` is fitted once on the broad anchors (the prior, App. D step 1).
    For each target budget n and random draw of n target anchors it is scored three ways:
    ``posterior <model>`` (``fit(target, prior=broad_fit)``, App. D.2–D.5),
    ``<model>`` fitted on the target anchors alone, and (``include_broad``) ``broad
    <model>``, the prior itself. ``references`` (softmax, ITI on the target anchors;
    cosine) complete Fig. 5. The claim holds for a model when the posterior beats its
    target-only fit at small budgets, the gap narrowing as n grows.

    Latent models use rank k = 128 unless ``model_params`` says otherwise (App. E.5);
    the posterior keeps the broad k, and a target-only fit uses min(k, n − 1). A
    target-only GMM has at most n components; the posterior GMM keeps the broad M.

    Parameters
    ----------
    data : EvalData
        The collection.
    broad : AnchorSet
        Broad, related anchors (e.g. WordNet lemmas).
    target : AnchorSet
        Target anchors (e.g. class names); subsets of it are the budgets.
    factor : str
        The factor the target anchors describe.
    budgets : sequence of int, optional
        Target-anchor counts (default: 2, 4, 8, ... below the target size, and the size).
    models : sequence of str, optional
        Models with a posterior update: gaussian, gmm, latent_gaussian, latent_spherical.
    references : sequence of str, optional
        Target-only ``softmax``/``iti`` and ``cosine``.
    include_broad : bool, optional
        Also score each broad fit (independent of n).
    n_draws, tau, model_params, out_dir, seed, n_boot, progress
        As in :func:`budget`.
    names : (str, str), optional
        Display names of the broad and target sets.

    Returns
    -------
    ProtocolResult
        ``observations``: method, model, kind (posterior / target / broad / reference),
        budget, draw, query, ap (budget empty for the broad fits and cosine); ``summary``
        per (method, budget); ``effects``: posterior minus target-only, minus softmax and
        minus broad, per model and budget.
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = positive_int(n_draws, "n_draws")
    models = check_models(models, {"accepts_prior": True}, "posterior model")
    references = check_models(references, ("softmax", "iti", "cosine"), "reference")
    if not models:
        raise ValueError("models is empty; give at least one of " + ", ".join(POSTERIOR_MODELS) + ".")
    tau = resolve_tau(tau, data, list(models) + list(references))
    Bd = check_anchor_set(broad, data, "broad")
    T = check_anchor_set(target, data, "target")
    f = data.check_factor(factor)
    N = len(T)
    budgets = _budgets(budgets, N, "target anchors")
    params = {k: dict(v) for k, v in _ADAPT_DEFAULTS.items()}
    for k, v in (model_params or {}).items():
        params.setdefault(k, {}).update(v)
    names = names or ("broad", "target")

    obs = Observations()
    fitted_refs = [r for r in references if r != "cosine"]
    total = len(models) + sum(1 if b == N else n_draws for b in budgets) * (2 * len(models) + len(fitted_refs))
    bar = progress_bar(total + ("cosine" in references), "adaptation", progress)
    priors = {}
    for m in models:
        priors[m] = build_geometry(m, tau, len(Bd), data.dim, params, seed).fit(Bd)
        if include_broad:
            obs.add(score(priors[m], data, [f])[f], data.queries, method=f"broad {m}", model=m, kind="broad",
                    budget=None, draw=0)
        bar.update()
    if "cosine" in references:
        obs.add(fit_score("cosine", None, data, [f], tau, params, seed)[f], data.queries, method="cosine",
                model="cosine", kind="reference", budget=None, draw=0)
        bar.update()
    for b in budgets:
        for r in range(1 if b == N else n_draws):
            sub = T if b == N else T.subsample(b, seed=draw_seed(seed, b, r))
            jobs = [(m, m, "target", None) for m in models] + \
                   [(f"posterior {m}", m, "posterior", priors[m]) for m in models] + \
                   [(ref, ref, "reference", None) for ref in fitted_refs]
            for method, m, kind, prior in jobs:
                clip_n = len(Bd) if prior is not None else None
                res = fit_score(m, sub, data, [f], tau, params, draw_seed(seed, 1, r), prior=prior, clip_n=clip_n)
                bar.update()
                if res is not None:
                    obs.add(res[f], data.queries, method=method, model=m, kind=kind, budget=b, draw=r)
    bar.close()
    keys = ["method", "model", "kind", "budget", "draw"]
    obs = obs.frame(keys)
    rows = per_draw(obs, keys, [*keys, "auprc"])
    by = ["method", "budget"]
    mats = groups(broadcast(obs, "budget", budgets), by)
    summary = summarize(mats, by, n_boot, seed)
    effects = paired_effects(mats, [({"model": m, "budget": b, "comparison": f"posterior {m} - {other}"},
                                     (f"posterior {m}", b), (other, b))
                                    for m in models for b in budgets for other in (m, "softmax", f"broad {m}")],
                             n_boot, seed)
    verdicts = []
    for m in models:
        es = [e for e in effects if e["model"] == m and e["comparison"] == f"posterior {m} - {m}"]
        if not es:
            verdicts.append(f"{m}: not measured")
            continue
        first, last = es[0], es[-1]
        narrowing = "narrows" if abs(last["diff"]) < abs(first["diff"]) else "does not narrow"
        text = (f"{m}: posterior − target-only at n = {first['budget']}: {ci_text(first, signed=True)} → "
                f"{verdict(first)}; at n = {last['budget']}: {ci_text(last, signed=True)} (gap {narrowing})")
        vs_broad = [e for e in effects if e["model"] == m and e["comparison"] == f"posterior {m} - broad {m}"]
        if vs_broad:
            best = max(vs_broad, key=lambda e: e["diff"])
            text += f"; posterior − broad fit: at best {ci_text(best, signed=True)} (n = {best['budget']})"
        verdicts.append(text)
    seconds = timer()
    prior_info = {m: {k: v for k, v in (("n_components", getattr(p, "n_components", None)),
                                        ("k", getattr(p, "n_components_", None))) if v is not None}
                  for m, p in priors.items()}
    config = run_config("adaptation", data, seconds, verdicts, models=models, references=references, factor=f,
                        broad={"name": names[0], "n": len(Bd)}, target={"name": names[1], "n": N}, budgets=budgets,
                        n_draws=n_draws, tau=tau, model_params=params, priors=prior_info, seed=seed, n_boot=n_boot,
                        include_broad=include_broad)

    methods = [f"posterior {m}" for m in models] + list(models) + \
        ([f"broad {m}" for m in models] if include_broad else []) + list(references)
    report = Report(
        "Posterior adaptation: broad anchors as a prior, few target anchors",
        "Posterior anchor models adapted from broad anchors beat target-only models when target anchors are "
        "scarce, and the advantage narrows as target coverage grows (paper §5.4, Fig. 5).",
        {"broad anchors": f"{names[0]} ({len(Bd)})", "target anchors": f"{names[1]} ({N}) → factor `{f}`",
         "broad fits": ", ".join(f"{m} {v}" for m, v in prior_info.items()),
         "temperature τ": tau, "draws": f"{n_draws} random target subsets per budget (the full set once), seed {seed}",
         "runtime": f"{seconds:.1f} s"},
        [("Mean AUPRC [95 % interval] (best per budget in bold)", pivot_table(
            summary, [(b, [b]) for b in budgets], [(m, m) for m in methods], lambda s: s["budget"],
            lambda s: s["method"], ci_text, ["budget"], best="auprc")),
         ("Verdict", bullets(verdicts)),
         ("Posterior minus other geometries (paired over draws and queries)", long_table(effects, [
             ("model", "model"), ("budget", "budget"), ("comparison", "comparison"), _DIFF, ("verdict", "verdict")]))],
        LinePlot(x="budget", series=("method",), logx=2, xlabel="number of target anchors", ylabel=f"AUPRC ({f})",
                 title="Posterior (solid) vs target-only (dotted); broad fit (dash-dot)", title_size=10,
                 color=lambda s: color(s[0].split(" ")[-1]), flat=lambda s: s[0].startswith("broad"),
                 order=[(m,) for m in methods],
                 style=lambda s: "-" if s[0].startswith("posterior") else "-." if s[0].startswith("broad") else
                 ":" if s[0] in models or s[0] in ("softmax", "iti") else "--", figsize=(9.5, 5)))
    return _result("adaptation", obs, rows, summary, by, effects, ["model", "budget", "comparison", *EFFECT], config,
                   seconds, report, out_dir, data)


# =========================================================================== components
@honours_progress
def components(data: EvalData, anchor_sets: Any, *, n_components: Sequence[int] = (1, 2, 4, 8),
               n_draws: int = 3, references: Sequence[str] = ("softmax", "cosine"), tau: float | None = None,
               model_params: Mapping[str, Mapping[str, Any]] | None = None, out_dir: Any = None, seed: int = 0,
               n_boot: int = 1000, progress: bool | str | None = None) -> ProtocolResult:
    """Mixture complexity against anchor-set structure (paper App. F.3, Fig. 7).

    For each anchor set (with the factor it describes) and each number of components M,
    a GMM is fitted ``n_draws`` times (different k-means++ seeds) and scored by AUPRC.
    M larger than the set is skipped. The paper's diagnostic: more components help a
    heterogeneous anchor set more than a narrow one.

    Parameters
    ----------
    data : EvalData
        The collection.
    anchor_sets : mapping of str to (AnchorSet, str), or list of (name, AnchorSet, factor)
        The anchor sets to compare, each with its factor.
    n_components : sequence of int, optional
        Values of M.
    n_draws : int, optional
        GMM initialisations per M.
    references : sequence of str, optional
        Geometries shown for comparison (fitted once per set): any registry names.
    tau, model_params, out_dir, seed, n_boot, progress
        As in :func:`coordinate` (``model_params["gmm"]`` may set ``reg_covar`` etc.;
        ``n_components`` and ``seed`` are set here).

    Returns
    -------
    ProtocolResult
        ``observations``: anchor_set, factor, model, n_components, draw, query, ap
        (n_components empty for the references); ``summary`` per (anchor_set, model,
        n_components); ``effects``: GMM(M) − GMM(smallest M) per set.
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = positive_int(n_draws, "n_draws")
    sets = check_entries(anchor_sets, data, "anchor_sets")
    Ms = sorted({positive_int(m, "n_components") for m in n_components})
    if not Ms:
        raise ValueError("n_components is empty.")
    references = check_models(references, [m for m in model_names() if m != "gmm"], "reference")
    tau = resolve_tau(tau, data, ["gmm"])
    base = {k: dict(v) for k, v in (model_params or {}).items()}
    base.setdefault("gmm", {})
    base["gmm"].pop("n_components", None)

    obs = Observations()
    skipped = []
    bar = progress_bar(sum(len(Ms) * n_draws + len(references) for _ in sets), "components", progress)
    for name, A, f in sets:
        _fit_models(obs, bar, references, A, data, f, tau, base, seed, anchor_set=name, factor=f, n_components=None,
                    draw=0)
        for M in Ms:
            if M > len(A.support()):
                skipped.append(f"{name}: M = {M} > {len(A.support())} anchors")
                bar.update(n_draws)
                continue
            for r in range(n_draws):
                p = {**base, "gmm": {**base["gmm"], "n_components": M, "seed": draw_seed(seed, M, r)}}
                geometry = build_geometry("gmm", tau, len(A), data.dim, p, seed, clip=False).fit(A)
                bar.update()
                obs.add(score(geometry, data, [f])[f], data.queries, anchor_set=name, factor=f, model="gmm",
                        n_components=M, draw=r)
    bar.close()
    keys = ["anchor_set", "factor", "model", "n_components", "draw"]
    obs = obs.frame(keys)
    rows = per_draw(obs, keys, [*keys, "auprc"])
    by = ["anchor_set", "model", "n_components"]
    mats = groups(obs, by)
    summary = summarize(mats, by, n_boot, seed)
    comparisons = []
    for name, A, f in sets:
        done = [M for M in Ms if (name, "gmm", M) in mats]
        comparisons += [({"anchor_set": name, "factor": f, "n_components": M,
                          "comparison": f"gmm(M={M}) - gmm(M={done[0]})"}, (name, "gmm", M), (name, "gmm", done[0]))
                        for M in done[1:]]
    effects = paired_effects(mats, comparisons, n_boot, seed)
    verdicts = []
    for name, A, f in sets:
        es = [e for e in effects if e["anchor_set"] == name]
        if es:
            best = max(es, key=lambda e: e["diff"])
            verdicts.append(f"{name}: largest gain over the smallest M is {best['comparison']} = "
                            f"{ci_text(best, signed=True)}; at the largest M: {ci_text(es[-1], signed=True)}")
    seconds = timer()
    config = run_config("components", data, seconds, verdicts,
                        anchor_sets={n: {"n": len(A), "factor": f} for n, A, f in sets}, n_components=Ms,
                        n_draws=n_draws, references=references, tau=tau, model_params=base, seed=seed, n_boot=n_boot,
                        skipped=skipped)

    factor_of = {n: f for n, _, f in sets}
    report = Report(
        "Mixture complexity: AUPRC against the number of GMM components",
        "The usefulness of more mixture components depends on the anchor set: it helps a heterogeneous anchor "
        "distribution more than a narrow one (paper App. F.3, Fig. 7).",
        {"anchor sets": "; ".join(f"{n} ({len(A)} anchors → `{f}`)" for n, A, f in sets),
         "temperature τ": tau, "draws": f"{n_draws} GMM initialisations per M, seed {seed}",
         "skipped": "; ".join(skipped) or "none", "runtime": f"{seconds:.1f} s"},
        [("Mean AUPRC [95 % interval]", pivot_table(
            summary, [(n, [n]) for n, _, _ in sets],
            [(("gmm", M), f"M = {M}") for M in Ms] + [((ref, None), ref) for ref in references],
            lambda s: s["anchor_set"], lambda s: (s["model"], s["n_components"]),
            lambda s: ci_text(s) if s["model"] == "gmm" else f"{s['auprc']:.3f}", ["anchor set"])),
         ("Verdict", bullets(verdicts)),
         ("GMM(M) minus GMM(smallest M) (paired over initialisations and queries)", long_table(effects, [
             ("anchor set", "anchor_set"), ("comparison", "comparison"), _DIFF, ("verdict", "verdict")]))],
        LinePlot(x="n_components", series=("model",), facet="anchor_set", logx=2, xlabel="GMM components M",
                 ylabel=lambda n: f"AUPRC ({factor_of[n]})", title=lambda n: n, title_size=9,
                 flat=lambda s: s[0] != "gmm", style=lambda s: "-" if s[0] == "gmm" else "--", order=[("gmm",)],
                 legend_outside=False, figsize=(max(5.0, 3.6 * len(sets)), 4.2)))
    return _result("components", obs, rows, summary, by, effects,
                   ["anchor_set", "factor", "n_components", "comparison", *EFFECT], config, seconds, report, out_dir,
                   data)


# ================================================================================ table
def _class(diff: float) -> str:
    """The class of a difference in Table 2: better (> TIE), tie, worse (< −TIE)."""
    return "nan" if math.isnan(diff) else "better" if diff > TIE else "worse" if diff < -TIE else "tie"


def table_setting(data: EvalData, factor: str, per_value: bool | Sequence[Any] | None) -> tuple[list | None, str]:
    """The values of ``factor`` whose queries make the rows of :func:`table` (None: all queries), and a
    sentence saying which question that asks.

    ``per_value=None`` is the paper's per-label setting for a 0/1 factor (:func:`positive_value`):
    queries = the items with the positive value, relevant = the other items with it; for any
    other factor it is False: every item a query, relevant = same value.
    """
    values = data.labels[factor]
    if per_value is None:
        pos = positive_value(values)
        base, _, _ = factor.partition("=")
        if pos is not None and base in data.multilabels:
            return [pos], (f"per-label on multi-label {base}: queries = the items carrying the label, relevant = "
                           "the other items carrying it")
        if pos is not None:
            return [pos], (f"per-label: queries = the items with {factor} = {pos}, relevant = the other items "
                           f"with it")
        per_value = False
    if per_value is False:
        return None, f"all items as queries, relevant = same value of {factor}"
    chosen = np.unique(values[data.queries]).tolist() if per_value is True else list(per_value)
    return chosen, (f"per value of {factor} ({', '.join(map(str, chosen))}): queries = the items with the value, "
                    "relevant = the other items with it")


@honours_progress
def table(data: EvalData, entries: Any, *, models: Sequence[str] = ("softmax",),
          baselines: Sequence[str] = BASELINES, per_value: bool | Sequence[Any] | None = None, n_draws: int = 1,
          anchor_fraction: float = 1.0, tau: float | Sequence[float] | None = None,
          model_params: Mapping[str, Mapping[str, Any]] | None = None, out_dir: Any = None, seed: int = 0,
          n_boot: int = 1000, progress: bool | str | None = None) -> ProtocolResult:
    """Per-label AUPRC differences against cosine and ITI (paper Tables 2 and 3).

    Each entry is a label of the table: an anchor set and the factor it describes (one
    pathology's report-style anchors in the paper). The factor may be a multi-label
    factor ``f`` of the data (the label matching the entry's name, ignoring case, spaces
    and underscores) or ``"f=LABEL"`` (:meth:`EvalData.resolve_factor`). Every model and
    ITI are fitted on the entry's anchors (``n_draws`` random draws keeping
    ``anchor_fraction`` of them, the analogue of the paper's repeated anchor generations);
    cosine needs no anchors. The per-query AP differences model − baseline are averaged
    with a bootstrap interval over draws and queries
    (:func:`anchordiv.metrics.paired_difference`).

    Parameters
    ----------
    data : EvalData
        The collection.
    entries : mapping of str to (AnchorSet, str), or list of (name, AnchorSet, factor)
        The table's labels.
    models : sequence of str, optional
        Anchor models (Table 2: softmax; Table 3: the parametric models).
    baselines : sequence of str, optional
        ``cosine`` and/or ``iti``.
    per_value : None, bool or sequence, optional
        None (default): the per-label setting for a 0/1 or multi-label factor (queries =
        the items carrying the label, relevant = the other items carrying it), else as
        False (:func:`table_setting`). False: one row per entry, over all queries,
        relevance "same value". True: one row per value of the entry's factor, over the
        queries with that value. A sequence: only those values.
    n_draws : int, optional
        Anchor draws per entry.
    anchor_fraction : float, optional
        Fraction of the anchors kept per draw (1 keeps all).
    tau : float or sequence of float, optional
        Temperature; a sequence sweeps it (one block of rows per τ, column ``tau``).
    model_params, out_dir, seed, n_boot, progress
        As in :func:`coordinate`.

    Returns
    -------
    ProtocolResult
        ``observations``: tau, label, factor, model, draw, query, ap; ``rows``: mean AP
        per tau, label, factor, value, model and draw (their means are the summary);
        ``summary``: tau, label, value, model, auprc with interval; ``effects``: tau,
        label, factor, value, model, baseline, diff, ci_low, ci_high, the class of the
        difference (> 0.005, within ±0.005, < −0.005, as in Table 2) and n_queries.
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = positive_int(n_draws, "n_draws")
    data, ents = resolve_entries(entries, data, "entries")
    models = check_models(models, {"anchor_model": True}, "anchor model")
    baselines = check_models(baselines, {"anchor_model": False}, "baseline")
    if not models or not baselines:
        raise ValueError("table needs at least one model and one baseline.")
    given = [tau] if tau is None or np.ndim(tau) == 0 else list(tau)
    if not given:
        raise ValueError("tau is an empty list; give one temperature or several, e.g. [0.01, 0.05].")
    taus = [resolve_tau(t, data, models) for t in given]

    obs = Observations()
    fitted = list(models) + [b for b in baselines if b != "cosine"]
    bar = progress_bar(len(taus) * len(ents) * (n_draws * len(fitted) + ("cosine" in baselines)), "table", progress)
    for t in taus:
        for name, A, f in ents:
            _fit_models(obs, bar, [b for b in baselines if b == "cosine"], None, data, f, t, model_params, seed,
                        tau=t, label=name, factor=f, draw=0)
            for r in range(n_draws):
                sub = subsample(A, anchor_fraction, draw_seed(seed, r)) if anchor_fraction != 1 else A
                _fit_models(obs, bar, fitted, sub, data, f, t, model_params, draw_seed(seed, 1, r), tau=t,
                            label=name, factor=f, draw=r)
    bar.close()
    keys = ["tau", "label", "factor", "model", "draw"]
    obs = obs.frame(keys)

    subsets: list[tuple[str, str, str, np.ndarray]] = []  # (label, factor, value, query mask)
    settings = {}
    for name, A, f in ents:
        q_labels = data.labels[f][data.queries]
        values, settings[name] = table_setting(data, f, per_value)
        if values is None:
            subsets.append((name, f, "all", np.ones(data.queries.size, bool)))
            continue
        for v in values:
            mask = q_labels == v
            if not mask.any():
                raise ValueError(f"no query has {f} = {v!r}; the values present are {np.unique(q_labels).tolist()}.")
            subsets.append((name, f, str(v), mask))
    order = {m: i for i, m in enumerate(list(models) + list(baselines))}
    parts = []
    for t in taus:
        for name, f, v, mask in subsets:
            part = obs[(obs["tau"] == t).to_numpy() & (obs["label"] == name).to_numpy()
                       & np.isin(obs["query"].to_numpy(), data.queries[mask])]
            parts.append(part.assign(value=v).sort_values("model", key=lambda s: s.map(order), kind="stable"))
    import pandas as pd

    scored = pd.concat(parts, ignore_index=True)
    rows = per_draw(scored, ["tau", "label", "factor", "value", "model", "draw"],
                    ["tau", "label", "factor", "value", "model", "draw", "auprc"])
    by = ["tau", "label", "value", "model"]
    mats = groups(scored, by)
    summary = summarize(mats, by, n_boot, seed)
    effects = paired_effects(mats, [({"tau": t, "label": name, "factor": f, "value": v, "model": m, "baseline": b},
                                     (t, name, v, m), (t, name, v, b))
                                    for t in taus for name, f, v, _ in subsets for m in models for b in baselines],
                             n_boot, seed)
    for e in effects:
        e.update({"class": _class(e["diff"]), "n_queries": mats[(e["tau"], e["label"], e["value"], e["model"])].shape[1]})
    verdicts = []
    for t in taus:
        for m in models:
            for b in baselines:
                es = [e for e in effects if e["tau"] == t and e["model"] == m and e["baseline"] == b
                      and e["class"] != "nan"]
                if es:
                    n_cls = {c: sum(e["class"] == c for e in es) for c in ("better", "tie", "worse")}
                    verdicts.append((f"τ = {t:g}: " if len(taus) > 1 else "")
                                    + f"{m} − {b}: better on {n_cls['better']}, tie on {n_cls['tie']}, worse on "
                                    f"{n_cls['worse']} of {len(es)} rows; interval above 0 on "
                                    f"{sum(e['ci_low'] > 0 for e in es)}; mean difference "
                                    f"{float(np.mean([e['diff'] for e in es])):+.3f}")
    seconds = timer()
    config = run_config("table", data, seconds, verdicts, entries={n: {"n": len(A), "factor": f} for n, A, f in ents},
                        models=models, baselines=baselines, per_value=per_value if per_value is None or
                        isinstance(per_value, bool) else list(per_value), settings=settings, n_draws=n_draws,
                        anchor_fraction=anchor_fraction, tau=taus[0] if len(taus) == 1 else taus,
                        model_params=model_params or {}, seed=seed, n_boot=n_boot)

    def cell(r):
        if "baseline" not in r:
            return ci_text(r)
        txt = ci_text(r, signed=True)
        return f"**{txt}**" if r["class"] == "better" else (f"_{txt}_ ↓" if r["class"] == "worse" else txt)

    pairs = [(m, b) for m in models for b in baselines]
    columns = ([(("diff", *p), f"{p[0]} − {p[1]}") for p in pairs]
               + [(("abs", g), f"AUPRC {g}") for g in list(models) + list(baselines)])
    row_keys = [((t, n, v), [f"{t:g}", n, v, int(mask.sum())]) for t in taus for n, _, v, mask in subsets]
    legend = (f"Bold: > +{TIE}; plain: within ±{TIE}; italic with ↓: < −{TIE} (the classes of Table 2). "
              "The AUPRC columns are each geometry's mean over the row's queries.")
    report = Report(
        "Per-label AUPRC differences against the reference geometries",
        "Label-specific anchors specialise retrieval beyond the reference geometries: anchor divergence minus "
        "cosine and minus ITI is positive for most labels (paper Tables 2 and 3).",
        {"entries": "; ".join(f"{n} ({len(A)} anchors → `{f}`)" for n, A, f in ents),
         "setting": "; ".join(sorted(set(settings.values()))),
         "temperature τ": ", ".join(f"{t:g}" for t in taus),
         "draws": f"{n_draws} anchor draws keeping {anchor_fraction:g} of each set, seed {seed}",
         "runtime": f"{seconds:.1f} s"},
        [("AUPRC difference [95 % interval]", legend + "\n\n" + pivot_table(
            effects + summary, row_keys, columns, lambda r: (r["tau"], r["label"], r["value"]),
            lambda r: ("diff", r["model"], r["baseline"]) if "baseline" in r else ("abs", r["model"]), cell,
            ["τ", "label", "value", "n queries"])),
         ("Verdict", bullets(verdicts)),
         ("AUPRC per label [95 % interval]", long_table(summary, [
             ("τ", lambda r: f"{r['tau']:g}"), ("label", "label"), ("value", "value"), ("model", "model"),
             ("AUPRC", ci_text)]))],
        EffectPlot(rows=[k for k, _ in row_keys],
                   row_labels=[(f"τ {t:g} · " if len(taus) > 1 else "") + (f"{n} · {v}" if v != "all" else n)
                               for t in taus for n, _, v, _ in subsets],
                   row_of=lambda e: (e["tau"], e["label"], e["value"]), series=pairs,
                   series_of=lambda e: (e["model"], e["baseline"]), label=lambda s: f"{s[0]} − {s[1]}",
                   hollow=lambda s: s[1] != "cosine", xlabel="AUPRC difference (positive favours the anchor model)",
                   title="Per-label differences against the reference geometries",
                   figsize=(9.0, max(4.8, 1.5 + 0.28 * len(row_keys)))))
    return _result("table", obs, rows, summary, by, effects,
                   ["tau", "label", "factor", "value", "model", "baseline", "diff", "ci_low", "ci_high", "class",
                    "n_queries"], config, seconds, report, out_dir, data)


# ============================================================================== runtime
RUNTIME_MODELS = ("cosine", "softmax", "gaussian", "latent_gaussian", "latent_spherical")
_TIMES = ["model", "n_anchors", "n_queries", "n_gallery", "seconds", "fit_s", "search_s", "samples"]


@honours_progress
def runtime(*, models: Sequence[str] = RUNTIME_MODELS, n_anchors: Sequence[int] = (256, 1024, 4096),
            n_queries: int = 200, n_gallery: int = 2000, repeats: int = 2, out_dir: Any = None,
            progress: bool | str | None = None) -> ProtocolResult:
    """Fit + search time against the number of anchors (paper App. F.4, Table 4).

    For every model and anchor count N, :func:`anchordiv.experiments.timing.worker`
    draws seeded unit vectors (d = 512) for the anchors, queries and gallery, then times
    ``model.fit(anchors)`` followed by ``model.search(queries, gallery, k=10)`` (one
    warm-up, then the median of ``repeats`` calls), in this process. The paper's claim:
    softmax time grows with the number of anchors while the Gaussian model stays nearly
    flat once fitted.

    Parameters
    ----------
    models : sequence of str, optional
        Registry names (τ = 0.01, GMM with 8 components: :mod:`~anchordiv.experiments.timing`).
    n_anchors : sequence of int, optional
        Anchor counts N.
    n_queries, n_gallery : int, optional
        Queries and gallery size (paper: 10,000 and 50,000 on an H100).
    repeats : int, optional
        Timed calls after the warm-up.
    out_dir, progress
        As in :func:`coordinate`.

    Returns
    -------
    ProtocolResult
        ``observations`` and ``rows``: model, n_anchors, n_queries, n_gallery, seconds,
        fit_s, search_s, samples; ``summary`` adds the ratio to cosine; ``effects``: per
        model the time at the largest N over the time at the smallest.
    """
    from . import timing

    timer = Timer()
    models = check_models(models)
    Ns = sorted({positive_int(n, "n_anchors") for n in n_anchors})
    n_queries = positive_int(n_queries, "n_queries")
    n_gallery = positive_int(n_gallery, "n_gallery")
    repeats = positive_int(repeats, "repeats")
    if not Ns or not models:
        raise ValueError("runtime needs at least one model and one anchor count.")
    if n_gallery < 10:
        raise ValueError("n_gallery must be at least 10 (the benchmark searches the top 10).")
    times = []
    bar = progress_bar(len(Ns) * len(models), "runtime", progress)
    for N in Ns:
        for m in models:
            out = timing.worker(m, N, n_queries, n_gallery, repeats)
            bar.update()
            times.append({"model": m, "n_anchors": N, "n_queries": n_queries, "n_gallery": n_gallery,
                          "seconds": float(out["seconds"]), "fit_s": float(out["fit_s"]),
                          "search_s": float(out["search_s"]), "samples": len(out["samples"])})
    bar.close()
    cos = {r["n_anchors"]: r["seconds"] for r in times if r["model"] == "cosine"}
    summary = [{**r, "ratio_to_cosine": r["seconds"] / cos[r["n_anchors"]] if r["n_anchors"] in cos else float("nan")}
               for r in times]
    effects = []
    for m in models:
        t = {r["n_anchors"]: r for r in times if r["model"] == m}
        if len(t) >= 2:
            small, large = t[Ns[0]], t[Ns[-1]]
            effects.append({"model": m, "n_small": Ns[0], "n_large": Ns[-1], "seconds_small": small["seconds"],
                            "seconds_large": large["seconds"], "growth": large["seconds"] / small["seconds"],
                            "fit_growth": large["fit_s"] / small["fit_s"] if small["fit_s"] > 0 else float("nan"),
                            "search_growth": large["search_s"] / small["search_s"]})
    growth = {e["model"]: e for e in effects}
    verdicts = []
    if "softmax" in growth and "gaussian" in growth:
        sm, ga = growth["softmax"], growth["gaussian"]
        verdicts.append(f"N {Ns[0]} → {Ns[-1]}: fit + search time × {sm['growth']:.2f} for softmax, × "
                        f"{ga['growth']:.2f} for gaussian (search alone × {sm['search_growth']:.2f} and × "
                        f"{ga['search_growth']:.2f}) → " + ("holds (softmax grows faster)" if sm["growth"] >
                                                            ga["growth"] else "does not hold"))
    seconds = timer()
    config = run_config("runtime", None, seconds, verdicts, models=models, n_anchors=Ns, n_queries=n_queries,
                        n_gallery=n_gallery, repeats=repeats, benchmark="anchordiv.experiments.timing.worker",
                        benchmark_params={m: timing.params(m) for m in models}, dim=timing.DIM)
    report = Report(
        "Runtime against the number of anchors",
        "Softmax runtime grows with the anchor-set size, while the Gaussian anchor divergence stays nearly "
        "constant once the anchor distribution is fitted (paper App. F.4, Table 4).",
        {"benchmark": "anchordiv.experiments.timing (worker; the data of benchmarks/bench_scaling.py), synthetic "
                      f"unit vectors, d = {timing.DIM}, top-10 exact search",
         "sizes": f"{n_queries} queries, {n_gallery} gallery",
         "timing": f"one warm-up, then the median of {repeats} calls of fit + search", "runtime": f"{seconds:.1f} s"},
        [("Fit + search time in seconds (ratio to cosine)", pivot_table(
            summary, [(m, [m]) for m in models], [(N, f"N = {N}") for N in Ns], lambda r: r["model"],
            lambda r: r["n_anchors"], lambda r: f"{r['seconds']:.3g} ({r['ratio_to_cosine']:.2f}×)", ["model"])),
         ("Verdict", bullets(verdicts)),
         ("Growth from the smallest to the largest N", long_table(effects, [
             ("model", "model"), ("seconds (small N)", lambda e: f"{e['seconds_small']:.3g}"),
             ("seconds (large N)", lambda e: f"{e['seconds_large']:.3g}"), ("growth", lambda e: f"{e['growth']:.2f}×"),
             ("fit growth", lambda e: f"{e['fit_growth']:.2f}×"),
             ("search growth", lambda e: f"{e['search_growth']:.2f}×")]))],
        LinePlot(x="n_anchors", y="seconds", series=("model",), band=False, logx=2, logy=True,
                 xlabel="number of anchors N", ylabel="fit + search time (s)",
                 title=f"Runtime, {n_queries} queries × {n_gallery} gallery", legend_outside=False, legend_size=8))
    frame = tidy(times, _TIMES)
    res = ProtocolResult("runtime", frame, frame, tidy(summary, [*_TIMES, "ratio_to_cosine"]),
                         tidy(effects, ["model", "n_small", "n_large", "seconds_small", "seconds_large", "growth",
                                        "fit_growth", "search_growth"]), config, seconds=seconds)
    return write_outputs(res, report, out_dir)


# ============================================================================ τ sweeps
def sweep_tau(protocol: Any, *args: Any, tau: Sequence[float], out_dir: Any = None, **kwargs: Any) -> ProtocolResult:
    """Run ``protocol`` once per temperature of ``tau``: one result whose frames have a leading
    ``tau`` column (:func:`table` sweeps τ itself, in one Markdown table).

    With ``out_dir`` each run writes its own files to ``out_dir/tau=<τ>/``, and ``out_dir``
    gets ``<protocol>.csv``, ``_summary.csv`` and ``_effects.csv`` over all of them, and a
    ``<protocol>.md`` with each run's Markdown under its τ.
    """
    import pandas as pd

    from .report import write_csv

    taus = [float(t) for t in tau]
    if not taus:
        raise ValueError("tau is an empty list; give one temperature or several, e.g. [0.01, 0.05].")
    if getattr(protocol, "__wrapped__", protocol) is getattr(table, "__wrapped__", table):
        return table(*args, tau=taus, out_dir=out_dir, **kwargs)
    out = None if out_dir is None else Path(out_dir)
    runs = [protocol(*args, tau=t, out_dir=None if out is None else out / f"tau={t:g}", **kwargs) for t in taus]

    def stack(attr: str) -> pd.DataFrame:
        return pd.concat([getattr(r, attr).assign(tau=t)[["tau", *getattr(r, attr).columns]]
                          for t, r in zip(taus, runs)], ignore_index=True)

    first = runs[0]
    config = {"protocol": first.protocol, "tau": taus, "metric": first.config.get("metric", "auprc"),
              "runs": [r.config for r in runs],
              "verdicts": [f"τ = {t:g}: {v}" for t, r in zip(taus, runs) for v in r.config.get("verdicts", [])]}
    res = ProtocolResult(first.protocol, stack("observations"), stack("rows"), stack("summary"), stack("effects"),
                         config, seconds=sum(r.seconds for r in runs))
    if out is not None:
        name = res.protocol
        res.paths = {"csv": write_csv(out / f"{name}.csv", res.rows),
                     "summary_csv": write_csv(out / f"{name}_summary.csv", res.summary),
                     "effects_csv": write_csv(out / f"{name}_effects.csv", res.effects),
                     "md": out / f"{name}.md"}
        res.paths["md"].write_text("\n".join(f"# τ = {t:g}\n\n" + r.paths["md"].read_text(encoding="utf-8")
                                             .replace("\n#", "\n##") for t, r in zip(taus, runs)), encoding="utf-8")
    return res


# ============================================================================= registry
#: Protocols by name.
PROTOCOLS = {"coordinate": coordinate, "budget": budget, "adaptation": adaptation, "components": components,
             "table": table, "runtime": runtime}


def run_protocol(name: str, *args: Any, **kwargs: Any) -> ProtocolResult:
    """Run a protocol by name; a ``ValueError`` names the choices for an unknown one."""
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)}.")
    return PROTOCOLS[name](*args, **kwargs)
