"""``anchordiv eval PROTOCOL``: the experiment protocols on the command line.

:func:`eval_command` builds the click group, one subcommand per protocol of
:mod:`anchordiv.experiments.protocols`, each with only its own options; the main CLI
registers it with ``cli.add_command(eval_command())``. It also runs on its own as
``python -m anchordiv.experiments PROTOCOL ...``.

The model options mean what they mean in ``anchordiv index build``: ``--components M``
is the number of GMM components (the ``components`` protocol sweeps a list
``M,M,...``), ``--rank`` the latent rank, and ``--param KEY=VALUE`` any further
parameter, given to every model of the run whose constructor takes ``KEY``
(``--param MODEL.KEY=VALUE`` gives it to that model only).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import click

from .._cli_values import WRITTEN, tau_option, written_anchor_options
from ..models import default_tau, model_names
from . import protocols as P

#: Stands for the --anchor/--anchor-file set among the --anchors specs.
WRITTEN_SPEC = object()

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class _List(click.ParamType):
    """A comma-separated list of ints or floats."""

    def __init__(self, cast: type):
        self.cast, self.name = cast, f"{cast.__name__},..."

    def convert(self, value: Any, param: Any, ctx: Any) -> list:
        if isinstance(value, list):
            return value
        try:
            out = [self.cast(t) for t in str(value).split(",") if t.strip()]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of {self.cast.__name__}s", param, ctx)
        return out or self.fail("give at least one value", param, ctx)


def _default(protocol: Callable, name: str) -> list[str]:
    """The protocol's default for argument ``name`` (a list of model names)."""
    return list(inspect.signature(protocol).parameters[name].default)


def _model_params(models: Sequence[str], components: int | None, rank: str | None,
                  params: Sequence[str]) -> dict[str, dict]:
    """``{model: {param: value}}`` from ``--components``, ``--rank`` and ``--param`` for the fitted
    ``models``, checked against each model's declared parameters."""
    from .._cli_values import model_param_values

    return model_param_values(models, {"--components": components, "--rank": rank}, params, run=True)


class _Inputs:
    """The collection, its anchors and the shared options of one ``eval`` command."""

    def __init__(self, opts: dict):
        from ..io import load_collection
        from .core import EvalData

        _threads(opts["threads"])
        opts["progress"] = _progress(opts["progress"])
        self.opts = opts
        self.collection = load_collection(opts["collection"])
        multilabel = sorted(set(opts["factors"])) if opts.get("multilabel") else ()
        try:
            self.data = EvalData.from_collection(self.collection, factors=sorted(set(opts["factors"])),
                                                 split_column=opts["split_column"], name=Path(opts["collection"]).name,
                                                 multilabel=multilabel, sep=opts.get("label_sep") or "|")
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        if opts["max_queries"] is not None:
            self.data = self.data.subsample_queries(opts["max_queries"], seed=opts["seed"])
        self.encoder_spec = opts["encoder"] or getattr(self.collection, "encoder", None)
        self._encoder = None

    def encoder(self) -> Any:
        """The encoder of text anchors, loaded on first use."""
        if self.encoder_spec is None:
            raise click.UsageError("text anchors need an encoder: pass --encoder SPEC (the collection records none)")
        if self._encoder is None:
            from ..encoders import load

            self._encoder = load(self.encoder_spec, device=self.opts["device"])
        return self._encoder

    def written(self) -> tuple[str, Any] | None:
        """(display name, AnchorSet) of the ``--anchor`` texts and ``--anchor-file`` lines, or None."""
        from .._cli_values import written_anchors

        texts, file = self.opts.get("anchor_texts") or (), self.opts.get("anchor_file")
        found = written_anchors(texts, file, self.encoder() if texts or file else None)
        return None if found is None else (WRITTEN, found[1])

    def anchors(self, spec: str) -> tuple[str, Any]:
        """(display name, AnchorSet) of a ``.npy`` array of embeddings or an anchors-file spec."""
        from ..anchors import AnchorSet
        from ..anchorsfile import parse_anchor_spec, resolve_anchor_spec

        if spec is WRITTEN_SPEC:
            return self.written()
        if spec.endswith(".npy") and os.path.isfile(spec):
            import numpy as np

            return Path(spec).stem, AnchorSet(np.load(spec))
        path, selection = parse_anchor_spec(spec)
        name = path.stem if not selection else ",".join(n if p is None else f"{n}:{p:g}" for n, p in selection)
        return name, resolve_anchor_spec(spec, self.encoder(), arg="--anchors").anchors

    def label_entries(self) -> list[tuple[str, Any, str]]:
        """``[(set name, AnchorSet, factor)]`` for ``--multilabel``: every set of every ``--anchors``
        (or the sets it selects), each for the label of the one ``--factor`` that matches its name
        or that ``FILE:SET=LABEL`` names."""
        from ..anchors import AnchorSet
        from ..anchorsfile import embed_anchors, parse_anchor_spec

        from .core import match_labels

        (factor,) = self.opts["factors"]
        if self.opts.get("anchor_texts") or self.opts.get("anchor_file"):
            raise click.UsageError("--anchor/--anchor-file write one set; --multilabel needs a set per label: write them "
                                   "in an anchors file (one set per label) and pass it with --anchors")
        known = self.data.label_names(factor)
        out = []
        for spec in self.opts["anchor_specs"]:
            if spec.endswith(".npy") and os.path.isfile(spec):
                import numpy as np

                out.append((Path(spec).stem, AnchorSet(np.load(spec)), f"{factor}={Path(spec).stem}", spec))
                continue
            labels: dict[str, str] = {}
            try:
                path, selection = parse_anchor_spec(spec, arg="--anchors", labels=labels)
            except (ValueError, FileNotFoundError) as exc:
                raise click.BadParameter(str(exc), param_hint="--anchors") from None
            emb = embed_anchors(path, self.encoder())
            names = [n for n, _ in selection] if selection else list(emb.sets)
            if not selection:  # a whole file: the sets that match a label
                unmatched = [n for n in names if n not in match_labels(names, known, arg="--anchors")]
                if unmatched:
                    click.echo(f"{path}: set(s) matching no label of {factor} (skipped; map one with "
                               f"FILE:SET=LABEL): {', '.join(unmatched)}")
                names = [n for n in names if n not in unmatched]
            for name in names:
                out.append((name, emb.anchor_set([(name, None)], arg="--anchors"),
                            f"{factor}={labels.get(name, name)}", path.stem))
        names = [n for n, *_ in out]
        # a set name given by several files: one row per file, named "SET · FILE"
        return [(f"{n} · {stem}" if names.count(n) > 1 else n, A, f) for n, A, f, stem in out]

    def sets(self, low: int, high: int | None) -> list[tuple[str, Any, str]]:
        """``[(name, AnchorSet, factor)]`` of ``--anchors`` and ``--factor``, which pair up in order; the
        anchors written with ``--anchor``/``--anchor-file`` come last, as one more set."""
        specs, factors = list(self.opts["anchor_specs"]), self.opts["factors"]
        if self.opts.get("anchor_texts") or self.opts.get("anchor_file"):
            specs.append(WRITTEN_SPEC)
        n = len(specs)
        if n < low or (high is not None and n > high):
            want = f"exactly {low}" if low == high else f"at least {low}"
            raise click.UsageError(f"{click.get_current_context().info_name} takes {want} --anchors, got {n}.")
        if len(factors) != n:
            raise click.UsageError(f"give one --factor per --anchors ({n}), got {len(factors)}.")
        return [(*self.anchors(s), f) for s, f in zip(specs, factors)]

    def run(self, protocol: Callable, *args: Any, **kwargs: Any) -> None:
        """Run ``protocol`` on the collection; ``kwargs`` that are None keep the protocol's defaults.

        The temperature and the model options apply to the geometries the run fits: the
        given or default ``models``, ``baselines`` and ``references`` (and gmm for ``components``).
        """
        o, sig = self.opts, inspect.signature(protocol).parameters
        swept = [P.COMPONENTS_MODEL] * (protocol is P.components)
        fitted = swept + [m for key in ("models", "baselines", "references") if key in sig
                          for m in kwargs.get(key) or sig[key].default]
        components = o.get("components")
        if o.get("gmm_components") is not None:
            if components not in (None, o["gmm_components"]):
                raise click.UsageError("give --components only (--gmm-components is its deprecated alias)")
            components = o["gmm_components"]
        given = o["tau"] or [None]
        try:
            taus = [default_tau(fitted, t, self.data.tau, lambda: self.encoder().tau if self.encoder_spec else None)
                    for t in given]
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        kwargs["model_params"] = _model_params(fitted, components, o["rank"], o["params"]) or None
        run = protocol if len(taus) == 1 else functools.partial(P.sweep_tau, protocol)
        _echo(run(self.data, *args, tau=taus[0] if len(taus) == 1 else taus, seed=o["seed"], n_boot=o["n_boot"],
                  out_dir=o["out_dir"], progress=o["progress"], metric=o["metric"],
                  **{k: v for k, v in kwargs.items() if v is not None}))


def _progress(progress: bool | None) -> bool | str:
    """``--progress/--no-progress``: a bar on a terminal, else a line per step (``"log"``).

    Until the command ends, every other bar is silenced unless bars were asked for, the
    bar that transformers shows while a model loads included.
    """
    from .._progress import LOG, progress_scope

    mode = progress if progress is not None else (True if sys.stderr.isatty() else LOG)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.with_resource(progress_scope(mode))
    return mode


def _threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def _echo(res: Any) -> None:
    for setting in sorted(set(res.config.get("settings", {}).values())):
        click.echo(f"setting: {setting}")
    if res.config.get("metric", "auprc") != "auprc":
        click.echo(f"metric: {res.config['metric']} (in place of AUPRC)")
    for v in res.config.get("verdicts", []):
        click.echo(v)
    click.echo(f"{res.protocol}: {res.seconds:.1f} s; wrote " + ", ".join(str(p) for p in res.paths.values()))


# ------------------------------------------------------------------------ options
def _options(*options: Callable) -> Callable:
    """One decorator applying click ``options`` in the order given."""
    def decorate(f: Callable) -> Callable:
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _warn_alias(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is not None:
        warnings.warn("--gmm-components is deprecated; use --components (the number of gmm components)",
                      FutureWarning)
    return value


_RUN = _options(
    click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder."),
    click.option("--progress/--no-progress", default=None,
                 help="Progress bar; --no-progress silences every bar (default: a bar on a terminal, else a line "
                      "per step)."),
    click.option("--threads", type=click.IntRange(min=1), default=None,
                 help="Torch threads (1 avoids slow small LAPACK calls on a busy machine)."))


def _metric(ctx: click.Context, param: click.Parameter, value: str) -> str:
    from ..metrics import get_metric

    try:
        get_metric(value.strip().lower())
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return value.strip().lower()


def _common(sweep_components: bool = False) -> Callable:
    """The model options, the data options and :data:`_RUN`."""
    components = [click.option("--components", "n_components", type=_List(int),
                               help="Numbers of gmm components to sweep (default 1,2,4,8).")] if sweep_components else [
        click.option("--components", type=click.IntRange(min=1), metavar="M",
                     help="Number of gmm components (default 4)."),
        click.option("--gmm-components", type=click.IntRange(min=1), hidden=True, callback=_warn_alias)]
    return _options(
        *components,
        click.option("--rank", metavar="K|FRACTION",
                     help="Latent models: subspace dimension k, or a variance fraction in (0, 1]."),
        click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
                     help="Further model parameter for every model of the run that takes KEY, or "
                          "MODEL.KEY=VALUE for one model, e.g. reg_covar=1e-4 (repeatable)."),
        click.option("--tau", type=_List(float), callback=tau_option,
                     help="Temperature (default: the collection's, else the encoder's); a list τ,τ,... sweeps "
                          "it in one run (column tau)."),
        click.option("--metric", callback=_metric, metavar="NAME", default="auprc", show_default=True,
                     help="Per-query score: auprc, r_precision, map@r, mrr, recall@K, precision@K, ndcg@K, "
                          "ndcg_exp@K, mrr@K (anchordiv.metrics.get_metric)."),
        click.option("--encoder", metavar="SPEC", help="Encoder of text anchors (default: the collection's)."),
        click.option("--device", help="Torch device of the encoder."),
        click.option("--split-column", metavar="COLUMN",
                     help="Column with 'query'/'key'/'both' per row (default: every row is both; self excluded)."),
        click.option("--max-queries", type=click.IntRange(min=1), help="Subsample the queries (seeded)."),
        click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of every draw."),
        click.option("--n-boot", type=click.IntRange(min=1), default=1000, show_default=True,
                     help="Bootstrap replicates of the intervals."),
        _RUN)


def _command(name: str, short_help: str, example: str, anchors: str | None) -> Callable:
    """A protocol's click command with its one-line help, an example, COLLECTION and ``--anchors``/``--factor``."""
    command = click.command(name, context_settings=_CONTEXT, short_help=short_help, epilog="\b\nExample:\n  " + example)
    if anchors is None:
        return command
    return _options(command, click.argument("collection", type=click.Path(exists=True)),
                    click.option("--anchors", "anchor_specs", multiple=True, metavar="SPEC",
                                 help=f"Anchors: PATH[:NAME[:P],...] of an anchors file, or a .npy of embeddings; "
                                      f"{anchors}."),
                    click.option("--factor", "factors", multiple=True, metavar="COLUMN",
                                 help="Label column described by each --anchors, in the same order (the "
                                      "--anchor/--anchor-file set last)."),
                    written_anchor_options)


def _geometries(option: str, allowed: Sequence[str] | dict, protocol: Callable, arg: str) -> Callable:
    """``--model`` or ``--baseline``: repeatable, comma-separated names from ``allowed`` (None when not
    given). ``allowed`` is a list of names, or the :class:`~anchordiv.models.Tags` of the registered
    geometries that apply (read when the command runs, so installed plug-ins count)."""
    def choices() -> tuple[str, ...]:
        return model_names(**allowed) if isinstance(allowed, dict) else tuple(allowed)

    def names(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> list[str] | None:
        out = [m.strip() for v in values for m in v.split(",") if m.strip()]
        for m in out:
            if m not in choices():
                what = f"unknown model {m!r}" if m not in model_names() else f"{m!r} does not apply here"
                raise click.BadParameter(f"{what}; choose from {', '.join(choices())}", ctx, param)
        return out or None

    what = "Geometries" if option == "--model" else "Reference geometries"
    shown = model_names(builtin=True, **allowed) if isinstance(allowed, dict) else allowed
    more = " and installed plug-ins" if isinstance(allowed, dict) else ""
    return click.option(option, arg, multiple=True, metavar="NAME[,NAME...]", callback=names,
                        help=f"{what}: {', '.join(shown)}{more} "
                             f"(default: {', '.join(_default(protocol, arg)) or 'none'}).")


def _draws(what: str) -> Callable:
    return click.option("--draws", "n_draws", type=click.IntRange(min=1), help=f"Random draws: {what}.")


def _fraction(default: float) -> Callable:
    return click.option("--anchor-fraction", type=click.FloatRange(0, 1, min_open=True),
                        help=f"Fraction of each anchor set kept per draw (default {default:g}).")


_BUDGETS = click.option("--budgets", type=_List(int), help="Anchor budgets (default 2, 4, 8, ... and the set size).")


# ------------------------------------------------------------------------ commands
@_command("coordinate", "Anchor mixture p·A + (1 − p)·B against AUPRC on factors A and B (Figure 3).",
          "anchordiv eval coordinate coll/ --anchors anchors.yaml:breeds --anchors anchors.yaml:places \\\n"
          "      --factor breed --factor place --model softmax,gaussian --out results/coordinate", "two, A then B")
@_geometries("--model", {}, P.coordinate, "models")
@_geometries("--baseline", ("cosine",), P.coordinate, "baselines")
@click.option("--proportions", type=_List(float), help="Mixture proportions p in [0, 1] (default 0, 0.1, ..., 1).")
@_draws("realisations of the two anchor sets (default 5)")
@_fraction(0.8)
@_common()
def coordinate(models, baselines, proportions, n_draws, anchor_fraction, **o):
    """AUPRC on factors A and B as the anchor mixture moves from B (p = 0) to A (p = 1); paper Figure 3."""
    inp = _Inputs(o)
    (na, A, fa), (nb, B, fb) = inp.sets(2, 2)
    inp.run(P.coordinate, A, B, fa, fb, names=(na, nb), models=models, baselines=baselines, proportions=proportions,
            n_draws=n_draws, anchor_fraction=anchor_fraction)


@_command("budget", "AUPRC against the number of anchors (Figures 4, 6).",
          "anchordiv eval budget coll/ --anchors anchors.yaml:breeds --factor breed --budgets 2,4,8,18 \\\n"
          "      --out results/budget", "one")
@_geometries("--model", {"anchor_model": True}, P.budget, "models")
@_geometries("--baseline", {"anchor_model": False}, P.budget, "baselines")
@_BUDGETS
@_draws("random subsets per budget (default 5)")
@_common()
def budget(models, baselines, budgets, n_draws, **o):
    """AUPRC against the number of anchors for every model and baseline; paper Figures 4 and 6."""
    inp = _Inputs(o)
    ((name, S, f),) = inp.sets(1, 1)
    inp.run(P.budget, S, f, name=name, models=models, baselines=baselines, budgets=budgets, n_draws=n_draws)


@_command("adaptation", "Posterior from broad anchors against target-only models (Figure 5).",
          "anchordiv eval adaptation coll/ --broad anchors.yaml:lemmas --anchors anchors.yaml:breeds \\\n"
          "      --factor breed --model gaussian,gmm,latent_spherical --rank 16 --out results/adaptation",
          "one, the target anchors")
@click.option("--broad", "broad_spec", required=True, metavar="SPEC", help="Broad anchors (the prior), as --anchors.")
@_geometries("--model", {"accepts_prior": True}, P.adaptation, "models")
@_geometries("--baseline", ("softmax", "iti", "cosine"), P.adaptation, "references")
@_BUDGETS
@_draws("random target subsets per budget (default 5)")
@_common()
def adaptation(broad_spec, models, references, budgets, n_draws, **o):
    """Posterior (broad → target) against target-only models over target budgets; paper Figure 5."""
    inp = _Inputs(o)
    ((name, T, f),) = inp.sets(1, 1)
    broad_name, Bd = inp.anchors(broad_spec)
    inp.run(P.adaptation, Bd, T, f, names=(broad_name, name), models=models, references=references, budgets=budgets,
            n_draws=n_draws)


@_command("components", "AUPRC against the number of gmm components (Figure 7).",
          "anchordiv eval components coll/ --anchors anchors.yaml:breeds --factor breed \\\n"
          "      --anchors anchors.yaml:places --factor place --components 1,2,4,8 --out results/components",
          "one or more, each with its --factor")
@_geometries("--baseline", tuple(m for m in model_names(builtin=True) if m != P.COMPONENTS_MODEL), P.components,
             "references")
@_draws("gmm initialisations per M (default 3)")
@_common(sweep_components=True)
def components(references, n_components, n_draws, **o):
    """AUPRC of a gmm against its number of components M, per anchor set; paper Figure 7."""
    inp = _Inputs(o)
    inp.run(P.components, inp.sets(1, None), references=references, n_components=n_components, n_draws=n_draws)


@_command("table", "Per-label AUPRC differences against cosine and ITI (Tables 2, 3).",
          "anchordiv eval table coll/ --anchors findings.yaml --factor findings --multilabel \\\n"
          "      --tau 0.01,0.05 --out results/table",
          "one per label of the table, each with its --factor (with --multilabel: any number of files, "
          "FILE:SET=LABEL maps a set to a label)")
@_geometries("--model", {"anchor_model": True}, P.table, "models")
@_geometries("--baseline", {"anchor_model": False}, P.table, "baselines")
@click.option("--multilabel", is_flag=True,
              help="The one --factor holds several labels per item; each anchor set is a row for the label "
                   "matching its name (ignoring case, spaces, underscores) or named by FILE:SET=LABEL.")
@click.option("--label-sep", default="|", show_default=True, metavar="SEP",
              help="Separator of the labels in a --multilabel text cell (parquet lists need none).")
@click.option("--per-value", is_flag=True, help="One row per value of each factor.")
@click.option("--values", metavar="V,...", help="Only these values of each factor (e.g. 1), read as --param values.")
@click.option("--all-queries", is_flag=True,
              help="Every item a query, relevance 'same value' (default for 0/1 and multi-label factors: the "
                   "per-label setting, queries = the items carrying the label).")
@_draws("anchor draws per label (default 1)")
@_fraction(1.0)
@_common()
def table(models, baselines, multilabel, per_value, values, all_queries, n_draws, anchor_fraction, **o):
    """Per-label AUPRC differences against cosine and ITI; paper Tables 2 and 3.

    For a 0/1 or multi-label factor each row asks the paper's question: the queries are
    the items carrying the label, the relevant keys the other items carrying it. The
    command prints the setting it runs.
    """
    from .._cli_values import parse_params as _parse_params

    if sum([bool(per_value), bool(values), all_queries]) > 1:
        raise click.UsageError("give one of --per-value, --values and --all-queries")
    if multilabel and len(o["factors"]) != 1:
        raise click.UsageError(f"--multilabel takes exactly one --factor (the multi-label column), got "
                               f"{len(o['factors'])}")
    inp = _Inputs({**o, "multilabel": multilabel})
    setting = False if all_queries else (True if per_value else None)
    if values:
        setting = list(_parse_params([f"{i}={v}" for i, v in enumerate(values.split(",")) if v.strip()]).values())
    entries = inp.label_entries() if multilabel else inp.sets(1, None)
    if multilabel:
        labels = inp.data.label_names(o["factors"][0])
        missing = sorted(set(labels) - {inp.data.resolve_factor(f, n, "--anchors")[1].partition("=")[2]
                                        for n, _, f in entries})
        if missing:
            click.echo(f"labels without an anchor set (not in the table): {', '.join(missing)}")
    inp.run(P.table, entries, models=models, baselines=baselines, per_value=setting, n_draws=n_draws,
            anchor_fraction=anchor_fraction)


@_command("runtime", "Fit + search time against the number of anchors (Table 4).",
          "anchordiv eval runtime --n-anchors 256,1024,4096 --out results/runtime", None)
@_geometries("--model", {}, P.runtime, "models")
@click.option("--n-anchors", type=_List(int), default="256,1024,4096", show_default=True, help="Anchor counts N.")
@click.option("--queries", "n_queries", type=click.IntRange(min=1), default=200, show_default=True, help="Queries.")
@click.option("--gallery", "n_gallery", type=click.IntRange(min=10), default=2000, show_default=True,
              help="Gallery size.")
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="Timed calls.")
@_RUN
def runtime(models, threads, progress, **kwargs):
    """Fit + search time against the number of anchors on synthetic vectors; paper Table 4."""
    _threads(threads)
    _echo(P.runtime(models=models or _default(P.runtime, "models"), progress=_progress(progress), **kwargs))


def eval_command() -> click.Group:
    """The ``eval`` click group: ``anchordiv eval PROTOCOL [COLLECTION] ...``.

    One subcommand per protocol; register it with ``cli.add_command(eval_command())``.
    ``COLLECTION`` is anything :func:`anchordiv.io.load_collection` reads with label
    columns in its metadata (``runtime`` needs none). ``--anchors`` takes an anchors-file
    spec (``PATH[:NAME[:P],...]``, embedded with the collection's encoder or
    ``--encoder``) or a ``.npy`` array of anchor embeddings; ``--anchors`` and
    ``--factor`` pair up in order.
    """
    group = click.Group("eval", context_settings=_CONTEXT, help="""Rerun one of the paper's experiments.

    Each PROTOCOL writes PROTOCOL.csv, PROTOCOL_summary.csv, PROTOCOL_effects.csv,
    PROTOCOL.md, PROTOCOL.png and PROTOCOL.json to --out; 'eval PROTOCOL -h' lists
    its options.
    """)
    for command in (coordinate, budget, adaptation, components, table, runtime):
        group.add_command(command)
    return group


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``eval`` on its own: ``python -m anchordiv.experiments PROTOCOL ...``."""
    eval_command().main(args=list(argv) if argv is not None else None, prog_name="python -m anchordiv.experiments")
