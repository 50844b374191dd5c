"""``anchordiv eval PROTOCOL``: the experiment protocols on the command line.

:func:`eval_command` builds the click command; register it on the ``anchordiv`` group
with ``cli.add_command(eval_command())``. It also runs on its own as
``python -m anchordiv.experiments PROTOCOL ...``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from .protocols import PROTOCOLS

EXAMPLES = """\b
Examples:
  anchordiv eval coordinate coll/ --anchors anchors.yaml:breeds --anchors anchors.yaml:places \\
      --factor breed --factor place --model softmax,gaussian --out results/coordinate
  anchordiv eval budget coll/ --anchors anchors.yaml:breeds --factor breed --budgets 2,4,8,18 \\
      --out results/budget
  anchordiv eval adaptation coll/ --broad anchors.yaml --anchors anchors.yaml:breeds --factor breed \\
      --model gaussian,gmm,latent_spherical --rank 16 --out results/adaptation
  anchordiv eval components coll/ --anchors anchors.yaml:breeds --factor breed \\
      --anchors anchors.yaml:places --factor place --components 1,2,4,8 --out results/components
  anchordiv eval table coll/ --anchors anchors.yaml:breeds --factor breed --per-value --out results/table
  anchordiv eval runtime --n-anchors 256,1024,4096 --out results/runtime
"""


def _ints(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    import click

    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of integers", param_hint=option) from None
    if not out:
        raise click.BadParameter("give at least one value", param_hint=option)
    return out


def _floats(text: str | None, option: str) -> list[float] | None:
    if text is None:
        return None
    import click

    try:
        out = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a comma-separated list of numbers", param_hint=option) from None
    if not out:
        raise click.BadParameter("give at least one value", param_hint=option)
    return out


def _models(values: Sequence[str]) -> list[str] | None:
    out: list[str] = []
    for v in values:
        out += [m.strip() for m in v.split(",") if m.strip()]
    return out or None


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def _model_params(params: Sequence[str], gmm_components: int | None, rank: str | None) -> dict:
    import click

    out: dict[str, dict] = {}
    if gmm_components is not None:
        out.setdefault("gmm", {})["n_components"] = int(gmm_components)
    if rank is not None:
        r = _value(rank)
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise click.BadParameter(f"{rank!r} is not an int k or a variance fraction", param_hint="--rank")
        for m in ("latent_gaussian", "latent_spherical"):
            out.setdefault(m, {})["rank"] = r
    for p in params:
        key, sep, val = p.partition("=")
        model, dot, name = key.partition(".")
        if not sep or not dot or not model or not name:
            raise click.BadParameter(f"{p!r} is not MODEL.PARAM=VALUE (e.g. gmm.reg_covar=1e-4)", param_hint="--param")
        out.setdefault(model.strip(), {})[name.strip()] = _value(val.strip())
    return out


def _set_name(spec: str) -> str:
    """Display name of an anchors spec: the selection, else the file stem."""
    from ..anchorsfile import parse_anchor_spec

    if spec.endswith(".npy") and os.path.isfile(spec):
        return Path(spec).stem
    path, selection = parse_anchor_spec(spec)
    if not selection:
        return path.stem
    return ",".join(n if p is None else f"{n}:{p:g}" for n, p in selection)


class _Encoder:
    """Loads the encoder on first use."""

    def __init__(self, spec: str | None, device: str | None):
        self.spec, self.device, self._enc = spec, device, None

    def get(self) -> Any:
        import click

        if self.spec is None:
            raise click.UsageError("text anchors need an encoder: pass --encoder SPEC (the collection records none)")
        if self._enc is None:
            from ..encoders import load

            self._enc = load(self.spec, device=self.device)
        return self._enc


def _load_anchors(spec: str, encoder: _Encoder) -> Any:
    """An AnchorSet from a ``.npy`` array of embeddings or an anchors-file spec."""
    from ..anchors import AnchorSet

    if spec.endswith(".npy") and os.path.isfile(spec):
        import numpy as np

        return AnchorSet(np.load(spec))
    from ..anchorsfile import resolve_anchor_spec

    return resolve_anchor_spec(spec, encoder.get(), arg="--anchors").anchors


def eval_command() -> Any:
    """Build the ``eval`` click command (``anchordiv eval PROTOCOL [COLLECTION] ...``).

    Returns
    -------
    click.Command
        Register it with ``cli.add_command(eval_command())``.

    Notes
    -----
    ``COLLECTION`` is anything :func:`anchordiv.io.load_collection` reads with label
    columns in its metadata (``runtime`` needs none). ``--anchors`` takes an anchors-file
    spec (``PATH[:NAME[:P],...]``, embedded with the collection's encoder or
    ``--encoder``) or a ``.npy`` array of anchor embeddings; ``--anchors`` and
    ``--factor`` pair up in order. The protocols are those of
    :mod:`anchordiv.experiments.protocols`.
    """
    import click

    @click.command("eval", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
                   epilog=EXAMPLES)
    @click.argument("protocol", type=click.Choice(list(PROTOCOLS)))
    @click.argument("collection", required=False, type=click.Path(exists=True))
    @click.option("--anchors", "anchor_specs", multiple=True, metavar="SPEC",
                  help="Anchors: PATH[:NAME[:P],...] of an anchors file, or a .npy of embeddings. Repeatable; "
                       "coordinate takes two (A, B), budget/adaptation one (the target), components/table any.")
    @click.option("--factor", "factors", multiple=True, metavar="COLUMN",
                  help="Label column described by each --anchors, in the same order.")
    @click.option("--broad", "broad_spec", metavar="SPEC", help="Broad anchors (adaptation).")
    @click.option("--model", "models", multiple=True, metavar="NAME[,NAME...]",
                  help="Geometries (registry names); each protocol has a default.")
    @click.option("--baseline", "baselines", multiple=True, metavar="NAME[,NAME...]",
                  help="Reference geometries (cosine, iti; adaptation/components: also softmax).")
    @click.option("--budgets", metavar="N,N,...", help="Anchor budgets (budget, adaptation).")
    @click.option("--proportions", metavar="P,P,...", help="Mixture proportions p (coordinate).")
    @click.option("--components", "n_components", metavar="M,M,...", help="GMM components (components).")
    @click.option("--draws", type=click.IntRange(min=1), default=None, help="Random draws per condition.")
    @click.option("--anchor-fraction", type=click.FloatRange(0, 1, min_open=True), default=None,
                  help="Fraction of each anchor set kept per draw (coordinate, table).")
    @click.option("--per-value", is_flag=True, help="table: one row per value of each factor.")
    @click.option("--values", metavar="V,V,...", help="table: only these values of each factor (e.g. 1).")
    @click.option("--gmm-components", type=click.IntRange(min=1), default=None, help="GMM components of gmm.")
    @click.option("--rank", default=None, help="Latent rank: an int k or a variance fraction.")
    @click.option("--param", "params", multiple=True, metavar="MODEL.PARAM=VALUE",
                  help="Any model parameter, e.g. gmm.reg_covar=1e-4 (repeatable).")
    @click.option("--tau", type=float, default=None, help="Temperature (default: the collection's, else the encoder's).")
    @click.option("--encoder", default=None, metavar="SPEC", help="Encoder of text anchors (default: the collection's).")
    @click.option("--device", default=None, help="Torch device of the encoder.")
    @click.option("--split-column", default=None, metavar="COLUMN",
                  help="Column with 'query'/'key'/'both' per row (default: every row is both; self excluded).")
    @click.option("--max-queries", type=click.IntRange(min=1), default=None, help="Subsample the queries (seeded).")
    @click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True, help="Seed of every draw.")
    @click.option("--n-boot", type=click.IntRange(min=1), default=1000, show_default=True,
                  help="Bootstrap replicates of the intervals.")
    @click.option("--n-anchors", metavar="N,N,...", default="256,1024,4096", show_default=True,
                  help="runtime: anchor counts.")
    @click.option("--queries", "n_queries", type=click.IntRange(min=1), default=200, show_default=True,
                  help="runtime: queries.")
    @click.option("--gallery", "n_gallery", type=click.IntRange(min=10), default=2000, show_default=True,
                  help="runtime: gallery size.")
    @click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True, help="runtime: timed calls.")
    @click.option("--bench-dir", type=click.Path(file_okay=False), default=None,
                  help="runtime: the repository's benchmarks/ folder (found automatically in a checkout).")
    @click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output folder.")
    @click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
    @click.option("--threads", type=click.IntRange(min=1), default=None,
                  help="Torch threads (1 avoids slow small LAPACK calls on a busy machine).")
    def eval_cmd(protocol, collection, anchor_specs, factors, broad_spec, models, baselines, budgets, proportions,
                 n_components, draws, anchor_fraction, per_value, values, gmm_components, rank, params, tau, encoder,
                 device, split_column, max_queries, seed, n_boot, n_anchors, n_queries, n_gallery, repeats, bench_dir,
                 out_dir, progress, threads):
        """Rerun one of the paper's experiments on a labelled collection.

        PROTOCOL is coordinate (Fig. 3), budget (Figs. 4, 6), adaptation (Fig. 5),
        components (Fig. 7), table (Tables 2, 3) or runtime (Table 4). Writes
        PROTOCOL.csv, PROTOCOL_summary.csv, PROTOCOL_effects.csv, PROTOCOL.md,
        PROTOCOL.png and PROTOCOL.json to --out.
        """
        from . import protocols as P
        from .core import EvalData

        if threads is not None:
            import torch

            torch.set_num_threads(threads)

        model_list = _models(models)
        base_list = _models(baselines)
        from .core import ALL_MODELS

        for opt_name, names in (("--model", model_list), ("--baseline", base_list)):
            for m in names or []:
                if m not in ALL_MODELS:
                    raise click.BadParameter(f"unknown model {m!r}; choose from {', '.join(ALL_MODELS)}",
                                             param_hint=opt_name)
        mp = _model_params(params, gmm_components, rank)
        common = {"out_dir": out_dir, "progress": progress}
        if protocol == "runtime":
            res = P.runtime(models=model_list or P.RUNTIME_MODELS, n_anchors=_ints(n_anchors, "--n-anchors"),
                            n_queries=n_queries, n_gallery=n_gallery, repeats=repeats, bench_dir=bench_dir, **common)
            _report(res)
            return
        if collection is None:
            raise click.UsageError(f"{protocol} needs a COLLECTION (a labelled embedding collection).")
        need = {"coordinate": (2, 2), "budget": (1, 1), "adaptation": (1, 1), "components": (1, None),
                "table": (1, None)}[protocol]
        n = len(anchor_specs)
        if n < need[0] or (need[1] is not None and n > need[1]):
            want = f"exactly {need[0]}" if need[0] == need[1] else f"at least {need[0]}"
            raise click.UsageError(f"{protocol} takes {want} --anchors, got {n}.")
        if len(factors) != n:
            raise click.UsageError(f"give one --factor per --anchors ({n}), got {len(factors)}.")
        if protocol == "adaptation" and not broad_spec:
            raise click.UsageError("adaptation needs --broad SPEC (the broad anchors).")
        if protocol != "adaptation" and broad_spec:
            raise click.UsageError("--broad applies only to adaptation.")

        from ..io import load_collection

        coll = load_collection(collection)
        data = EvalData.from_collection(coll, factors=sorted(set(factors)), split_column=split_column,
                                        name=Path(collection).name)
        if max_queries is not None:
            data = data.subsample_queries(max_queries, seed=seed)
        enc = _Encoder(encoder or getattr(coll, "encoder", None), device)
        sets = [(_set_name(s), _load_anchors(s, enc)) for s in anchor_specs]
        if tau is None:
            tau = data.tau if data.tau is not None else (enc._enc.tau if enc._enc is not None else None)
        common.update(tau=tau, seed=seed, n_boot=n_boot, model_params=mp or None)
        opt = {}
        if draws is not None:
            opt["n_draws"] = draws
        if protocol == "coordinate":
            if model_list:
                opt["models"] = model_list
            if base_list is not None:
                opt["baselines"] = base_list
            if proportions:
                opt["proportions"] = _floats(proportions, "--proportions")
            if anchor_fraction is not None:
                opt["anchor_fraction"] = anchor_fraction
            res = P.coordinate(data, sets[0][1], sets[1][1], factors[0], factors[1],
                               names=(sets[0][0], sets[1][0]), **opt, **common)
        elif protocol == "budget":
            if model_list:
                opt["models"] = model_list
            if base_list is not None:
                opt["baselines"] = base_list
            res = P.budget(data, sets[0][1], factors[0], budgets=_ints(budgets, "--budgets"), name=sets[0][0],
                           **opt, **common)
        elif protocol == "adaptation":
            broad = _load_anchors(broad_spec, enc)
            if model_list:
                opt["models"] = model_list
            if base_list is not None:
                opt["references"] = base_list
            res = P.adaptation(data, broad, sets[0][1], factors[0], budgets=_ints(budgets, "--budgets"),
                               names=(_set_name(broad_spec), sets[0][0]), **opt, **common)
        elif protocol == "components":
            if model_list and model_list != ["gmm"]:
                raise click.UsageError("components sweeps the gmm model; use --baseline for references.")
            if base_list is not None:
                opt["references"] = base_list
            if n_components:
                opt["n_components"] = _ints(n_components, "--components")
            res = P.components(data, [(name, a, f) for (name, a), f in zip(sets, factors)], **opt, **common)
        else:  # table
            if model_list:
                opt["models"] = model_list
            if base_list is not None:
                opt["baselines"] = base_list
            if anchor_fraction is not None:
                opt["anchor_fraction"] = anchor_fraction
            pv: Any = per_value
            if values:
                pv = [_value(v.strip()) for v in values.split(",") if v.strip()]
            res = P.table(data, [(name, a, f) for (name, a), f in zip(sets, factors)], per_value=pv, **opt, **common)
        _report(res)

    return eval_cmd


def _report(res: Any) -> None:
    import click

    for v in res.config.get("verdicts", []):
        click.echo(v)
    click.echo(f"{res.protocol}: {res.seconds:.1f} s; wrote " + ", ".join(str(p) for p in res.paths.values()))


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``eval`` on its own: ``python -m anchordiv.experiments PROTOCOL ...``."""
    eval_command().main(args=list(argv) if argv is not None else None, prog_name="python -m anchordiv.experiments")
