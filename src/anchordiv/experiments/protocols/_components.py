"""``components``: mixture complexity against anchor-set structure (paper App. F.3, Fig. 7)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..._util import positive_int
from ...models import model_names, model_params
from ..core import EvalData, build_geometry, check_entries, check_models, draw_seed, resolve_tau, score
from ..report import LinePlot, Observations, ProtocolResult, bullets, ci_text, long_table, pivot_table
from ._skeleton import DIFF, EFFECT, Protocol, fit_models, runs

#: The geometry whose number of components M the protocol sweeps (the GMM of App. F.3).
COMPONENTS_MODEL = next(n for n in model_names(builtin=True, anchor_model=True) if "n_components" in model_params(n))


class Components(Protocol):
    """Per anchor set, the mixture fitted with each number of components M (several initialisations)."""

    protocol = "components"
    title = "Mixture complexity: AUPRC against the number of GMM components"
    claim = ("The usefulness of more mixture components depends on the anchor set: it helps a heterogeneous anchor "
             "distribution more than a narrow one (paper App. F.3, Fig. 7).")
    keys = ("anchor_set", "factor", "model", "n_components", "draw")
    by = ("anchor_set", "model", "n_components")
    effect_columns = ("anchor_set", "factor", "n_components", "comparison", *EFFECT)

    def validate(self) -> None:
        self.anchor_sets = check_entries(self.anchor_sets, self.data, "anchor_sets")
        self.Ms = sorted({positive_int(m, "n_components") for m in self.n_components})
        if not self.Ms:
            raise ValueError("n_components is empty.")
        self.references = check_models(self.references, [m for m in model_names() if m != COMPONENTS_MODEL],
                                       "reference")
        self.tau = resolve_tau(self.tau, self.data, [COMPONENTS_MODEL])
        self.base = {k: dict(v) for k, v in (self.model_params or {}).items()}
        self.base.setdefault(COMPONENTS_MODEL, {})
        self.base[COMPONENTS_MODEL].pop("n_components", None)
        self.skipped: list[str] = []

    def steps(self) -> int:
        return sum(len(self.Ms) * self.n_draws + len(self.references) for _ in self.anchor_sets)

    def sweep(self, bar: Any) -> Observations:
        data, tau, base, seed = self.data, self.tau, self.base, self.seed
        obs = Observations()
        for name, A, f in self.anchor_sets:
            fit_models(obs, bar, self.references, A, data, f, tau, base, seed, anchor_set=name, factor=f,
                       n_components=None, draw=0)
            for M in self.Ms:
                if M > len(A.support()):
                    self.skipped.append(f"{name}: M = {M} > {len(A.support())} anchors")
                    bar.update(self.n_draws)
                    continue
                for r in range(self.n_draws):
                    params = {**base, COMPONENTS_MODEL: {**base[COMPONENTS_MODEL], "n_components": M,
                                                         "seed": draw_seed(seed, M, r)}}
                    geometry = build_geometry(COMPONENTS_MODEL, tau, len(A), data.dim, params, seed, clip=False)
                    geometry.fit(A)
                    bar.update()
                    obs.add(score(geometry, data, [f])[f], data.queries, anchor_set=name, factor=f,
                            model=COMPONENTS_MODEL, n_components=M, draw=r)
        return obs

    def comparisons(self) -> list[tuple[dict, tuple, tuple]]:
        out = []
        for name, _, f in self.anchor_sets:
            done = [M for M in self.Ms if (name, COMPONENTS_MODEL, M) in self.mats]
            out += [({"anchor_set": name, "factor": f, "n_components": M,
                      "comparison": f"{COMPONENTS_MODEL}(M={M}) - {COMPONENTS_MODEL}(M={done[0]})"},
                     (name, COMPONENTS_MODEL, M), (name, COMPONENTS_MODEL, done[0])) for M in done[1:]]
        return out

    def judge(self) -> list[str]:
        verdicts = []
        for name, _, _ in self.anchor_sets:
            es = [e for e in self.effects if e["anchor_set"] == name]
            if es:
                best = max(es, key=lambda e: e["diff"])
                verdicts.append(f"{name}: largest gain over the smallest M is {best['comparison']} = "
                                f"{ci_text(best, signed=True)}; at the largest M: {ci_text(es[-1], signed=True)}")
        return verdicts

    def parameters(self) -> dict:
        return dict(anchor_sets={n: {"n": len(A), "factor": f} for n, A, f in self.anchor_sets}, n_components=self.Ms,
                    n_draws=self.n_draws, references=self.references, tau=self.tau, model_params=self.base,
                    seed=self.seed, n_boot=self.n_boot, skipped=self.skipped)

    def facts(self) -> dict:
        return {"anchor sets": "; ".join(f"{n} ({len(A)} anchors → `{f}`)" for n, A, f in self.anchor_sets),
                "temperature τ": self.tau, "draws": f"{self.n_draws} GMM initialisations per M, seed {self.seed}",
                "skipped": "; ".join(self.skipped) or "none"}

    def sections(self) -> list[tuple[str | None, str]]:
        # a reference is fitted once per set, outside the sweep over M (n_components empty): its mean alone
        return [("Mean AUPRC [95 % interval]", pivot_table(
                    self.summary, [(n, [n]) for n, _, _ in self.anchor_sets],
                    [((COMPONENTS_MODEL, M), f"M = {M}") for M in self.Ms]
                    + [((ref, None), ref) for ref in self.references],
                    lambda s: s["anchor_set"], lambda s: (s["model"], s["n_components"]),
                    lambda s: f"{s['auprc']:.3f}" if s["n_components"] is None else ci_text(s), ["anchor set"])),
                ("Verdict", bullets(self.verdicts)),
                ("GMM(M) minus GMM(smallest M) (paired over initialisations and queries)", long_table(self.effects, [
                    ("anchor set", "anchor_set"), ("comparison", "comparison"), DIFF, ("verdict", "verdict")]))]

    def plot(self) -> LinePlot:
        factor_of = {n: f for n, _, f in self.anchor_sets}
        return LinePlot(x="n_components", series=("model",), facet="anchor_set", logx=2, xlabel="GMM components M",
                        ylabel=lambda n: f"AUPRC ({factor_of[n]})", title=lambda n: n, title_size=9,
                        flat=lambda s: s[0] in self.references,
                        style=lambda s: "--" if s[0] in self.references else "-", order=[(COMPONENTS_MODEL,)],
                        legend_outside=False, figsize=(max(5.0, 3.6 * len(self.anchor_sets)), 4.2))


@runs(Components)
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
