"""The one skeleton of every protocol: validate → sweep → summarize → effects → report.

A protocol is a subclass of :class:`Protocol` that states its sweep (the geometries it
fits and scores under each condition), the columns of its frames, the comparisons that
test its claim, its verdicts and its report sections; :meth:`Protocol.run` does the rest
in the same way for every protocol and returns the
:class:`~anchordiv.experiments.report.ProtocolResult`. The public function of a protocol
(:func:`runs`) holds its signature and documentation and hands its arguments to the class.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Mapping, Sequence

from ..._util import positive_int
from ...anchors import AnchorSet
from ...models import registry
from ..core import EvalData, Timer, check_seed, draw_seed, fit_score, honours_progress, progress_bar, run_config
from ..report import (Observations, ProtocolResult, Report, broadcast, ci_text, groups, paired_effects, per_draw,
                      pivot_table, summarize, tidy, write_outputs)

if TYPE_CHECKING:
    import pandas as pd

#: Columns of every summary after the condition columns.
STATS = ["auprc", "ci_low", "ci_high", "n_draws", "n_queries"]
#: Columns of every effects table after the labels of the comparison.
EFFECT = ["diff", "ci_low", "ci_high", "verdict"]
#: The Markdown column of a paired difference with its interval.
DIFF = ("difference [95 %]", lambda e: ci_text(e, signed=True))


def needs_anchors(name: str) -> bool:
    """Whether geometry ``name`` is fitted on anchors (its :class:`~anchordiv.models.Tags`)."""
    return registry()[name].tags().needs_anchors


def anchor_free(names: Sequence[str]) -> list[str]:
    """The geometries of ``names`` that need no anchors (``cosine``): scored once, not per draw."""
    return [n for n in names if not needs_anchors(n)]


def fitted_on_anchors(names: Sequence[str]) -> list[str]:
    """The geometries of ``names`` fitted on the anchors of each draw."""
    return [n for n in names if needs_anchors(n)]


def anchor_budgets(budgets: Sequence[int] | None, n: int, what: str) -> list[int]:
    """Sorted budgets (default 2, 4, 8, ... below ``n``, and ``n``), each at most ``n``."""
    default = [b for b in (2 ** e for e in range(1, 20)) if b < n] + [n]
    out = sorted({int(positive_int(b, "budget")) for b in (budgets or default)})
    if out[-1] > n:
        raise ValueError(f"budget {out[-1]} exceeds the {n} {what}; use budgets <= {n}.")
    return out


def budget_draws(anchors: AnchorSet, budgets: Sequence[int], n_draws: int,
                 seed: int) -> Iterator[tuple[int, int, AnchorSet]]:
    """``(budget, draw, subset)``: ``n_draws`` random subsets of each budget, drawn without
    replacement; the full budget holds the whole set, so it is drawn once."""
    n = len(anchors)
    for b in budgets:
        for r in range(1 if b == n else n_draws):
            yield b, r, anchors if b == n else anchors.subsample(b, seed=draw_seed(seed, b, r))


def n_budget_draws(budgets: Sequence[int], n: int, n_draws: int) -> int:
    """How many subsets :func:`budget_draws` yields for a set of ``n`` anchors."""
    return sum(1 if b == n else n_draws for b in budgets)


def budget_table(summary: Sequence[Mapping], budgets: Sequence[int], shown: Sequence[str],
                 column: str) -> tuple[str, str]:
    """The section of mean AUPRCs with one row per budget and one column per ``shown`` value of ``column``."""
    return ("Mean AUPRC [95 % interval] (best per budget in bold)", pivot_table(
        summary, [(b, [b]) for b in budgets], [(m, m) for m in shown], lambda s: s["budget"], lambda s: s[column],
        ci_text, ["budget"], best="auprc"))


def fit_models(obs: Observations, bar: Any, names: Sequence[str], anchors: AnchorSet | None, data: EvalData,
               on: str, tau: float | None, params: Mapping | None, seed: int, /, **condition: Any) -> None:
    """Fit and score each geometry of ``names`` on ``anchors`` by factor ``on``; one observation
    block per geometry that could be fitted, with ``model`` and ``condition``."""
    for m in names:
        res = fit_score(m, anchors, data, [on], tau, params, seed)
        bar.update()
        if res is not None:
            obs.add(res[on], data.queries, model=m, **condition)


class Protocol:
    """One run of a protocol; the constructor takes the public function's arguments as attributes.

    A subclass states ``protocol``, ``title`` and ``claim`` (the Markdown's heading and the claim
    tested), the frames' columns (``keys``: the condition columns of an observation,
    ``draw`` included; ``by``: the groups of the summary; ``effect_columns``), and the hooks
    :meth:`validate`, :meth:`steps`, :meth:`sweep`, :meth:`comparisons`, :meth:`judge`,
    :meth:`parameters`, :meth:`facts`, :meth:`sections` and :meth:`plot`. ``over`` names a
    swept condition column whose empty rows (geometries independent of it) are shown at
    every value of ``self.levels`` (:func:`~anchordiv.experiments.report.broadcast`).
    """

    protocol: ClassVar[str]
    title: ClassVar[str]
    claim: ClassVar[str]
    keys: ClassVar[Sequence[str]] = ()
    #: The conditions of ``<protocol>.csv`` (default ``keys``) and its column order (default those, then auprc).
    row_keys: ClassVar[Sequence[str] | None] = None
    row_columns: ClassVar[Sequence[str] | None] = None
    by: ClassVar[Sequence[str]] = ()
    over: ClassVar[str | None] = None
    effect_columns: ClassVar[Sequence[str]] = ()
    data: EvalData | None = None

    def __init__(self, **arguments: Any) -> None:
        self.timer = Timer()
        shadowed = sorted(k for k in arguments if k != "data" and hasattr(type(self), k))
        if shadowed:
            raise TypeError(f"{type(self).__name__}: the arguments {shadowed} would hide its attributes; rename them.")
        self.__dict__.update(arguments)
        if "seed" in arguments:
            self.seed = check_seed(self.seed)
        if "n_draws" in arguments:
            self.n_draws = positive_int(self.n_draws, "n_draws")
        self.validate()

    # ------------------------------------------------------------------ the steps a protocol states
    def validate(self) -> None:
        """Check and normalise the arguments (seed and n_draws are checked before)."""

    def steps(self) -> int:
        """Fits of the sweep, the length of its progress bar."""
        raise NotImplementedError

    def sweep(self, bar: Any) -> Any:
        """Fit and score every condition; the :class:`Observations` (one ``bar`` step per fit)."""
        raise NotImplementedError

    def scored(self, observations: pd.DataFrame) -> pd.DataFrame:
        """The observations that the rows, the summary and the effects read (default all)."""
        return observations

    def comparisons(self) -> list[tuple[dict, tuple, tuple]]:
        """``(labels, group a, group b)`` of each paired effect a − b
        (:func:`~anchordiv.experiments.report.paired_effects`)."""
        return []

    def judge(self) -> list[str]:
        """The verdicts on the claim, one sentence each."""
        return []

    def parameters(self) -> dict:
        """The run's parameters recorded in ``<protocol>.json``."""
        return {}

    def facts(self) -> dict:
        """The facts listed under the claim in the Markdown (the runtime is added after them)."""
        return {}

    def sections(self) -> list[tuple[str | None, str]]:
        """The Markdown sections, ``(heading, body)``."""
        return []

    def plot(self) -> Any:
        """The :class:`~anchordiv.experiments.report.LinePlot` or ``EffectPlot`` (None: no figure)."""
        return None

    # ------------------------------------------------------------------ the skeleton
    def summarize(self, observations: Observations) -> None:
        """The observation frame, the mean per condition and draw (``rows``), the per-group
        (draws, queries) matrices and the summary with 95 % bootstrap intervals."""
        self.observations = observations.frame(self.keys)
        scored = self.scored(self.observations)
        row_keys = self.row_keys or self.keys
        self.rows = per_draw(scored, row_keys, self.row_columns or [*row_keys, "auprc"])
        self.mats = groups(scored if self.over is None else broadcast(scored, self.over, self.levels), self.by)
        self.summary = summarize(self.mats, self.by, self.n_boot, self.seed)

    def measure(self) -> list[dict]:
        """The paired effects of :meth:`comparisons`."""
        return paired_effects(self.mats, self.comparisons(), self.n_boot, self.seed)

    def summary_columns(self) -> list[str]:
        return [*self.by, *STATS]

    def run(self) -> ProtocolResult:
        """Sweep, summarize, measure the effects, judge, and write the files to ``out_dir``."""
        bar = progress_bar(self.steps(), self.protocol, self.progress)
        measured = self.sweep(bar)
        bar.close()
        self.summarize(measured)
        self.effects = self.measure()
        self.verdicts = self.judge()
        self.seconds = self.timer()
        config = run_config(self.protocol, self.data, self.seconds, self.verdicts, **self.parameters())
        report = Report(self.title, self.claim, {**self.facts(), "runtime": f"{self.seconds:.1f} s"},
                        self.sections(), self.plot())
        res = ProtocolResult(self.protocol, self.observations, self.rows, tidy(self.summary, self.summary_columns()),
                             tidy(self.effects, self.effect_columns), config, seconds=self.seconds)
        res = write_outputs(res, report, self.out_dir, None if self.data is None else self.data.describe())
        metric = config.get("metric", "auprc")
        if metric != "auprc":
            res.rows, res.summary = (f.rename(columns={"auprc": metric}) for f in (res.rows, res.summary))
        return res


def runs(protocol: type[Protocol]) -> Callable[[Callable], Callable]:
    """Make a documented signature the public function of ``protocol``: a call binds its
    arguments (defaults applied), runs ``protocol(**arguments)`` and returns the result;
    ``progress`` and ``metric=`` are honoured throughout (:func:`~anchordiv.experiments.core.honours_progress`)."""
    def decorate(signature: Callable) -> Callable:
        bind = inspect.signature(signature).bind

        @functools.wraps(signature)
        def call(*args: Any, **kwargs: Any) -> ProtocolResult:
            try:
                bound = bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{signature.__name__}() {exc}") from None
            bound.apply_defaults()
            return protocol(**bound.arguments).run()

        return honours_progress(call)

    return decorate
