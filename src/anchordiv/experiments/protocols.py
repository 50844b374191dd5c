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
arguments give the same files), shows a tqdm progress bar, and writes to ``out_dir``:
``<protocol>.csv`` (one row per condition and random draw), ``<protocol>_summary.csv``
(means with 95 % bootstrap intervals over draws and queries), ``<protocol>_effects.csv``
(the paired differences that test the claim), ``<protocol>.md`` (tables and a verdict),
``<protocol>.png`` and ``<protocol>.json`` (parameters and timings).
"""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..anchors import AnchorSet
from .core import (
    ANCHOR_MODELS,
    BASELINES,
    PARAMETRIC,
    POSTERIOR_MODELS,
    EvalData,
    ProtocolResult,
    Timer,
    build_geometry,
    check_anchor_set,
    check_models,
    check_positive_int,
    check_seed,
    draw_seed,
    environment,
    fmt_ci,
    markdown_table,
    min_anchors,
    paired_effect,
    honours_progress,
    progress_bar,
    resolve_tau,
    score,
    subsample,
    summarize,
    write_outputs,
)

__all__ = ["coordinate", "budget", "adaptation", "components", "table", "runtime", "PROTOCOLS", "run_protocol"]

#: Differences smaller than this in absolute value count as ties (paper Table 2: 0.005).
TIE = 0.005

_COLORS = {
    "softmax": "#1f77b4", "gaussian": "#ff7f0e", "gmm": "#2ca02c", "latent_gaussian": "#d62728",
    "latent_spherical": "#9467bd", "cosine": "#7f7f7f", "iti": "#8c564b",
}


def _color(name: str) -> str:
    return _COLORS.get(name, None) or f"C{abs(hash(name)) % 10}"


def _fit_score(name: str, anchors: AnchorSet | None, data: EvalData, factors: Sequence[str], tau: float | None,
               model_params: Mapping | None, seed: int, prior: Any = None, clip_n: int | None = None):
    """Fit geometry ``name`` on ``anchors`` (optionally with a prior) and score it; None if too few anchors."""
    if name == "cosine":
        from ..baselines import Cosine

        return score(Cosine(), data, factors)
    support = anchors.support()
    n = len(support)
    if prior is None and n < min_anchors(name):
        return None
    if prior is not None and n < int(getattr(prior, "min_target_anchors", 1)):
        return None
    geometry = build_geometry(name, tau, clip_n if clip_n is not None else n, data.dim, model_params, seed)
    if prior is None:
        geometry.fit(support)
    else:
        geometry.fit(support, prior=prior)
    return score(geometry, data, factors)


def _verdict(ci_low: float, ci_high: float, diff: float | None = None) -> str:
    """``holds`` (interval above 0 and the difference above the tie band), ``reversed``, ``tie`` or inconclusive."""
    if math.isnan(ci_low):
        return "not measured"
    if diff is None:
        diff = 0.5 * (ci_low + ci_high)
    if ci_low > 0 and diff > TIE:
        return "holds"
    if ci_high < 0 and diff < -TIE:
        return "reversed"
    if abs(diff) <= TIE:
        return f"tie (|difference| <= {TIE})"
    return "inconclusive (interval contains 0)"


def _header(title: str, claim: str, data: EvalData | None, facts: Mapping[str, Any]) -> list[str]:
    lines = [f"# {title}", "", f"**Claim tested.** {claim}", ""]
    if data is not None:
        lines.append(f"- data: {data.describe()}")
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    lines.append("")
    return lines


def _band(ax, xs, rows, label, color, style="-", marker="o"):
    y = np.array([r["auprc"] for r in rows], dtype=float)
    lo = np.array([r["ci_low"] for r in rows], dtype=float)
    hi = np.array([r["ci_high"] for r in rows], dtype=float)
    ax.plot(xs, y, style, color=color, marker=marker, ms=3.5, lw=1.6, label=label)
    ax.fill_between(xs, lo, hi, color=color, alpha=0.15, lw=0)


def _config(protocol: str, data: EvalData | None, seconds: float, **params: Any) -> dict:
    cfg = {"protocol": protocol, **params, "seconds": round(seconds, 3), "environment": environment()}
    if data is not None:
        cfg["data"] = {"name": data.name, "n_items": len(data), "dim": data.dim, "n_queries": int(data.queries.size),
                       "n_keys": int(data.keys.size), "queries_are_keys": data.queries_are_keys,
                       "factors": {f: int(np.unique(v).size) for f, v in data.labels.items()}}
    return cfg


# ============================================================================ coordinate
@honours_progress
def coordinate(data: EvalData, anchors_a: AnchorSet, anchors_b: AnchorSet, factor_a: str, factor_b: str, *,
               models: Sequence[str] = ("softmax",), baselines: Sequence[str] = ("cosine",),
               proportions: Sequence[float] | None = None, n_draws: int = 5, anchor_fraction: float = 0.8,
               tau: float | None = None, model_params: Mapping[str, Mapping[str, Any]] | None = None,
               out_dir: Any = None, seed: int = 0, n_boot: int = 1000, progress: bool | None = None,
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
    progress : bool, optional
        Show the progress bar (default: on a terminal).
    names : (str, str), optional
        Display names of the two anchor sets (default: the factor names).

    Returns
    -------
    ProtocolResult
        ``rows``: model, p, draw, factor, role (A/B), auprc, n_anchors; ``summary``: the
        same per (model, p, factor) with ``ci_low``/``ci_high``; ``effects``: per model
        the change from p = 0 to p = 1 on each factor.
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = check_positive_int(n_draws, "n_draws")
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

    groups: dict[tuple, list] = {}
    rows: list[dict] = []
    bar = progress_bar(n_draws * len(ps) * len(models) + len(baselines), "coordinate", progress)
    base_scores = {}
    for b in baselines:
        base_scores[b] = _fit_score(b, None, data, [fa, fb], tau, model_params, seed)
        bar.update()
    for r in range(n_draws):
        A_r = subsample(A, anchor_fraction, draw_seed(seed, 0, r))
        B_r = subsample(B, anchor_fraction, draw_seed(seed, 1, r))
        for p in ps:
            mix = AnchorSet.mixture([A_r, B_r], [p, 1 - p])
            for m in models:
                res = _fit_score(m, mix, data, [fa, fb], tau, model_params, draw_seed(seed, 2, r))
                bar.update()
                if res is None:
                    continue
                for f in (fa, fb):
                    groups.setdefault((m, p, f, role[f]), []).append(res[f])
                    rows.append({"model": m, "p": p, "draw": r, "factor": f, "role": role[f],
                                 "auprc": float(np.nanmean(res[f])), "n_anchors": len(mix.support())})
            for b, res in base_scores.items():
                for f in (fa, fb):
                    if r == 0:
                        groups.setdefault((b, p, f, role[f]), []).append(res[f])
    bar.close()
    for b, res in base_scores.items():
        for f in (fa, fb):
            rows.append({"model": b, "p": "", "draw": 0, "factor": f, "role": role[f],
                         "auprc": float(np.nanmean(res[f])), "n_anchors": 0})
    summary = summarize(groups, ["model", "p", "factor", "role"], n_boot, seed)

    effects = []
    p0, p1 = min(ps), max(ps)
    for m in models:
        for f, sign in ((fa, 1), (fb, -1)):
            lo_key, hi_key = (m, p0, f, role[f]), (m, p1, f, role[f])
            if lo_key not in groups or hi_key not in groups:
                continue
            a, b = (groups[hi_key], groups[lo_key]) if sign > 0 else (groups[lo_key], groups[hi_key])
            e = paired_effect(a, b, n_boot, seed)
            effects.append({"model": m, "factor": f, "role": role[f],
                            "comparison": f"AUPRC(p={p1:g}) - AUPRC(p={p0:g})" if sign > 0 else
                            f"AUPRC(p={p0:g}) - AUPRC(p={p1:g})", **e, "verdict": _verdict(e["ci_low"], e["ci_high"], e["diff"])})

    verdicts = []
    for m in models:
        es = {e["role"]: e for e in effects if e["model"] == m}
        if "A" in es and "B" in es:
            ok = all(_verdict(es[k]["ci_low"], es[k]["ci_high"], es[k]["diff"]) == "holds" for k in "AB")
            verdicts.append(f"{m}: p {p0:g} → {p1:g} changes AUPRC on {fa} by "
                            f"{fmt_ci(es['A']['diff'], es['A']['ci_low'], es['A']['ci_high'], signed=True)} and on "
                            f"{fb} by {fmt_ci(-es['B']['diff'], -es['B']['ci_high'], -es['B']['ci_low'], signed=True)}"
                            f" → {'holds' if ok else 'does not hold'}")
    seconds = timer()
    config = _config("coordinate", data, seconds, models=models, baselines=baselines, factor_a=fa, factor_b=fb,
                     anchor_sets={"A": {"name": names[0], "n": len(A)}, "B": {"name": names[1], "n": len(B)}},
                     proportions=ps, n_draws=n_draws, anchor_fraction=anchor_fraction, tau=tau,
                     model_params=model_params or {}, seed=seed, n_boot=n_boot)
    config["verdicts"] = verdicts
    result = ProtocolResult("coordinate", rows, summary, effects, config, seconds=seconds)

    # ---- markdown
    by = {(s["model"], s["p"], s["factor"]): s for s in summary}
    lines = _header(
        "Coordinate control: AUPRC on two factors as the anchor mixture moves from B to A",
        "Anchor distributions select the semantic coordinate (paper §5.2, Fig. 3): raising the mass p of "
        "factor-A anchors raises retrieval by factor A and lowers retrieval by factor B.",
        data,
        {"anchor set A": f"{names[0]} ({len(A)} anchors) → factor `{fa}`",
         "anchor set B": f"{names[1]} ({len(B)} anchors) → factor `{fb}`",
         "mixture": "q_p = p·q_A + (1 − p)·q_B", "temperature τ": tau,
         "draws": f"{n_draws} (each keeps {anchor_fraction:g} of each set), seed {seed}",
         "runtime": f"{seconds:.1f} s"})
    head = ["p"] + [f"{m} · {role[f]} ({f})" for m in models for f in (fa, fb)]
    table_rows = []
    for p in ps:
        table_rows.append([f"{p:g}"] + [fmt_ci(*(by[(m, p, f)][k] for k in ("auprc", "ci_low", "ci_high")))
                                        if (m, p, f) in by else "—" for m in models for f in (fa, fb)])
    lines += ["## Mean AUPRC [95 % interval] against p", "", markdown_table(head, table_rows), ""]
    if baselines:
        lines += ["References (independent of p): " + "; ".join(
            f"{b} · {role[f]} ({f}) {fmt_ci(by[(b, p0, f)]['auprc'], by[(b, p0, f)]['ci_low'], by[(b, p0, f)]['ci_high'])}"
            for b in baselines for f in (fa, fb)), ""]
    lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts] + [""]
    lines += ["## Effect of the mixture (paired over draws and queries)", "",
              markdown_table(["model", "factor", "comparison", "difference [95 %]", "verdict"],
                             [[e["model"], f"{e['role']} ({e['factor']})", e["comparison"],
                               fmt_ci(e["diff"], e["ci_low"], e["ci_high"], signed=True), e["verdict"]]
                              for e in effects]), ""]

    def plot(fig):
        ax = fig.add_subplot(111)
        for m in models:
            for f, style in ((fa, "-"), (fb, "--")):
                rs = [by[(m, p, f)] for p in ps if (m, p, f) in by]
                if rs:
                    _band(ax, [r["p"] for r in rs], rs, f"{m} · {f}", _color(m), style)
        for b in baselines:
            for f, style in ((fa, "-"), (fb, "--")):
                ax.axhline(by[(b, p0, f)]["auprc"], color=_color(b), ls=style, lw=1, alpha=0.7, label=f"{b} · {f}")
        ax.set_xlabel(f"p (mass of {names[0]} anchors; 1 − p on {names[1]})")
        ax.set_ylabel("AUPRC")
        ax.set_title("Anchor mixture selects the semantic coordinate (solid: A, dashed: B)", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=0.3)

    return write_outputs(result, out_dir, "\n".join(lines), plot, figsize=(9.5, 5), columns={
        "rows": ["model", "p", "draw", "factor", "role", "auprc", "n_anchors"],
        "summary": ["model", "p", "factor", "role", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["model", "factor", "role", "comparison", "diff", "ci_low", "ci_high", "verdict"]})


# =============================================================================== budget
def _default_budgets(n: int) -> list[int]:
    out = [b for b in (2 ** e for e in range(1, 20)) if b < n]
    return out + [n]


@honours_progress
def budget(data: EvalData, anchors: AnchorSet, factor: str, *, budgets: Sequence[int] | None = None,
           models: Sequence[str] = ANCHOR_MODELS, baselines: Sequence[str] = BASELINES, n_draws: int = 5,
           tau: float | None = None, model_params: Mapping[str, Mapping[str, Any]] | None = None,
           out_dir: Any = None, seed: int = 0, n_boot: int = 1000, progress: bool | None = None,
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
        ``rows``: model, budget, draw, auprc, n_anchors; ``summary`` per (model, budget);
        ``effects``: each parametric model minus softmax at each budget (paired).
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = check_positive_int(n_draws, "n_draws")
    models = check_models(models, ANCHOR_MODELS, "anchor model")
    baselines = check_models(baselines, BASELINES, "baseline")
    if not models and not baselines:
        raise ValueError("models and baselines are both empty.")
    tau = resolve_tau(tau, data, models)
    S = check_anchor_set(anchors, data, "anchors")
    f = data.check_factor(factor)
    N = len(S)
    budgets = sorted({int(check_positive_int(b, "budget")) for b in (budgets or _default_budgets(N))})
    if budgets[-1] > N:
        raise ValueError(f"budget {budgets[-1]} exceeds the {N} anchors; use budgets <= {N}.")
    fitted = [m for m in models] + [b for b in baselines if b != "cosine"]

    groups: dict[tuple, list] = {}
    rows: list[dict] = []
    total = sum(1 if b == N else n_draws for b in budgets) * len(fitted) + ("cosine" in baselines)
    bar = progress_bar(total, "budget", progress)
    cos = None
    if "cosine" in baselines:
        cos = _fit_score("cosine", None, data, [f], tau, model_params, seed)[f]
        bar.update()
    for b in budgets:
        for r in range(1 if b == N else n_draws):
            sub = S if b == N else S.subsample(b, seed=draw_seed(seed, b, r))
            for m in fitted:
                res = _fit_score(m, sub, data, [f], tau, model_params, draw_seed(seed, 1, r))
                bar.update()
                if res is None:
                    continue
                groups.setdefault((m, b), []).append(res[f])
                rows.append({"model": m, "budget": b, "draw": r, "auprc": float(np.nanmean(res[f])),
                             "n_anchors": b})
        if cos is not None:
            groups[("cosine", b)] = [cos]
    bar.close()
    if cos is not None:
        rows.append({"model": "cosine", "budget": "", "draw": 0, "auprc": float(np.nanmean(cos)), "n_anchors": 0})
    summary = summarize(groups, ["model", "budget"], n_boot, seed)

    effects = []
    for b in budgets:
        if ("softmax", b) not in groups:
            continue
        for m in models:
            if m == "softmax" or (m, b) not in groups:
                continue
            e = paired_effect(groups[(m, b)], groups[("softmax", b)], n_boot, seed)
            effects.append({"budget": b, "model": m, "comparison": f"{m} - softmax", **e,
                            "verdict": _verdict(e["ci_low"], e["ci_high"], e["diff"])})
    seconds = timer()
    config = _config("budget", data, seconds, models=models, baselines=baselines, factor=f,
                     anchor_set={"name": name or f, "n": N}, budgets=budgets, n_draws=n_draws, tau=tau,
                     model_params=model_params or {}, seed=seed, n_boot=n_boot)
    result = ProtocolResult("budget", rows, summary, effects, config, seconds=seconds)

    by = {(s["model"], s["budget"]): s for s in summary}
    shown = models + [b for b in baselines]
    lines = _header(
        "Anchor budget: AUPRC against the number of anchors",
        "Parametric anchor models are strongest with limited anchors, while softmax improves with coverage and "
        "is strongest with the full anchor set (paper §5.3, Figs. 4 and 6).",
        data,
        {"anchors": f"{name or f} ({N} anchors) → factor `{f}`", "temperature τ": tau,
         "draws": f"{n_draws} random subsets per budget (the full set once), seed {seed}",
         "runtime": f"{seconds:.1f} s"})
    table_rows = []
    for b in budgets:
        vals = {m: by[(m, b)]["auprc"] for m in shown if (m, b) in by}
        best = max(vals, key=vals.get) if vals else None
        cells = []
        for m in shown:
            if (m, b) not in by:
                cells.append("—")
                continue
            s = by[(m, b)]
            txt = fmt_ci(s["auprc"], s["ci_low"], s["ci_high"])
            cells.append(f"**{txt}**" if m == best else txt)
        table_rows.append([b] + cells)
    lines += ["## Mean AUPRC [95 % interval] (best per budget in bold)", "", markdown_table(["budget"] + shown,
                                                                                         table_rows), ""]
    verdicts = _budget_verdicts(budgets, models, groups, by, n_boot, seed, N)
    lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts] + [""]
    result.config["verdicts"] = verdicts
    lines += ["## Parametric minus softmax (paired over draws and queries)", "",
              markdown_table(["budget", "comparison", "difference [95 %]", "verdict"],
                             [[e["budget"], e["comparison"], fmt_ci(e["diff"], e["ci_low"], e["ci_high"], signed=True),
                               e["verdict"]] for e in effects]), ""]

    def plot(fig):
        ax = fig.add_subplot(111)
        for m in shown:
            rs = [by[(m, b)] for b in budgets if (m, b) in by]
            if rs:
                _band(ax, [r["budget"] for r in rs], rs, m, _color(m), "--" if m in BASELINES else "-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("number of anchors")
        ax.set_ylabel(f"AUPRC ({f})")
        ax.set_title("AUPRC against the anchor budget")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=0.3)

    return write_outputs(result, out_dir, "\n".join(lines), plot, figsize=(8.5, 4.8), columns={
        "rows": ["model", "budget", "draw", "auprc", "n_anchors"],
        "summary": ["model", "budget", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["budget", "model", "comparison", "diff", "ci_low", "ci_high", "verdict"]})


def _budget_verdicts(budgets, models, groups, by, n_boot, seed, N) -> list[str]:
    out = []
    para = [m for m in models if m in PARAMETRIC]
    if "softmax" not in models or not para:
        return ["needs softmax and at least one parametric model"]
    small = [b for b in budgets if ("softmax", b) in groups and any((m, b) in groups for m in para)]
    if small:
        b0 = small[0]
        best = max((m for m in para if (m, b0) in by), key=lambda m: by[(m, b0)]["auprc"])
        e = paired_effect(groups[(best, b0)], groups[("softmax", b0)], n_boot, seed)
        out.append(f"few anchors (n = {b0}): best parametric (highest mean) {best} − softmax = "
                   f"{fmt_ci(e['diff'], e['ci_low'], e['ci_high'], signed=True)} → {_verdict(e['ci_low'], e['ci_high'], e['diff'])}")
    if ("softmax", N) in groups:
        cands = [m for m in para if (m, N) in by]
        if cands:
            best = max(cands, key=lambda m: by[(m, N)]["auprc"])
            e = paired_effect(groups[("softmax", N)], groups[(best, N)], n_boot, seed)
            out.append(f"full set (n = {N}): softmax − best parametric (highest mean) {best} = "
                       f"{fmt_ci(e['diff'], e['ci_low'], e['ci_high'], signed=True)} → "
                       f"{_verdict(e['ci_low'], e['ci_high'], e['diff'])}")
        contested = [b for b in budgets if ("softmax", b) in by and any((m, b) in by for m in para)]
        wins = [b for b in contested if all(by[("softmax", b)]["auprc"] >= by[(m, b)]["auprc"]
                                            for m in para if (m, b) in by)]
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
               out_dir: Any = None, seed: int = 0, n_boot: int = 1000, progress: bool | None = None,
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
        ``rows``: method, model, kind (posterior / target / broad / reference), budget,
        draw, auprc; ``summary`` per (method, budget); ``effects``: posterior minus
        target-only, minus softmax and minus broad, per model and budget.
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = check_positive_int(n_draws, "n_draws")
    models = check_models(models, POSTERIOR_MODELS, "posterior model")
    references = check_models(references, ("softmax", "iti", "cosine"), "reference")
    if not models:
        raise ValueError("models is empty; give at least one of " + ", ".join(POSTERIOR_MODELS) + ".")
    tau = resolve_tau(tau, data, list(models) + list(references))
    Bd = check_anchor_set(broad, data, "broad")
    T = check_anchor_set(target, data, "target")
    f = data.check_factor(factor)
    N = len(T)
    budgets = sorted({int(check_positive_int(b, "budget")) for b in (budgets or _default_budgets(N))})
    if budgets[-1] > N:
        raise ValueError(f"budget {budgets[-1]} exceeds the {N} target anchors; use budgets <= {N}.")
    params = {k: dict(v) for k, v in _ADAPT_DEFAULTS.items()}
    for k, v in (model_params or {}).items():
        params.setdefault(k, {}).update(v)
    names = names or ("broad", "target")

    groups: dict[tuple, list] = {}
    rows: list[dict] = []
    fitted_refs = [r for r in references if r != "cosine"]
    total = len(models) + sum(1 if b == N else n_draws for b in budgets) * (2 * len(models) + len(fitted_refs))
    bar = progress_bar(total + ("cosine" in references), "adaptation", progress)
    priors = {}
    for m in models:
        prior = build_geometry(m, tau, len(Bd), data.dim, params, seed).fit(Bd)
        priors[m] = prior
        if include_broad:
            res = score(prior, data, [f])[f]
            for b in budgets:
                groups[(f"broad {m}", b)] = [res]
            rows.append({"method": f"broad {m}", "model": m, "kind": "broad", "budget": "", "draw": 0,
                         "auprc": float(np.nanmean(res))})
        bar.update()
    if "cosine" in references:
        res = _fit_score("cosine", None, data, [f], tau, params, seed)[f]
        for b in budgets:
            groups[("cosine", b)] = [res]
        rows.append({"method": "cosine", "model": "cosine", "kind": "reference", "budget": "", "draw": 0,
                     "auprc": float(np.nanmean(res))})
        bar.update()
    for b in budgets:
        for r in range(1 if b == N else n_draws):
            sub = T if b == N else T.subsample(b, seed=draw_seed(seed, b, r))
            jobs = [(m, m, "target", None) for m in models] + \
                   [(f"posterior {m}", m, "posterior", priors[m]) for m in models] + \
                   [(ref, ref, "reference", None) for ref in fitted_refs]
            for method, m, kind, prior in jobs:
                clip_n = len(Bd) if prior is not None else None
                res = _fit_score(m, sub, data, [f], tau, params, draw_seed(seed, 1, r), prior=prior, clip_n=clip_n)
                bar.update()
                if res is None:
                    continue
                groups.setdefault((method, b), []).append(res[f])
                rows.append({"method": method, "model": m, "kind": kind, "budget": b, "draw": r,
                             "auprc": float(np.nanmean(res[f]))})
    bar.close()
    summary = summarize(groups, ["method", "budget"], n_boot, seed)

    effects = []
    for m in models:
        for b in budgets:
            post = groups.get((f"posterior {m}", b))
            if post is None:
                continue
            for other in (m, "softmax", f"broad {m}"):
                if (other, b) not in groups:
                    continue
                e = paired_effect(post, groups[(other, b)], n_boot, seed)
                effects.append({"model": m, "budget": b, "comparison": f"posterior {m} - {other}", **e,
                                "verdict": _verdict(e["ci_low"], e["ci_high"], e["diff"])})
    seconds = timer()
    prior_info = {m: {k: v for k, v in (("n_components", getattr(p, "n_components", None)),
                                        ("k", getattr(p, "n_components_", None))) if v is not None}
                  for m, p in priors.items()}
    config = _config("adaptation", data, seconds, models=models, references=references, factor=f,
                     broad={"name": names[0], "n": len(Bd)}, target={"name": names[1], "n": N}, budgets=budgets,
                     n_draws=n_draws, tau=tau, model_params=params, priors=prior_info, seed=seed, n_boot=n_boot,
                     include_broad=include_broad)
    result = ProtocolResult("adaptation", rows, summary, effects, config, seconds=seconds)

    by = {(s["method"], s["budget"]): s for s in summary}
    methods = [f"posterior {m}" for m in models] + list(models) + \
        ([f"broad {m}" for m in models] if include_broad else []) + list(references)
    lines = _header(
        "Posterior adaptation: broad anchors as a prior, few target anchors",
        "Posterior anchor models adapted from broad anchors beat target-only models when target anchors are "
        "scarce, and the advantage narrows as target coverage grows (paper §5.4, Fig. 5).",
        data,
        {"broad anchors": f"{names[0]} ({len(Bd)})", "target anchors": f"{names[1]} ({N}) → factor `{f}`",
         "broad fits": ", ".join(f"{m} {v}" for m, v in prior_info.items()),
         "temperature τ": tau, "draws": f"{n_draws} random target subsets per budget (the full set once), seed {seed}",
         "runtime": f"{seconds:.1f} s"})
    table_rows = []
    for b in budgets:
        vals = {m: by[(m, b)]["auprc"] for m in methods if (m, b) in by}
        best = max(vals, key=vals.get) if vals else None
        cells = []
        for m in methods:
            s = by.get((m, b))
            txt = "—" if s is None else fmt_ci(s["auprc"], s["ci_low"], s["ci_high"])
            cells.append(f"**{txt}**" if m == best else txt)
        table_rows.append([b] + cells)
    lines += ["## Mean AUPRC [95 % interval] (best per budget in bold)", "",
              markdown_table(["budget"] + methods, table_rows), ""]
    verdicts = []
    for m in models:
        es = [e for e in effects if e["model"] == m and e["comparison"] == f"posterior {m} - {m}"]
        if not es:
            verdicts.append(f"{m}: not measured")
            continue
        first, last = es[0], es[-1]
        narrowing = "narrows" if abs(last["diff"]) < abs(first["diff"]) else "does not narrow"
        text = (f"{m}: posterior − target-only at n = {first['budget']}: "
                f"{fmt_ci(first['diff'], first['ci_low'], first['ci_high'], signed=True)} → "
                f"{_verdict(first['ci_low'], first['ci_high'], first['diff'])}; at n = {last['budget']}: "
                f"{fmt_ci(last['diff'], last['ci_low'], last['ci_high'], signed=True)} (gap {narrowing})")
        vs_broad = [e for e in effects if e["model"] == m and e["comparison"] == f"posterior {m} - broad {m}"]
        if vs_broad:
            best = max(vs_broad, key=lambda e: e["diff"])
            text += (f"; posterior − broad fit: at best {fmt_ci(best['diff'], best['ci_low'], best['ci_high'], signed=True)}"
                     f" (n = {best['budget']})")
        verdicts.append(text)
    result.config["verdicts"] = verdicts
    lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts] + [""]
    lines += ["## Posterior minus other geometries (paired over draws and queries)", "",
              markdown_table(["model", "budget", "comparison", "difference [95 %]", "verdict"],
                             [[e["model"], e["budget"], e["comparison"],
                               fmt_ci(e["diff"], e["ci_low"], e["ci_high"], signed=True), e["verdict"]]
                              for e in effects]), ""]

    def plot(fig):
        ax = fig.add_subplot(111)
        for m in methods:
            rs = [by[(m, b)] for b in budgets if (m, b) in by]
            if not rs:
                continue
            base = m.split(" ")[-1]
            style = "-" if m.startswith("posterior") else (":" if m in models or m in ("softmax", "iti") else "--")
            if m.startswith("broad"):
                ax.axhline(rs[0]["auprc"], color=_color(base), ls="-.", lw=0.9, alpha=0.6, label=m)
                continue
            _band(ax, [r["budget"] for r in rs], rs, m, _color(base), style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("number of target anchors")
        ax.set_ylabel(f"AUPRC ({f})")
        ax.set_title("Posterior (solid) vs target-only (dotted); broad fit (dash-dot)", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=0.3)

    return write_outputs(result, out_dir, "\n".join(lines), plot, figsize=(9.5, 5), columns={
        "rows": ["method", "model", "kind", "budget", "draw", "auprc"],
        "summary": ["method", "budget", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["model", "budget", "comparison", "diff", "ci_low", "ci_high", "verdict"]})


# =========================================================================== components
def _entries(entries: Any, data: EvalData, what: str) -> list[tuple[str, AnchorSet, str]]:
    """``[(name, AnchorSet, factor)]`` from a mapping name → (anchors, factor) or a list of triples."""
    if isinstance(entries, Mapping):
        items = [(k, *v) for k, v in entries.items()]
    else:
        items = list(entries or [])
    if not items:
        raise ValueError(f"{what} is empty; give at least one (name, anchors, factor).")
    out = []
    for item in items:
        if len(item) != 3:
            raise ValueError(f"each {what} entry must be (name, anchors, factor), got {item!r}.")
        name, anchors, factor = item
        out.append((str(name), check_anchor_set(anchors, data, f"{what}[{name!r}]"), data.check_factor(factor)))
    return out


@honours_progress
def components(data: EvalData, anchor_sets: Any, *, n_components: Sequence[int] = (1, 2, 4, 8),
               n_draws: int = 3, references: Sequence[str] = ("softmax", "cosine"), tau: float | None = None,
               model_params: Mapping[str, Mapping[str, Any]] | None = None, out_dir: Any = None, seed: int = 0,
               n_boot: int = 1000, progress: bool | None = None) -> ProtocolResult:
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
        ``rows``: anchor_set, factor, model, n_components, draw, auprc; ``summary`` per
        (anchor_set, model, n_components); ``effects``: GMM(M) − GMM(smallest M) per set.
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = check_positive_int(n_draws, "n_draws")
    sets = _entries(anchor_sets, data, "anchor_sets")
    Ms = sorted({check_positive_int(m, "n_components") for m in n_components})
    if not Ms:
        raise ValueError("n_components is empty.")
    references = check_models(references, ("softmax", "gaussian", "latent_gaussian", "latent_spherical", "cosine",
                                           "iti"), "reference")
    tau = resolve_tau(tau, data, ["gmm"])
    base = {k: dict(v) for k, v in (model_params or {}).items()}
    base.setdefault("gmm", {})
    base["gmm"].pop("n_components", None)

    groups: dict[tuple, list] = {}
    rows: list[dict] = []
    skipped = []
    total = sum(len(Ms) * n_draws + len(references) for _ in sets)
    bar = progress_bar(total, "components", progress)
    for name, A, f in sets:
        for ref in references:
            res = _fit_score(ref, A, data, [f], tau, base, seed)
            bar.update()
            if res is None:
                continue
            groups[(name, ref, 0)] = [res[f]]
            rows.append({"anchor_set": name, "factor": f, "model": ref, "n_components": "", "draw": 0,
                         "auprc": float(np.nanmean(res[f]))})
        for M in Ms:
            if M > len(A.support()):
                skipped.append(f"{name}: M = {M} > {len(A.support())} anchors")
                bar.update(n_draws)
                continue
            for r in range(n_draws):
                p = {**base, "gmm": {**base["gmm"], "n_components": M, "seed": draw_seed(seed, M, r)}}
                geometry = build_geometry("gmm", tau, len(A), data.dim, p, seed, clip=False).fit(A)
                res = score(geometry, data, [f])[f]
                bar.update()
                groups.setdefault((name, "gmm", M), []).append(res)
                rows.append({"anchor_set": name, "factor": f, "model": "gmm", "n_components": M, "draw": r,
                             "auprc": float(np.nanmean(res))})
    bar.close()
    summary = summarize(groups, ["anchor_set", "model", "n_components"], n_boot, seed)
    for s in summary:
        if s["model"] != "gmm":
            s["n_components"] = ""
    effects = []
    for name, A, f in sets:
        done = [M for M in Ms if (name, "gmm", M) in groups]
        if len(done) < 2:
            continue
        for M in done[1:]:
            e = paired_effect(groups[(name, "gmm", M)], groups[(name, "gmm", done[0])], n_boot, seed)
            effects.append({"anchor_set": name, "factor": f, "n_components": M,
                            "comparison": f"gmm(M={M}) - gmm(M={done[0]})", **e,
                            "verdict": _verdict(e["ci_low"], e["ci_high"], e["diff"])})
    seconds = timer()
    config = _config("components", data, seconds, anchor_sets={n: {"n": len(A), "factor": f} for n, A, f in sets},
                     n_components=Ms, n_draws=n_draws, references=references, tau=tau, model_params=base, seed=seed,
                     n_boot=n_boot, skipped=skipped)
    result = ProtocolResult("components", rows, summary, effects, config, seconds=seconds)

    by = {(s["anchor_set"], s["model"], s["n_components"] if s["model"] == "gmm" else 0): s for s in summary}
    lines = _header(
        "Mixture complexity: AUPRC against the number of GMM components",
        "The usefulness of more mixture components depends on the anchor set: it helps a heterogeneous anchor "
        "distribution more than a narrow one (paper App. F.3, Fig. 7).",
        data,
        {"anchor sets": "; ".join(f"{n} ({len(A)} anchors → `{f}`)" for n, A, f in sets),
         "temperature τ": tau, "draws": f"{n_draws} GMM initialisations per M, seed {seed}",
         "skipped": "; ".join(skipped) or "none", "runtime": f"{seconds:.1f} s"})
    head = ["anchor set"] + [f"M = {M}" for M in Ms] + list(references)
    table_rows = []
    for name, A, f in sets:
        cells = []
        for M in Ms:
            s = by.get((name, "gmm", M))
            cells.append("—" if s is None else fmt_ci(s["auprc"], s["ci_low"], s["ci_high"]))
        for ref in references:
            s = by.get((name, ref, 0))
            cells.append("—" if s is None else f"{s['auprc']:.3f}")
        table_rows.append([name] + cells)
    lines += ["## Mean AUPRC [95 % interval]", "", markdown_table(head, table_rows), ""]
    verdicts = []
    for name, A, f in sets:
        es = [e for e in effects if e["anchor_set"] == name]
        if es:
            best = max(es, key=lambda e: e["diff"])
            verdicts.append(f"{name}: largest gain over the smallest M is {best['comparison']} = "
                            f"{fmt_ci(best['diff'], best['ci_low'], best['ci_high'], signed=True)}; at the largest M: "
                            f"{fmt_ci(es[-1]['diff'], es[-1]['ci_low'], es[-1]['ci_high'], signed=True)}")
    result.config["verdicts"] = verdicts
    lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts] + [""]
    lines += ["## GMM(M) minus GMM(smallest M) (paired over initialisations and queries)", "",
              markdown_table(["anchor set", "comparison", "difference [95 %]", "verdict"],
                             [[e["anchor_set"], e["comparison"], fmt_ci(e["diff"], e["ci_low"], e["ci_high"],
                                                                        signed=True), e["verdict"]] for e in effects]),
              ""]

    def plot(fig):
        n = len(sets)
        for i, (name, A, f) in enumerate(sets):
            ax = fig.add_subplot(1, n, i + 1)
            rs = [by[(name, "gmm", M)] for M in Ms if (name, "gmm", M) in by]
            if rs:
                _band(ax, [r["n_components"] for r in rs], rs, "gmm", _color("gmm"))
            for ref in references:
                s = by.get((name, ref, 0))
                if s is not None:
                    ax.axhline(s["auprc"], color=_color(ref), ls="--", lw=1, label=ref)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("GMM components M")
            ax.set_ylabel(f"AUPRC ({f})")
            ax.set_title(name, fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)

    figsize = (max(5.0, 3.6 * len(sets)), 4.2)
    return write_outputs(result, out_dir, "\n".join(lines), plot, figsize=figsize, columns={
        "rows": ["anchor_set", "factor", "model", "n_components", "draw", "auprc"],
        "summary": ["anchor_set", "model", "n_components", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["anchor_set", "factor", "n_components", "comparison", "diff", "ci_low", "ci_high", "verdict"]})


# ================================================================================ table
@honours_progress
def table(data: EvalData, entries: Any, *, models: Sequence[str] = ("softmax",),
          baselines: Sequence[str] = BASELINES, per_value: bool | Sequence[Any] = False, n_draws: int = 1,
          anchor_fraction: float = 1.0, tau: float | None = None,
          model_params: Mapping[str, Mapping[str, Any]] | None = None, out_dir: Any = None, seed: int = 0,
          n_boot: int = 1000, progress: bool | None = None) -> ProtocolResult:
    """Per-label AUPRC differences against cosine and ITI (paper Tables 2 and 3).

    Each entry is a label of the table: an anchor set and the factor it describes (one
    pathology's report-style anchors in the paper). Every model and ITI are fitted on the
    entry's anchors (``n_draws`` random draws keeping ``anchor_fraction`` of them, the
    analogue of the paper's repeated anchor generations); cosine needs no anchors. The
    per-query AP differences model − baseline are averaged with a bootstrap interval over
    draws and queries (:func:`anchordiv.metrics.paired_difference`).

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
    per_value : bool or sequence, optional
        False: one row per entry, over all queries. True: one row per value of the
        entry's factor, over the queries with that value (e.g. each class). A sequence:
        only those values (``[1]`` for a binary pathology flag: queries that have the
        finding, relevant keys that have it).
    n_draws : int, optional
        Anchor draws per entry.
    anchor_fraction : float, optional
        Fraction of the anchors kept per draw (1 keeps all).
    tau, model_params, out_dir, seed, n_boot, progress
        As in :func:`coordinate`.

    Returns
    -------
    ProtocolResult
        ``rows``: label, factor, model, draw, auprc (over all queries); ``summary``: label,
        value, model, auprc with interval; ``effects``: label, value, model, baseline,
        diff, ci_low, ci_high, and the class of the difference (> 0.005, within ±0.005,
        < −0.005, as in Table 2).
    """
    timer = Timer()
    seed = check_seed(seed)
    n_draws = check_positive_int(n_draws, "n_draws")
    ents = _entries(entries, data, "entries")
    models = check_models(models, ANCHOR_MODELS, "anchor model")
    baselines = check_models(baselines, BASELINES, "baseline")
    if not models or not baselines:
        raise ValueError("table needs at least one model and one baseline.")
    tau = resolve_tau(tau, data, models)

    per: dict[tuple, list] = {}
    rows: list[dict] = []
    fitted = list(models) + [b for b in baselines if b != "cosine"]
    bar = progress_bar(len(ents) * (n_draws * len(fitted) + ("cosine" in baselines)), "table", progress)
    for name, A, f in ents:
        if "cosine" in baselines:
            per[(name, "cosine")] = [_fit_score("cosine", None, data, [f], tau, model_params, seed)[f]]
            rows.append({"label": name, "factor": f, "model": "cosine", "draw": 0,
                         "auprc": float(np.nanmean(per[(name, "cosine")][0]))})
            bar.update()
        for r in range(n_draws):
            sub = subsample(A, anchor_fraction, draw_seed(seed, r)) if anchor_fraction != 1 else A
            for m in fitted:
                res = _fit_score(m, sub, data, [f], tau, model_params, draw_seed(seed, 1, r))
                bar.update()
                if res is None:
                    continue
                per.setdefault((name, m), []).append(res[f])
                rows.append({"label": name, "factor": f, "model": m, "draw": r, "auprc": float(np.nanmean(res[f]))})
    bar.close()

    q_labels = {f: data.labels[f][data.queries] for _, _, f in ents}
    subsets: list[tuple[str, str, str, np.ndarray]] = []  # (label, factor, value, query mask)
    for name, A, f in ents:
        if per_value is False:
            subsets.append((name, f, "all", np.ones(data.queries.size, bool)))
            continue
        values = np.unique(q_labels[f]) if per_value is True else list(per_value)
        for v in values:
            mask = q_labels[f] == v
            if not mask.any():
                raise ValueError(f"no query has {f} = {v!r}; the values present are {np.unique(q_labels[f]).tolist()}.")
            subsets.append((name, f, str(v), mask))

    summary, effects = [], []
    for name, f, v, mask in subsets:
        for m in list(models) + list(baselines):
            if (name, m) not in per:
                continue
            mat = [x[mask] for x in per[(name, m)]]
            summary += [{"label": name, "value": v, **s} for s in summarize({(m,): mat}, ["model"], n_boot, seed)]
        for m in models:
            if (name, m) not in per:
                continue
            for b in baselines:
                if (name, b) not in per:
                    continue
                e = paired_effect([x[mask] for x in per[(name, m)]], [x[mask] for x in per[(name, b)]], n_boot, seed)
                cls = "nan" if math.isnan(e["diff"]) else ("better" if e["diff"] > TIE else
                                                           ("worse" if e["diff"] < -TIE else "tie"))
                effects.append({"label": name, "factor": f, "value": v, "model": m, "baseline": b, **e,
                                "class": cls, "n_queries": int(mask.sum())})
    seconds = timer()
    config = _config("table", data, seconds, entries={n: {"n": len(A), "factor": f} for n, A, f in ents},
                     models=models, baselines=baselines, per_value=per_value if isinstance(per_value, bool)
                     else list(per_value), n_draws=n_draws, anchor_fraction=anchor_fraction, tau=tau,
                     model_params=model_params or {}, seed=seed, n_boot=n_boot)
    result = ProtocolResult("table", rows, summary, effects, config, seconds=seconds)

    lines = _header(
        "Per-label AUPRC differences against the reference geometries",
        "Label-specific anchors specialise retrieval beyond the reference geometries: anchor divergence minus "
        "cosine and minus ITI is positive for most labels (paper Tables 2 and 3).",
        data,
        {"entries": "; ".join(f"{n} ({len(A)} anchors → `{f}`)" for n, A, f in ents),
         "temperature τ": tau, "draws": f"{n_draws} anchor draws keeping {anchor_fraction:g} of each set, seed {seed}",
         "runtime": f"{seconds:.1f} s"})

    def cell(e):
        txt = fmt_ci(e["diff"], e["ci_low"], e["ci_high"], signed=True)
        return f"**{txt}**" if e["class"] == "better" else (f"_{txt}_ ↓" if e["class"] == "worse" else txt)

    head = ["label", "value", "n queries"] + [f"{m} − {b}" for m in models for b in baselines]
    idx = {(e["label"], e["value"], e["model"], e["baseline"]): e for e in effects}
    trows = []
    for name, f, v, mask in subsets:
        trows.append([name, v, int(mask.sum())] + [cell(idx[(name, v, m, b)]) if (name, v, m, b) in idx else "—"
                                                   for m in models for b in baselines])
    lines += ["## AUPRC difference [95 % interval]", "",
              f"Bold: > +{TIE}; plain: within ±{TIE}; italic with ↓: < −{TIE} (the classes of Table 2).", "",
              markdown_table(head, trows), ""]
    verdicts = []
    for m in models:
        for b in baselines:
            es = [e for e in effects if e["model"] == m and e["baseline"] == b and e["class"] != "nan"]
            if es:
                mean = float(np.mean([e["diff"] for e in es]))
                verdicts.append(f"{m} − {b}: better on {sum(e['class'] == 'better' for e in es)}, tie on "
                                f"{sum(e['class'] == 'tie' for e in es)}, worse on "
                                f"{sum(e['class'] == 'worse' for e in es)} of {len(es)} rows; "
                                f"interval above 0 on {sum(e['ci_low'] > 0 for e in es)}; mean difference {mean:+.3f}")
    result.config["verdicts"] = verdicts
    lines += ["## Verdict", ""] + [f"- {v}" for v in verdicts] + [""]
    lines += ["## AUPRC per label [95 % interval]", "",
              markdown_table(["label", "value", "model", "AUPRC"],
                             [[s["label"], s["value"], s["model"], fmt_ci(s["auprc"], s["ci_low"], s["ci_high"])]
                              for s in summary]), ""]

    def plot(fig):
        pairs = [(m, b) for m in models for b in baselines]
        labels = [f"{n} · {v}" if v != "all" else n for n, _, v, _ in subsets]
        ax = fig.add_subplot(111)
        h = 0.8 / max(1, len(pairs))
        for j, (m, b) in enumerate(pairs):
            ys, xs, lo, hi = [], [], [], []
            for i, (n, _, v, _) in enumerate(subsets):
                e = idx.get((n, v, m, b))
                if e is None or math.isnan(e["diff"]):
                    continue
                ys.append(i + (j - (len(pairs) - 1) / 2) * h)
                xs.append(e["diff"])
                lo.append(e["diff"] - e["ci_low"])
                hi.append(e["ci_high"] - e["diff"])
            ax.errorbar(xs, ys, xerr=[lo, hi], fmt="o" if b == "cosine" else "s", ms=3.5, capsize=2,
                        color=_color(m), mfc=_color(m) if b == "cosine" else "white", label=f"{m} − {b}")
        ax.axvline(0, color="k", lw=0.8)
        ax.axvspan(-TIE, TIE, color="0.85", zorder=0)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("AUPRC difference (positive favours the anchor model)")
        ax.set_title("Per-label differences against the reference geometries")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=0.3, axis="x")

    figsize = (9.0, max(4.8, 1.5 + 0.28 * len(subsets)))
    return write_outputs(result, out_dir, "\n".join(lines), plot, figsize=figsize, columns={
        "rows": ["label", "factor", "model", "draw", "auprc"],
        "summary": ["label", "value", "model", "auprc", "ci_low", "ci_high", "n_draws", "n_queries"],
        "effects": ["label", "factor", "value", "model", "baseline", "diff", "ci_low", "ci_high", "class",
                    "n_queries"]})


# ============================================================================== runtime
RUNTIME_MODELS = ("cosine", "softmax", "gaussian", "latent_gaussian", "latent_spherical")


def find_benchmarks(bench_dir: Any = None) -> Path:
    """The folder holding ``bench_scaling.py``: ``bench_dir``, else ``benchmarks/`` of the checkout or cwd."""
    if bench_dir is not None:
        path = Path(bench_dir)
        if not (path / "bench_scaling.py").is_file():
            raise FileNotFoundError(f"{path} holds no bench_scaling.py; pass the repository's benchmarks/ folder.")
        return path
    here = Path(__file__).resolve()
    for cand in [p / "benchmarks" for p in here.parents] + [Path.cwd() / "benchmarks"]:
        if (cand / "bench_scaling.py").is_file():
            return cand
    raise FileNotFoundError(
        "the runtime protocol runs benchmarks/bench_scaling.py of the anchordiv source checkout, which was not "
        "found; pass bench_dir= (or --bench-dir) pointing at that folder.")


def load_benchmark(bench_dir: Any = None) -> Any:
    """Import ``bench_scaling`` (the Table 4 benchmark) from the benchmarks folder."""
    path = find_benchmarks(bench_dir)
    added = str(path) not in sys.path
    if added:
        sys.path.insert(0, str(path))
    try:
        module = importlib.import_module("bench_scaling")
        if Path(getattr(module, "__file__", "")).resolve().parent != path.resolve():
            module = importlib.reload(module)
    finally:
        if added:
            sys.path.remove(str(path))
    if not callable(getattr(module, "worker", None)):
        raise RuntimeError(f"{path / 'bench_scaling.py'} has no worker(model, n_anchors, n_q, n_g, repeats) function.")
    return module


@honours_progress
def runtime(*, models: Sequence[str] = RUNTIME_MODELS, n_anchors: Sequence[int] = (256, 1024, 4096),
            n_queries: int = 200, n_gallery: int = 2000, repeats: int = 2, bench_dir: Any = None,
            out_dir: Any = None, progress: bool | None = None) -> ProtocolResult:
    """Fit + search time against the number of anchors (paper App. F.4, Table 4).

    Runs the repository's Table 4 benchmark (``benchmarks/bench_scaling.py``, its
    ``worker``) in this process for every model and anchor count: it draws seeded
    unit vectors (d = 512) for the anchors, queries and gallery, then times
    ``model.fit(anchors)`` followed by ``model.search(queries, gallery, k=10)`` (one
    warm-up, then the median of ``repeats`` calls). The paper's claim: softmax time grows
    with the number of anchors while the Gaussian model stays nearly flat once fitted.

    Parameters
    ----------
    models : sequence of str, optional
        Registry names (the benchmark's parameters: τ = 0.01, GMM with 8 components).
    n_anchors : sequence of int, optional
        Anchor counts N.
    n_queries, n_gallery : int, optional
        Queries and gallery size (paper: 10,000 and 50,000 on an H100).
    repeats : int, optional
        Timed calls after the warm-up.
    bench_dir : path, optional
        The ``benchmarks/`` folder (found next to the source checkout by default).
    out_dir, progress
        As in :func:`coordinate`.

    Returns
    -------
    ProtocolResult
        ``rows``: model, n_anchors, n_queries, n_gallery, seconds, fit_s, search_s,
        samples; ``summary`` adds the ratio to cosine; ``effects``: per model the time
        at the largest N over the time at the smallest.
    """
    timer = Timer()
    models = check_models(models)
    Ns = sorted({check_positive_int(n, "n_anchors") for n in n_anchors})
    n_queries = check_positive_int(n_queries, "n_queries")
    n_gallery = check_positive_int(n_gallery, "n_gallery")
    repeats = check_positive_int(repeats, "repeats")
    if not Ns or not models:
        raise ValueError("runtime needs at least one model and one anchor count.")
    if n_gallery < 10:
        raise ValueError("n_gallery must be at least 10 (the benchmark searches the top 10).")
    bench = load_benchmark(bench_dir)
    rows = []
    bar = progress_bar(len(Ns) * len(models), "runtime", progress)
    for N in Ns:
        for m in models:
            out = bench.worker(m, N, n_queries, n_gallery, repeats)
            bar.update()
            rows.append({"model": m, "n_anchors": N, "n_queries": n_queries, "n_gallery": n_gallery,
                         "seconds": float(out["seconds"]), "fit_s": float(out.get("fit_s", float("nan"))),
                         "search_s": float(out.get("search_s", float("nan"))),
                         "samples": len(out.get("samples", []))})
    bar.close()
    cos = {r["n_anchors"]: r["seconds"] for r in rows if r["model"] == "cosine"}
    summary = [{**r, "ratio_to_cosine": (r["seconds"] / cos[r["n_anchors"]]) if r["n_anchors"] in cos else float("nan")}
               for r in rows]
    effects = []
    for m in models:
        t = {r["n_anchors"]: r for r in rows if r["model"] == m}
        if len(t) >= 2:
            small, large = t[Ns[0]], t[Ns[-1]]
            effects.append({"model": m, "n_small": Ns[0], "n_large": Ns[-1], "seconds_small": small["seconds"],
                            "seconds_large": large["seconds"], "growth": large["seconds"] / small["seconds"],
                            "fit_growth": large["fit_s"] / small["fit_s"] if small["fit_s"] > 0 else float("nan"),
                            "search_growth": large["search_s"] / small["search_s"]})
    seconds = timer()
    config = _config("runtime", None, seconds, models=models, n_anchors=Ns, n_queries=n_queries, n_gallery=n_gallery,
                     repeats=repeats, benchmark="/".join(Path(bench.__file__).resolve().parts[-2:]),
                     benchmark_params={m: getattr(bench, "bl", None) and bench.bl.MODEL_PARAMS.get(m) for m in models},
                     dim=getattr(getattr(bench, "bl", None), "DIM", None))
    result = ProtocolResult("runtime", rows, summary, effects, config, seconds=seconds)
    growth = {e["model"]: e for e in effects}
    verdicts = []
    if "softmax" in growth and "gaussian" in growth:
        sm, ga = growth["softmax"], growth["gaussian"]
        verdicts.append(f"N {Ns[0]} → {Ns[-1]}: fit + search time × {sm['growth']:.2f} for softmax, × "
                        f"{ga['growth']:.2f} for gaussian (search alone × {sm['search_growth']:.2f} and × "
                        f"{ga['search_growth']:.2f}) → " + ("holds (softmax grows faster)" if sm["growth"] >
                                                            ga["growth"] else "does not hold"))
    result.config["verdicts"] = verdicts
    lines = _header(
        "Runtime against the number of anchors",
        "Softmax runtime grows with the anchor-set size, while the Gaussian anchor divergence stays nearly "
        "constant once the anchor distribution is fitted (paper App. F.4, Table 4).",
        None,
        {"benchmark": "benchmarks/bench_scaling.py (worker), synthetic unit vectors, d = "
                      f"{config['dim']}, top-10 exact search", "sizes": f"{n_queries} queries, {n_gallery} gallery",
         "timing": f"one warm-up, then the median of {repeats} calls of fit + search", "runtime": f"{seconds:.1f} s"})
    head = ["model"] + [f"N = {N}" for N in Ns]
    by = {(r["model"], r["n_anchors"]): r for r in summary}
    lines += ["## Fit + search time in seconds (ratio to cosine)", "",
              markdown_table(head, [[m] + [f"{by[(m, N)]['seconds']:.3g} ({by[(m, N)]['ratio_to_cosine']:.2f}×)"
                                           if (m, N) in by else "—" for N in Ns] for m in models]), "",
              "## Verdict", ""] + [f"- {v}" for v in verdicts] + [
              "", "## Growth from the smallest to the largest N", "",
              markdown_table(["model", "seconds (small N)", "seconds (large N)", "growth", "fit growth",
                              "search growth"],
                             [[e["model"], f"{e['seconds_small']:.3g}", f"{e['seconds_large']:.3g}",
                               f"{e['growth']:.2f}×", f"{e['fit_growth']:.2f}×", f"{e['search_growth']:.2f}×"]
                              for e in effects]), ""]

    def plot(fig):
        ax = fig.add_subplot(111)
        for m in models:
            xs = [N for N in Ns if (m, N) in by]
            ax.plot(xs, [by[(m, N)]["seconds"] for N in xs], "o-", color=_color(m), label=m, ms=3.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("number of anchors N")
        ax.set_ylabel("fit + search time (s)")
        ax.set_title(f"Runtime, {n_queries} queries × {n_gallery} gallery")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")

    return write_outputs(result, out_dir, "\n".join(lines), plot, columns={
        "rows": ["model", "n_anchors", "n_queries", "n_gallery", "seconds", "fit_s", "search_s", "samples"],
        "summary": ["model", "n_anchors", "n_queries", "n_gallery", "seconds", "fit_s", "search_s", "samples",
                    "ratio_to_cosine"],
        "effects": ["model", "n_small", "n_large", "seconds_small", "seconds_large", "growth", "fit_growth",
                    "search_growth"]})


# ============================================================================= registry
#: Protocols by name.
PROTOCOLS = {"coordinate": coordinate, "budget": budget, "adaptation": adaptation, "components": components,
             "table": table, "runtime": runtime}


def run_protocol(name: str, *args: Any, **kwargs: Any) -> ProtocolResult:
    """Run a protocol by name; a ``ValueError`` names the choices for an unknown one."""
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; choose from {', '.join(PROTOCOLS)}.")
    return PROTOCOLS[name](*args, **kwargs)
