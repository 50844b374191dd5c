"""``coordinate``: anchor distributions select the semantic coordinate (paper §5.2, Fig. 3)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ...anchors import AnchorSet
from ..core import EvalData, check_anchor_set, check_models, draw_seed, fit_score, resolve_tau, subsample
from ..report import LinePlot, Observations, ProtocolResult, bullets, ci_text, long_table, pivot_table, verdict
from ._skeleton import DIFF, EFFECT, Protocol, runs


class Coordinate(Protocol):
    """The mixture q_p = p·q_A + (1 − p)·q_B swept over p, scored on factors A and B."""

    protocol = "coordinate"
    title = "Coordinate control: AUPRC on two factors as the anchor mixture moves from B to A"
    claim = ("Anchor distributions select the semantic coordinate (paper §5.2, Fig. 3): raising the mass p of "
             "factor-A anchors raises retrieval by factor A and lowers retrieval by factor B.")
    keys = ("model", "p", "draw", "factor", "role", "n_anchors")
    row_columns = ("model", "p", "draw", "factor", "role", "auprc", "n_anchors")
    by = ("model", "p", "factor", "role")
    over = "p"
    effect_columns = ("model", "factor", "role", "comparison", *EFFECT)

    def validate(self) -> None:
        data = self.data
        self.models = check_models(self.models)
        self.baselines = check_models(self.baselines, ("cosine",), "p-independent baseline")
        if not self.models:
            raise ValueError("models is empty; give at least one model.")
        self.tau = resolve_tau(self.tau, data, self.models)
        self.A = check_anchor_set(self.anchors_a, data, "anchors_a")
        self.B = check_anchor_set(self.anchors_b, data, "anchors_b")
        self.fa, self.fb = data.check_factor(self.factor_a), data.check_factor(self.factor_b)
        if self.fa == self.fb:
            raise ValueError("factor_a and factor_b are the same factor; pick two different ones.")
        ps = np.linspace(0, 1, 11) if self.proportions is None else self.proportions
        self.levels = [round(float(p), 6) for p in ps]
        if not self.levels or any(not 0 <= p <= 1 for p in self.levels):
            raise ValueError(f"proportions must be values in [0, 1], got {self.levels}.")
        self.names = self.names or (self.fa, self.fb)
        self.role = {self.fa: "A", self.fb: "B"}

    def steps(self) -> int:
        return self.n_draws * len(self.levels) * len(self.models) + len(self.baselines)

    def sweep(self, bar: Any) -> Observations:
        data, fa, fb, seed = self.data, self.fa, self.fb, self.seed
        obs = Observations()
        base = {}
        for b in self.baselines:
            base[b] = fit_score(b, None, data, [fa, fb], self.tau, self.model_params, seed)
            bar.update()
        for r in range(self.n_draws):
            A_r = subsample(self.A, self.anchor_fraction, draw_seed(seed, 0, r))
            B_r = subsample(self.B, self.anchor_fraction, draw_seed(seed, 1, r))
            for p in self.levels:
                mix = AnchorSet.mixture([A_r, B_r], [p, 1 - p])
                for m in self.models:
                    res = fit_score(m, mix, data, [fa, fb], self.tau, self.model_params, draw_seed(seed, 2, r))
                    bar.update()
                    for f in (fa, fb) if res is not None else ():
                        obs.add(res[f], data.queries, model=m, p=p, draw=r, factor=f, role=self.role[f],
                                n_anchors=len(mix.support()))
        for b, res in base.items():
            for f in (fa, fb):
                obs.add(res[f], data.queries, model=b, p=None, draw=0, factor=f, role=self.role[f], n_anchors=0)
        return obs

    def comparisons(self) -> list[tuple[dict, tuple, tuple]]:
        p0, p1, fa, fb = min(self.levels), max(self.levels), self.fa, self.fb
        out = []
        for m in self.models:
            out += [({"model": m, "factor": fa, "role": "A", "comparison": f"AUPRC(p={p1:g}) - AUPRC(p={p0:g})"},
                     (m, p1, fa, "A"), (m, p0, fa, "A")),
                    ({"model": m, "factor": fb, "role": "B", "comparison": f"AUPRC(p={p0:g}) - AUPRC(p={p1:g})"},
                     (m, p0, fb, "B"), (m, p1, fb, "B"))]
        return out

    def judge(self) -> list[str]:
        p0, p1 = min(self.levels), max(self.levels)
        verdicts = []
        for m in self.models:
            es = {e["role"]: e for e in self.effects if e["model"] == m}
            if "A" in es and "B" in es:
                ok = all(verdict(es[k]) == "holds" for k in "AB")
                on_b = {"diff": -es["B"]["diff"], "ci_low": -es["B"]["ci_high"], "ci_high": -es["B"]["ci_low"]}
                verdicts.append(f"{m}: p {p0:g} → {p1:g} changes AUPRC on {self.fa} by "
                                f"{ci_text(es['A'], signed=True)} and on {self.fb} by {ci_text(on_b, signed=True)} "
                                f"→ {'holds' if ok else 'does not hold'}")
        return verdicts

    def parameters(self) -> dict:
        return dict(models=self.models, baselines=self.baselines, factor_a=self.fa, factor_b=self.fb,
                    anchor_sets={"A": {"name": self.names[0], "n": len(self.A)},
                                 "B": {"name": self.names[1], "n": len(self.B)}},
                    proportions=self.levels, n_draws=self.n_draws, anchor_fraction=self.anchor_fraction,
                    tau=self.tau, model_params=self.model_params or {}, seed=self.seed, n_boot=self.n_boot)

    def facts(self) -> dict:
        return {"anchor set A": f"{self.names[0]} ({len(self.A)} anchors) → factor `{self.fa}`",
                "anchor set B": f"{self.names[1]} ({len(self.B)} anchors) → factor `{self.fb}`",
                "mixture": "q_p = p·q_A + (1 − p)·q_B", "temperature τ": self.tau,
                "draws": f"{self.n_draws} (each keeps {self.anchor_fraction:g} of each set), seed {self.seed}"}

    def sections(self) -> list[tuple[str | None, str]]:
        factors, role = (self.fa, self.fb), self.role
        sections = [("Mean AUPRC [95 % interval] against p", pivot_table(
            self.summary, [(p, [f"{p:g}"]) for p in self.levels],
            [((m, f), f"{m} · {role[f]} ({f})") for m in self.models for f in factors],
            lambda s: s["p"], lambda s: (s["model"], s["factor"]), ci_text, ["p"]))]
        if self.baselines:
            at = {(s["model"], s["p"], s["factor"]): s for s in self.summary}
            p0 = min(self.levels)
            sections.append((None, "References (independent of p): " + "; ".join(
                f"{b} · {role[f]} ({f}) {ci_text(at[(b, p0, f)])}" for b in self.baselines for f in factors)))
        return sections + [
            ("Verdict", bullets(self.verdicts)),
            ("Effect of the mixture (paired over draws and queries)", long_table(self.effects, [
                ("model", "model"), ("factor", lambda e: f"{e['role']} ({e['factor']})"),
                ("comparison", "comparison"), DIFF, ("verdict", "verdict")]))]

    def plot(self) -> LinePlot:
        return LinePlot(x="p", series=("model", "factor"),
                        xlabel=f"p (mass of {self.names[0]} anchors; 1 − p on {self.names[1]})",
                        title="Anchor mixture selects the semantic coordinate (solid: A, dashed: B)", title_size=10,
                        style=lambda s: "-" if s[1] == self.fa else "--", flat=lambda s: s[0] in self.baselines,
                        figsize=(9.5, 5))


@runs(Coordinate)
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
