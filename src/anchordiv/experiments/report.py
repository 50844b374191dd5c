"""Tidy results of the protocols: aggregation, paired effects, and the files they write.

Every protocol records its measurements as a tidy :class:`pandas.DataFrame` of
*observations*, one row per query, condition and random draw, with the condition in
columns (``model``, ``p``, ``budget``, ``n_components``, ``factor``, ...), ``draw``,
``query`` (the item's row) and ``ap`` (its average precision). From it this module
derives, for any grouping ``by`` of the condition columns:

* the mean AUPRC of each group with a 95 % bootstrap interval over draws and queries
  (:func:`summarize`, :func:`anchordiv.metrics.bootstrap_ci`);
* paired differences between groups, the effects that test a claim
  (:func:`paired_effects`, :func:`anchordiv.metrics.paired_difference`), with a
  verdict (:func:`verdict`);

and writes ``<protocol>.csv`` (mean AP per condition and draw), ``_summary.csv``,
``_effects.csv``, ``.md``, ``.png`` and ``.json`` from a :class:`Report` spec: the
Markdown sections and a :class:`LinePlot` or :class:`EffectPlot`
(:func:`write_outputs`). A geometry that does not depend on the swept variable (cosine
against the anchor budget) is observed once with that column empty and shown at every
value (:func:`broadcast`).
"""

from __future__ import annotations

import csv
import json
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

from ..metrics import bootstrap_ci, paired_difference

__all__ = [
    "Observations", "ProtocolResult", "Report", "LinePlot", "EffectPlot", "broadcast", "groups", "per_draw",
    "summarize", "paired_effect", "paired_effects", "verdict", "tidy", "pivot_table", "long_table",
    "markdown_table", "fmt_ci", "bullets", "write_outputs", "TIE",
]

#: Differences smaller than this in absolute value count as ties (paper Table 2: 0.005).
TIE = 0.005


# ------------------------------------------------------------------------ frames
def _missing(v: Any) -> bool:
    """None, NaN or pandas' NA."""
    return v is None or (isinstance(v, (float, np.floating)) and math.isnan(v)) or type(v).__name__ == "NAType"


def _column(values: list) -> Any:
    """A column from Python values: integers with gaps stay integers (``Int64``)."""
    import pandas as pd

    present = [v for v in values if not _missing(v)]
    if len(present) < len(values) and present and all(
            isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in present):
        return pd.array([None if _missing(v) else int(v) for v in values], dtype="Int64")
    return values


def tidy(records: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    """A DataFrame of ``records`` with exactly ``columns`` (None where a record has no value)."""
    import pandas as pd

    return pd.DataFrame({c: _column([r.get(c) for r in records]) for c in columns}, columns=list(columns))


class Observations:
    """Builds the tidy observation frame block by block.

    ``add(ap, queries, **condition)`` appends one block: the average precision of each
    query, the rows of the queries, and the condition shared by the block (None where a
    column does not apply, e.g. ``p`` of cosine).
    """

    def __init__(self) -> None:
        self.blocks: list[tuple[dict, np.ndarray, np.ndarray]] = []

    def add(self, ap: np.ndarray, queries: np.ndarray, **condition: Any) -> None:
        self.blocks.append((condition, np.asarray(ap, dtype=np.float64), np.asarray(queries)))

    def frame(self, columns: Sequence[str]) -> pd.DataFrame:
        """The frame: condition ``columns``, then ``query`` and ``ap``."""
        import pandas as pd

        out = {c: _column([x for cond, ap, _ in self.blocks for x in [cond.get(c)] * len(ap)]) for c in columns}
        out["query"] = np.concatenate([q for _, _, q in self.blocks] or [np.zeros(0, np.int64)])
        out["ap"] = np.concatenate([ap for _, ap, _ in self.blocks] or [np.zeros(0)])
        return pd.DataFrame(out)


def broadcast(obs: pd.DataFrame, column: str, values: Sequence[Any]) -> pd.DataFrame:
    """``obs`` in blocks of ``column == v`` for each ``v``, each block followed by the rows
    without a ``column`` value (geometries independent of it), which take the value ``v``."""
    import pandas as pd

    free = obs[column].isna().to_numpy()
    if not free.any():
        return obs
    col = obs[column]
    parts = [obs[(col == v).fillna(False).to_numpy() | free].assign(**{column: v}) for v in values]
    return pd.concat(parts, ignore_index=True)


def _key(key: Any) -> tuple:
    key = key if isinstance(key, tuple) else (key,)
    return tuple(None if _missing(k) else k for k in key)


def groups(obs: pd.DataFrame, by: Sequence[str]) -> dict[tuple, np.ndarray]:
    """The AP of each group of ``by`` as a (draws, queries) matrix, in order of first appearance.

    Within a group the rows run draw by draw over the same queries in the same order
    (as the protocols record them).
    """
    ap, draw = obs["ap"].to_numpy(dtype=np.float64), obs["draw"].to_numpy()
    return {_key(key): ap[idx].reshape(np.unique(draw[idx]).size, -1)
            for key, idx in obs.groupby(list(by), sort=False, dropna=False).indices.items()}


def per_draw(obs: pd.DataFrame, keys: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    """Mean AP over the queries of each condition and draw (``keys`` include ``draw``), as
    column ``auprc``; ``columns`` orders the result."""
    vals = obs["ap"].to_numpy(dtype=np.float64)
    records = []
    for key, idx in obs.groupby(list(keys), sort=False, dropna=False).indices.items():
        records.append({**dict(zip(keys, _key(key))), "auprc": float(np.nanmean(vals[idx]))})
    return tidy(records, columns)


def _ci(values: np.ndarray, n_boot: int, seed: int) -> tuple[float, float, float, int]:
    """(mean, low, high, queries used) of a (draws, Q) matrix of per-query values."""
    if np.isnan(values).all():
        return float("nan"), float("nan"), float("nan"), 0
    ci = bootstrap_ci(values, n_boot=n_boot, seed=seed)
    return ci.mean, ci.low, ci.high, ci.n


def summarize(mats: Mapping[tuple, np.ndarray], by: Sequence[str], n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """Mean AUPRC with a 95 % bootstrap interval for each group of :func:`groups`.

    The mean AUPRC of a group is :math:`\\frac{1}{RQ}\\sum_{r,q} \\mathrm{AP}_{rq}` over
    its R draws and Q queries (paper §5.1, App. E.4); the interval resamples draws and
    queries (:func:`anchordiv.metrics.bootstrap_ci`, ``n_boot`` replicates, ``seed``).

    Returns
    -------
    list of dict
        One record per group: the ``by`` values, ``auprc``, ``ci_low``, ``ci_high``,
        ``n_draws`` and ``n_queries`` (queries with a relevant key).
    """
    out = []
    for key, mat in mats.items():
        mean, low, high, n_q = _ci(mat, n_boot, seed)
        out.append({**dict(zip(by, key)), "auprc": mean, "ci_low": low, "ci_high": high,
                    "n_draws": mat.shape[0], "n_queries": n_q})
    return out


def paired_effect(a: np.ndarray, b: np.ndarray, n_boot: int = 1000, seed: int = 0) -> dict:
    """Mean of ``a − b`` over draws and queries with a bootstrap interval, paired by query and draw.

    ``a`` and ``b`` are (draws, Q) matrices; a single-draw side (a geometry without random
    draws) is compared with every draw of the other
    (:func:`anchordiv.metrics.paired_difference`).
    """
    A, B = np.atleast_2d(a), np.atleast_2d(b)
    if A.shape[0] != B.shape[0] and 1 not in (A.shape[0], B.shape[0]):
        raise ValueError(f"cannot pair {A.shape[0]} draws with {B.shape[0]} draws.")
    A = A[0] if A.shape[0] == 1 else A
    B = B[0] if B.shape[0] == 1 else B
    if np.isnan(A - B).all():
        return {"diff": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    ci = paired_difference(A, B, n_boot=n_boot, seed=seed)
    return {"diff": ci.mean, "ci_low": ci.low, "ci_high": ci.high}


def verdict(e: Mapping[str, float]) -> str:
    """``holds`` (interval above 0 and difference above :data:`TIE`), ``reversed``, a tie, or inconclusive."""
    low, high, diff = e["ci_low"], e["ci_high"], e["diff"]
    if math.isnan(low):
        return "not measured"
    if low > 0 and diff > TIE:
        return "holds"
    if high < 0 and diff < -TIE:
        return "reversed"
    if abs(diff) <= TIE:
        return f"tie (|difference| <= {TIE})"
    return "inconclusive (interval contains 0)"


def paired_effects(mats: Mapping[tuple, np.ndarray], comparisons: Sequence[tuple[dict, tuple, tuple]],
                   n_boot: int = 1000, seed: int = 0) -> list[dict]:
    """Group ``a`` minus group ``b`` for each ``(labels, a, b)`` whose groups were measured.

    ``mats`` is :func:`groups`' result; each record holds ``labels``, ``diff``, ``ci_low``,
    ``ci_high`` and :func:`verdict`.
    """
    out = []
    for labels, a, b in comparisons:
        if a in mats and b in mats:
            e = paired_effect(mats[a], mats[b], n_boot, seed)
            out.append({**labels, **e, "verdict": verdict(e)})
    return out


# ---------------------------------------------------------------------- Markdown
def _fmt(v: Any, digits: int = 4) -> str:
    if _missing(v):
        return ""
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.{digits}f}"
    if isinstance(v, np.integer):
        return str(int(v))
    return str(v)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub Markdown table (floats with 3 decimals)."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(c, 3) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt_ci(mean: float, low: float, high: float, digits: int = 3, signed: bool = False) -> str:
    """``0.512 [0.498, 0.527]`` (with signs for differences); ``—`` when not measured."""
    if mean is None or math.isnan(mean):
        return "—"
    s = "+" if signed else ""
    return f"{mean:{s}.{digits}f} [{low:{s}.{digits}f}, {high:{s}.{digits}f}]"


def ci_text(r: Mapping[str, float], signed: bool = False) -> str:
    """:func:`fmt_ci` of a record's ``auprc`` (or ``diff``), ``ci_low`` and ``ci_high``."""
    return fmt_ci(r["diff"] if signed else r["auprc"], r["ci_low"], r["ci_high"], signed=signed)


def pivot_table(records: Sequence[Mapping], rows: Sequence[tuple[Any, Sequence]], columns: Sequence[tuple[Any, str]],
                row_of: Callable[[Mapping], Any], col_of: Callable[[Mapping], Any], text: Callable[[Mapping], str],
                corner: Sequence[str], best: str | None = None) -> str:
    """A Markdown table with one row per ``rows`` key and one column per ``columns`` key.

    ``rows`` holds ``(key, label cells)`` and ``columns`` ``(key, header)``; a record goes
    to cell ``(row_of(r), col_of(r))`` as ``text(r)`` (``—`` where none). With ``best``,
    the record of each row with the highest ``best`` value is bold.
    """
    cells = {(row_of(r), col_of(r)): r for r in records}
    out = []
    for rk, label in rows:
        here = {ck: cells[(rk, ck)] for ck, _ in columns if (rk, ck) in cells}
        top = max(here, key=lambda c: here[c][best]) if best and here else None
        out.append(list(label) + ["—" if ck not in here else
                                  (f"**{text(here[ck])}**" if ck == top else text(here[ck])) for ck, _ in columns])
    return markdown_table(list(corner) + [h for _, h in columns], out)


def long_table(records: Sequence[Mapping], columns: Sequence[tuple[str, Any]]) -> str:
    """A Markdown table with one row per record; ``columns`` holds ``(header, key or callable)``."""
    return markdown_table([h for h, _ in columns],
                          [[f(r) if callable(f) else r[f] for _, f in columns] for r in records])


def bullets(lines: Sequence[str]) -> str:
    return "\n".join(f"- {v}" for v in lines)


# -------------------------------------------------------------------------- plots
def color(name: str) -> str:
    """The colour of a geometry in every plot: its class's ``color``, else one derived from ``name``."""
    from ..models import registry

    cls = registry().get(name)
    return getattr(cls, "color", None) or f"C{sum(map(ord, name)) % 10}"


@dataclass
class LinePlot:
    """Lines of ``y`` against ``x``, one per ``series`` key, with their 95 % band.

    ``series`` names the columns that identify a line; ``label``, ``color`` and
    ``style`` map a series key (a tuple) to its legend text, colour and line style.
    Series for which ``flat`` is true do not depend on ``x`` and are drawn as a
    horizontal line; ``order`` lists series keys to draw (and list in the legend) first.
    ``facet`` draws one panel per value of that column, ``ylabel`` and ``title`` may then
    be callables of the facet value. ``logx`` is the base of a logarithmic x axis.
    """

    x: str
    series: tuple[str, ...]
    xlabel: str
    ylabel: Any = "AUPRC"
    title: Any = ""
    y: str = "auprc"
    band: bool = True
    label: Callable[[tuple], str] = lambda s: " · ".join(map(str, s))
    color: Callable[[tuple], str] = lambda s: color(str(s[0]))
    style: Callable[[tuple], str] = lambda s: "-"
    flat: Callable[[tuple], bool] = lambda s: False
    order: Sequence[tuple] = ()
    facet: str | None = None
    logx: int | None = None
    logy: bool = False
    legend_outside: bool = True
    legend_size: float = 7
    title_size: float | None = None
    figsize: tuple[float, float] = (7.5, 4.8)

    def draw(self, fig: Any, result: "ProtocolResult") -> None:
        import pandas as pd

        frame = result.summary
        panels = [None] if self.facet is None else list(pd.unique(frame[self.facet]))
        for i, panel in enumerate(panels):
            ax = fig.add_subplot(1, len(panels), i + 1)
            part = frame if panel is None else frame[frame[self.facet] == panel]
            lines = {_key(k): rows for k, rows in part.groupby(list(self.series), sort=False, dropna=False)}
            for key in sorted(lines, key=lambda k: list(self.order).index(k) if k in self.order else len(self.order)):
                rows = lines[key]
                if self.flat(key):
                    ax.axhline(rows[self.y].iloc[0], color=self.color(key), ls=self.style(key), lw=1, alpha=0.7,
                               label=self.label(key))
                    continue
                rows = rows[rows[self.x].notna()]
                xs, ys = rows[self.x].to_numpy(float), rows[self.y].to_numpy(float)
                ax.plot(xs, ys, self.style(key), color=self.color(key), marker="o", ms=3.5, lw=1.6,
                        label=self.label(key))
                if self.band:
                    ax.fill_between(xs, rows["ci_low"].to_numpy(float), rows["ci_high"].to_numpy(float),
                                    color=self.color(key), alpha=0.15, lw=0)
            if self.logx:
                ax.set_xscale("log", base=self.logx)
            if self.logy:
                ax.set_yscale("log")
            ax.set_xlabel(self.xlabel)
            ax.set_ylabel(self.ylabel(panel) if callable(self.ylabel) else self.ylabel)
            title = self.title(panel) if callable(self.title) else self.title
            ax.set_title(title, fontsize=self.title_size)
            if self.legend_outside:
                ax.legend(fontsize=self.legend_size, loc="upper left", bbox_to_anchor=(1.01, 1))
            else:
                ax.legend(fontsize=self.legend_size)
            ax.grid(alpha=0.3, which="both" if self.logy else "major")


@dataclass
class EffectPlot:
    """Paired differences with their intervals, one row per ``rows`` key (label, value), one
    marker per ``series`` key; the band ±:data:`TIE` is shaded."""

    rows: Sequence[tuple]
    row_labels: Sequence[str]
    row_of: Callable[[Mapping], tuple]
    series: Sequence[tuple]
    series_of: Callable[[Mapping], tuple]
    label: Callable[[tuple], str]
    hollow: Callable[[tuple], bool]
    xlabel: str
    title: str
    figsize: tuple[float, float] = (9.0, 4.8)

    def draw(self, fig: Any, result: "ProtocolResult") -> None:
        idx = {(self.row_of(e), self.series_of(e)): e for e in result.effects.to_dict("records")}
        ax = fig.add_subplot(111)
        h = 0.8 / max(1, len(self.series))
        for j, s in enumerate(self.series):
            es = [(i, idx[(r, s)]) for i, r in enumerate(self.rows)
                  if (r, s) in idx and not _missing(idx[(r, s)]["diff"])]
            c = color(str(s[0]))
            ax.errorbar([e["diff"] for _, e in es], [i + (j - (len(self.series) - 1) / 2) * h for i, _ in es],
                        xerr=[[e["diff"] - e["ci_low"] for _, e in es], [e["ci_high"] - e["diff"] for _, e in es]],
                        fmt="s" if self.hollow(s) else "o", ms=3.5, capsize=2, color=c,
                        mfc="white" if self.hollow(s) else c, label=self.label(s))
        ax.axvline(0, color="k", lw=0.8)
        ax.axvspan(-TIE, TIE, color="0.85", zorder=0)
        ax.set_yticks(range(len(self.row_labels)))
        ax.set_yticklabels(self.row_labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel(self.xlabel)
        ax.set_title(self.title)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.grid(alpha=0.3, axis="x")


# -------------------------------------------------------------------------- output
@dataclass
class Report:
    """The Markdown and the plot of one protocol run.

    ``facts`` are listed under the claim; ``sections`` are ``(heading, Markdown)``
    pairs (a None heading continues the previous section).
    """

    title: str
    claim: str
    facts: Mapping[str, Any]
    sections: Sequence[tuple[str | None, str]]
    plot: LinePlot | EffectPlot | None = None

    def markdown(self, data_line: str | None) -> str:
        lines = [f"# {self.title}", "", f"**Claim tested.** {self.claim}", ""]
        if data_line is not None:
            lines.append(f"- data: {data_line}")
        lines += [f"- {k}: {v}" for k, v in self.facts.items()] + [""]
        for heading, body in self.sections:
            lines += ([] if heading is None else [f"## {heading}", ""]) + ([body, ""] if body else [""])
        return "\n".join(lines).rstrip() + "\n"


@dataclass
class ProtocolResult:
    """What a protocol measured, as tidy DataFrames, and the files it wrote.

    Attributes
    ----------
    protocol : str
        The protocol's name.
    observations : pandas.DataFrame
        One row per query, condition and draw: the condition columns, ``draw``,
        ``query`` (the item's row) and ``ap`` (runtime: one row per model and N).
    rows : pandas.DataFrame
        Mean AP per condition and draw, column ``auprc`` (``<protocol>.csv``).
    summary : pandas.DataFrame
        Per condition: ``auprc``, ``ci_low``, ``ci_high`` (95 %), ``n_draws``,
        ``n_queries`` (``<protocol>_summary.csv``, ``<protocol>.md``).
    effects : pandas.DataFrame
        The paired differences that test the claim: ``diff``, ``ci_low``, ``ci_high``,
        ``verdict`` (``<protocol>_effects.csv``).
    config : dict
        Parameters, sizes, timings, verdicts (``<protocol>.json``).
    paths : dict of str to pathlib.Path
        The files written (empty without ``out_dir``).
    seconds : float
        Wall time.
    """

    protocol: str
    observations: pd.DataFrame
    rows: pd.DataFrame
    summary: pd.DataFrame
    effects: pd.DataFrame
    config: dict
    paths: dict = field(default_factory=dict)
    seconds: float = 0.0


def write_csv(path: Path, frame: pd.DataFrame) -> Path:
    """Write ``frame`` as CSV (floats with 6 decimals, missing values empty, text cells that a
    spreadsheet would run as formulas neutralised by :func:`~anchordiv._cli_values.csv_cell`);
    returns the path."""
    from .._cli_values import csv_cell

    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow([csv_cell(c) for c in frame.columns])
        cols = [frame[c].tolist() for c in frame.columns]
        for row in zip(*cols):
            w.writerow([csv_cell(_fmt(v, 6)) for v in row])
    return path


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def name_metric(fig: Any, metric: str) -> None:
    """Axis labels and titles of ``fig`` that say AUPRC say ``metric`` instead."""
    for ax in fig.axes:
        ax.set_xlabel(ax.get_xlabel().replace("AUPRC", metric))
        ax.set_ylabel(ax.get_ylabel().replace("AUPRC", metric))
        ax.set_title(ax.get_title().replace("AUPRC", metric))


def write_outputs(result: ProtocolResult, report: Report, out_dir: str | os.PathLike | None,
                  data_line: str | None = None) -> ProtocolResult:
    """Write ``<protocol>.csv``, ``_summary.csv``, ``_effects.csv``, ``.md``, ``.png`` and ``.json``.

    Nothing is written when ``out_dir`` is None; otherwise the folder is created and
    ``result.paths`` filled in. ``data_line`` describes the collection in the Markdown.
    """
    if out_dir is None:
        return result
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = result.protocol
    metric = result.config.get("metric", "auprc")
    named = {"auprc": metric}  # the value column is named after the metric
    paths = {"csv": write_csv(out / f"{name}.csv", result.rows.rename(columns=named)),
             "summary_csv": write_csv(out / f"{name}_summary.csv", result.summary.rename(columns=named)),
             "effects_csv": write_csv(out / f"{name}_effects.csv", result.effects)}
    paths["md"] = out / f"{name}.md"
    md = report.markdown(data_line)
    paths["md"].write_text(md if metric == "auprc" else md.replace("AUPRC", metric), encoding="utf-8")
    if report.plot is not None:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=report.plot.figsize, dpi=110)
        try:
            report.plot.draw(fig, result)
            if metric != "auprc":
                name_metric(fig, metric)
            fig.tight_layout()
            fig.savefig(out / f"{name}.png")
        finally:
            plt.close(fig)
        paths["png"] = out / f"{name}.png"
    paths["json"] = out / f"{name}.json"
    paths["json"].write_text(json.dumps(_jsonable(result.config), indent=2) + "\n", encoding="utf-8")
    result.paths = paths
    return result
