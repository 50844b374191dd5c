"""``budget``: parametric models with few anchors, softmax at full coverage (paper §5.3, Figs. 4, 6)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ...anchors import AnchorSet
from ...models import model_names
from ..core import (ANCHOR_MODELS, BASELINES, PARAMETRIC, EvalData, check_anchor_set, check_models, draw_seed,
                    fit_score, resolve_tau)
from ..report import LinePlot, Observations, ProtocolResult, bullets, ci_text, long_table, paired_effect, verdict
from ._skeleton import (DIFF, EFFECT, Protocol, anchor_budgets, anchor_free, budget_draws, budget_table, fit_models,
                        fitted_on_anchors, n_budget_draws, runs)

#: The non-parametric anchor model that the parametric ones are compared with (the claim of §5.3).
SOFTMAX = next(iter(model_names(builtin=True, nonparametric=True)))


class Budget(Protocol):
    """Random anchor subsets of each budget; every model fitted on the same subset."""

    protocol = "budget"
    title = "Anchor budget: AUPRC against the number of anchors"
    claim = ("Parametric anchor models are strongest with limited anchors, while softmax improves with coverage and "
             "is strongest with the full anchor set (paper §5.3, Figs. 4 and 6).")
    keys = ("model", "budget", "draw", "n_anchors")
    row_columns = ("model", "budget", "draw", "auprc", "n_anchors")
    by = ("model", "budget")
    over = "budget"
    effect_columns = ("budget", "model", "comparison", *EFFECT)

    def validate(self) -> None:
        self.models = check_models(self.models, {"anchor_model": True}, "anchor model")
        self.baselines = check_models(self.baselines, {"anchor_model": False}, "baseline")
        if not self.models and not self.baselines:
            raise ValueError("models and baselines are both empty.")
        self.tau = resolve_tau(self.tau, self.data, self.models)
        self.S = check_anchor_set(self.anchors, self.data, "anchors")
        self.f = self.data.check_factor(self.factor)
        self.N = len(self.S)
        self.levels = anchor_budgets(self.budgets, self.N, "anchors")
        self.set_name = self.name or self.f
        self.free = anchor_free(self.baselines)
        self.fitted = list(self.models) + fitted_on_anchors(self.baselines)

    def steps(self) -> int:
        return n_budget_draws(self.levels, self.N, self.n_draws) * len(self.fitted) + len(self.free)

    def sweep(self, bar: Any) -> Observations:
        data, f, seed = self.data, self.f, self.seed
        obs = Observations()
        once = {}
        for m in self.free:
            once[m] = fit_score(m, None, data, [f], self.tau, self.model_params, seed)[f]
            bar.update()
        for b, r, sub in budget_draws(self.S, self.levels, self.n_draws, seed):
            fit_models(obs, bar, self.fitted, sub, data, f, self.tau, self.model_params, draw_seed(seed, 1, r),
                       budget=b, draw=r, n_anchors=b)
        for m, ap in once.items():
            obs.add(ap, data.queries, model=m, budget=None, draw=0, n_anchors=0)
        return obs

    def comparisons(self) -> list[tuple[dict, tuple, tuple]]:
        return [({"budget": b, "model": m, "comparison": f"{m} - {SOFTMAX}"}, (m, b), (SOFTMAX, b))
                for b in self.levels for m in self.models if m != SOFTMAX]

    def judge(self) -> list[str]:
        """The budget claim at the smallest contested budget and at the full set."""
        para = [m for m in self.models if m in PARAMETRIC]
        if SOFTMAX not in self.models or not para:
            return [f"needs {SOFTMAX} and at least one parametric model"]
        mats, N = self.mats, self.N
        at = {(s["model"], s["budget"]): s for s in self.summary}

        def best_at(b: int) -> str:
            return max((m for m in para if (m, b) in at), key=lambda m: at[(m, b)]["auprc"])

        out = []
        small = [b for b in self.levels if (SOFTMAX, b) in mats and any((m, b) in mats for m in para)]
        if small:
            b0 = small[0]
            best = best_at(b0)
            e = paired_effect(mats[(best, b0)], mats[(SOFTMAX, b0)], self.n_boot, self.seed)
            out.append(f"few anchors (n = {b0}): best parametric (highest mean) {best} − {SOFTMAX} = "
                       f"{ci_text(e, signed=True)} → {verdict(e)}")
        if (SOFTMAX, N) in mats:
            if any((m, N) in at for m in para):
                best = best_at(N)
                e = paired_effect(mats[(SOFTMAX, N)], mats[(best, N)], self.n_boot, self.seed)
                out.append(f"full set (n = {N}): {SOFTMAX} − best parametric (highest mean) {best} = "
                           f"{ci_text(e, signed=True)} → {verdict(e)}")
            out.append(self._softmax_wins(para, at))
        return out

    def _softmax_wins(self, para: Sequence[str], at: Mapping[tuple, dict]) -> str:
        """From which budget on (or at which budgets) softmax has the highest mean of the anchor models."""
        contested = [b for b in self.levels if (SOFTMAX, b) in at and any((m, b) in at for m in para)]
        wins = [b for b in contested if all(at[(SOFTMAX, b)]["auprc"] >= at[(m, b)]["auprc"]
                                            for m in para if (m, b) in at)]
        if not wins:
            return f"{SOFTMAX} never has the highest mean AUPRC of the anchor models"
        if all(b in wins for b in contested if b >= min(wins)):
            return f"{SOFTMAX} has the highest mean AUPRC of the anchor models from n = {min(wins)} on"
        return f"{SOFTMAX} has the highest mean AUPRC of the anchor models at n ∈ {wins}"

    def parameters(self) -> dict:
        return dict(models=self.models, baselines=self.baselines, factor=self.f,
                    anchor_set={"name": self.set_name, "n": self.N}, budgets=self.levels, n_draws=self.n_draws,
                    tau=self.tau, model_params=self.model_params or {}, seed=self.seed, n_boot=self.n_boot)

    def facts(self) -> dict:
        return {"anchors": f"{self.set_name} ({self.N} anchors) → factor `{self.f}`", "temperature τ": self.tau,
                "draws": f"{self.n_draws} random subsets per budget (the full set once), seed {self.seed}"}

    def sections(self) -> list[tuple[str | None, str]]:
        return [budget_table(self.summary, self.levels, self.shown(), "model"),
                ("Verdict", bullets(self.verdicts)),
                ("Parametric minus softmax (paired over draws and queries)", long_table(self.effects, [
                    ("budget", "budget"), ("comparison", "comparison"), DIFF, ("verdict", "verdict")]))]

    def shown(self) -> list[str]:
        return self.models + list(self.baselines)

    def plot(self) -> LinePlot:
        return LinePlot(x="budget", series=("model",), logx=2, xlabel="number of anchors", ylabel=f"AUPRC ({self.f})",
                        title="AUPRC against the anchor budget", style=lambda s: "--" if s[0] in BASELINES else "-",
                        order=[(m,) for m in self.shown()], legend_size=8, figsize=(8.5, 4.8))


@runs(Budget)
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
