"""``table``: per-label AUPRC differences against cosine and ITI (paper Tables 2 and 3)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from ..core import BASELINES, EvalData, check_models, draw_seed, positive_value, resolve_entries, resolve_tau, subsample
from ..report import TIE, EffectPlot, Observations, ProtocolResult, bullets, ci_text, long_table, pivot_table
from ._skeleton import Protocol, anchor_free, fit_models, fitted_on_anchors, needs_anchors, runs

if TYPE_CHECKING:
    import pandas as pd


def difference_class(diff: float) -> str:
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


class Table(Protocol):
    """Every entry's anchors fitted per draw and temperature; rows per label (and value) of the table."""

    protocol = "table"
    title = "Per-label AUPRC differences against the reference geometries"
    claim = ("Label-specific anchors specialise retrieval beyond the reference geometries: anchor divergence minus "
             "cosine and minus ITI is positive for most labels (paper Tables 2 and 3).")
    keys = ("tau", "label", "factor", "model", "draw")
    row_keys = ("tau", "label", "factor", "value", "model", "draw")
    by = ("tau", "label", "value", "model")
    effect_columns = ("tau", "label", "factor", "value", "model", "baseline", "diff", "ci_low", "ci_high", "class",
                      "n_queries")

    def validate(self) -> None:
        self.data, self.entries = resolve_entries(self.entries, self.data, "entries")
        self.models = check_models(self.models, {"anchor_model": True}, "anchor model")
        self.baselines = check_models(self.baselines, {"anchor_model": False}, "baseline")
        if not self.models or not self.baselines:
            raise ValueError("table needs at least one model and one baseline.")
        given = [self.tau] if self.tau is None or np.ndim(self.tau) == 0 else list(self.tau)
        if not given:
            raise ValueError("tau is an empty list; give one temperature or several, e.g. [0.01, 0.05].")
        self.taus = [resolve_tau(t, self.data, self.models) for t in given]
        self.free = anchor_free(self.baselines)
        self.fitted = list(self.models) + fitted_on_anchors(self.baselines)
        self.table_rows, self.settings = self._rows_of_labels()

    def _rows_of_labels(self) -> tuple[list[tuple[str, str, str, np.ndarray]], dict[str, str]]:
        """The rows of the table, ``(label, factor, value, query mask)``, and each entry's setting."""
        data = self.data
        rows, settings = [], {}
        for name, _, f in self.entries:
            q_labels = data.labels[f][data.queries]
            values, settings[name] = table_setting(data, f, self.per_value)
            if values is None:
                rows.append((name, f, "all", np.ones(data.queries.size, bool)))
                continue
            for v in values:
                mask = q_labels == v
                if not mask.any():
                    raise ValueError(f"no query has {f} = {v!r}; the values present are "
                                     f"{np.unique(q_labels).tolist()}.")
                rows.append((name, f, str(v), mask))
        return rows, settings

    def steps(self) -> int:
        return len(self.taus) * len(self.entries) * (self.n_draws * len(self.fitted) + len(self.free))

    def sweep(self, bar: Any) -> Observations:
        data, params, seed = self.data, self.model_params, self.seed
        obs = Observations()
        for t in self.taus:
            for name, A, f in self.entries:
                fit_models(obs, bar, self.free, None, data, f, t, params, seed, tau=t, label=name, factor=f, draw=0)
                for r in range(self.n_draws):
                    sub = subsample(A, self.anchor_fraction, draw_seed(seed, r)) if self.anchor_fraction != 1 else A
                    fit_models(obs, bar, self.fitted, sub, data, f, t, params, draw_seed(seed, 1, r), tau=t,
                               label=name, factor=f, draw=r)
        return obs

    def scored(self, observations: pd.DataFrame) -> pd.DataFrame:
        """The observations of each row's queries, with its ``value``, models before baselines."""
        import pandas as pd

        obs, queries = observations, self.data.queries
        order = {m: i for i, m in enumerate(list(self.models) + list(self.baselines))}
        parts = []
        for t in self.taus:
            for name, f, v, mask in self.table_rows:
                part = obs[(obs["tau"] == t).to_numpy() & (obs["label"] == name).to_numpy()
                           & np.isin(obs["query"].to_numpy(), queries[mask])]
                parts.append(part.assign(value=v).sort_values("model", key=lambda s: s.map(order), kind="stable"))
        return pd.concat(parts, ignore_index=True)

    def comparisons(self) -> list[tuple[dict, tuple, tuple]]:
        return [({"tau": t, "label": name, "factor": f, "value": v, "model": m, "baseline": b},
                 (t, name, v, m), (t, name, v, b))
                for t in self.taus for name, f, v, _ in self.table_rows for m in self.models for b in self.baselines]

    def measure(self) -> list[dict]:
        """The paired differences model − baseline with their class and number of queries."""
        effects = super().measure()
        for e in effects:
            e.update({"class": difference_class(e["diff"]),
                      "n_queries": self.mats[(e["tau"], e["label"], e["value"], e["model"])].shape[1]})
        return effects

    def judge(self) -> list[str]:
        verdicts = []
        for t in self.taus:
            for m in self.models:
                for b in self.baselines:
                    es = [e for e in self.effects if e["tau"] == t and e["model"] == m and e["baseline"] == b
                          and e["class"] != "nan"]
                    if es:
                        n_cls = {c: sum(e["class"] == c for e in es) for c in ("better", "tie", "worse")}
                        verdicts.append((f"τ = {t:g}: " if len(self.taus) > 1 else "")
                                        + f"{m} − {b}: better on {n_cls['better']}, tie on {n_cls['tie']}, worse on "
                                        f"{n_cls['worse']} of {len(es)} rows; interval above 0 on "
                                        f"{sum(e['ci_low'] > 0 for e in es)}; mean difference "
                                        f"{float(np.mean([e['diff'] for e in es])):+.3f}")
        return verdicts

    def parameters(self) -> dict:
        per_value = self.per_value
        return dict(entries={n: {"n": len(A), "factor": f} for n, A, f in self.entries}, models=self.models,
                    baselines=self.baselines,
                    per_value=per_value if per_value is None or isinstance(per_value, bool) else list(per_value),
                    settings=self.settings, n_draws=self.n_draws, anchor_fraction=self.anchor_fraction,
                    tau=self.taus[0] if len(self.taus) == 1 else self.taus, model_params=self.model_params or {},
                    seed=self.seed, n_boot=self.n_boot)

    def facts(self) -> dict:
        return {"entries": "; ".join(f"{n} ({len(A)} anchors → `{f}`)" for n, A, f in self.entries),
                "setting": "; ".join(sorted(set(self.settings.values()))),
                "temperature τ": ", ".join(f"{t:g}" for t in self.taus),
                "draws": f"{self.n_draws} anchor draws keeping {self.anchor_fraction:g} of each set, seed {self.seed}"}

    def pairs(self) -> list[tuple[str, str]]:
        return [(m, b) for m in self.models for b in self.baselines]

    def row_cells(self) -> list[tuple[tuple, list]]:
        """``((tau, label, value), label cells)`` of each row of the Markdown table and the plot."""
        return [((t, n, v), [f"{t:g}", n, v, int(mask.sum())]) for t in self.taus for n, _, v, mask in self.table_rows]

    def sections(self) -> list[tuple[str | None, str]]:
        def cell(r):
            if "baseline" not in r:
                return ci_text(r)
            txt = ci_text(r, signed=True)
            return f"**{txt}**" if r["class"] == "better" else (f"_{txt}_ ↓" if r["class"] == "worse" else txt)

        columns = ([(("diff", *p), f"{p[0]} − {p[1]}") for p in self.pairs()]
                   + [(("abs", g), f"AUPRC {g}") for g in list(self.models) + list(self.baselines)])
        legend = (f"Bold: > +{TIE}; plain: within ±{TIE}; italic with ↓: < −{TIE} (the classes of Table 2). "
                  "The AUPRC columns are each geometry's mean over the row's queries.")
        return [("AUPRC difference [95 % interval]", legend + "\n\n" + pivot_table(
                    self.effects + self.summary, self.row_cells(), columns,
                    lambda r: (r["tau"], r["label"], r["value"]),
                    lambda r: ("diff", r["model"], r["baseline"]) if "baseline" in r else ("abs", r["model"]), cell,
                    ["τ", "label", "value", "n queries"])),
                ("Verdict", bullets(self.verdicts)),
                ("AUPRC per label [95 % interval]", long_table(self.summary, [
                    ("τ", lambda r: f"{r['tau']:g}"), ("label", "label"), ("value", "value"), ("model", "model"),
                    ("AUPRC", ci_text)]))]

    def plot(self) -> EffectPlot:
        row_keys = self.row_cells()
        sweeps_tau = len(self.taus) > 1
        return EffectPlot(rows=[k for k, _ in row_keys],
                          row_labels=[(f"τ {t:g} · " if sweeps_tau else "") + (f"{n} · {v}" if v != "all" else n)
                                      for t in self.taus for n, _, v, _ in self.table_rows],
                          row_of=lambda e: (e["tau"], e["label"], e["value"]), series=self.pairs(),
                          series_of=lambda e: (e["model"], e["baseline"]), label=lambda s: f"{s[0]} − {s[1]}",
                          hollow=lambda s: needs_anchors(s[1]),
                          xlabel="AUPRC difference (positive favours the anchor model)",
                          title="Per-label differences against the reference geometries",
                          figsize=(9.0, max(4.8, 1.5 + 0.28 * len(row_keys))))


@runs(Table)
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
