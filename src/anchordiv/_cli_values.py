"""Values shared by the ``anchordiv`` commands: the options ``--param KEY=VALUE``, ``--rank`` and
``--tau``, the model parameters they set (read from each model's declared ``PARAMS``), the anchors
written by hand (``--anchor``, ``--anchor-file``), and the cells of the CSV files they write."""

from __future__ import annotations

import contextlib
import re
from typing import Any, Callable, Mapping, Sequence

import click


def tau_option(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """Click callback of every ``--tau`` option: each temperature (one, or a list) checked by
    :func:`anchordiv.models.base.check_tau`, the range shared with models, manifests and the service."""
    from .models.base import check_tau

    if value is None:
        return None
    try:
        if isinstance(value, (list, tuple)):
            return type(value)(check_tau(v, "--tau") for v in value)
        return check_tau(value, "--tau")
    except ValueError as exc:
        raise click.BadParameter(str(exc).removeprefix("--tau "), ctx, param, param_hint="--tau") from None


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", re.ASCII)
#: First characters that make a spreadsheet read a cell as a formula (OWASP, CSV injection).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """``value`` as a CSV cell that no spreadsheet runs: text starting with ``= + - @``, tab or CR
    gets a leading ``'`` (OWASP's advice), unless it reads as a number; None is empty."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if text.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(text):
        return "'" + text
    return text


def parse_params(values: Sequence[str]) -> dict:
    """``--param KEY=VALUE`` options as a dict; values read as int, float or bool where they parse."""
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--param")
        raw = raw.strip()
        value: Any = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        out[key] = value
    return out


#: Options that set a declared model parameter on every model of the command that declares it:
#: option -> which :class:`anchordiv.models.Param` it sets.
MODEL_SHORTCUTS: dict[str, Callable[[Any], bool]] = {
    "--components": lambda p: p.name == "n_components",
    "--rank": lambda p: p.kind == "rank",
    "--seed": lambda p: p.seed,
}


def models_declaring(option: str) -> list[str]:
    """Registry names of the geometries with a parameter that ``option`` sets."""
    from .models import model_params, registry

    return [m for m in registry() if any(MODEL_SHORTCUTS[option](p) for p in model_params(m).values())]


def _value(param: Any, value: Any, arg: str) -> Any:
    try:
        return param.parse(value, arg) if isinstance(value, str) else param.check(value, arg)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def model_param_values(models: Sequence[str], shortcuts: Mapping[str, Any], items: Sequence[str] = (),
                       option: str = "--param", run: bool = False) -> dict[str, dict[str, Any]]:
    """``{model: {param: value}}`` for ``models`` from the shortcut options (``{"--rank": "8"}``;
    None values are left out) and ``KEY=VALUE`` / ``MODEL.KEY=VALUE`` items of ``option``.

    Each value is checked against the model's declaration (:func:`anchordiv.models.model_params`).
    ``KEY=VALUE`` goes to every model of ``models`` that declares ``KEY``, ``MODEL.KEY=VALUE``
    to that model only. An option that no model of ``models`` takes is a usage error
    (``run=True`` words it for an ``eval`` run).
    """
    from .models import model_params

    out: dict[str, dict[str, Any]] = {}
    for opt, value in shortcuts.items():
        if value is None:
            continue
        takers = [(m, p) for m in models for p in model_params(m).values() if MODEL_SHORTCUTS[opt](p)]
        if not takers:
            declaring = models_declaring(opt)
            if run:
                raise click.UsageError(f"{opt} sets a parameter of {' and '.join(declaring) or 'no model'}, "
                                       f"which this run does not fit")
            raise click.UsageError(f"{opt} applies only to --model {' or '.join(declaring) or '(none registered)'}")
        for m, p in takers:
            out.setdefault(m, {})[p.name] = _value(p, value, opt)
    parsed = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
        parsed.append((key, raw.strip()))
    for key, raw in sorted(parsed, key=lambda kv: "." in kv[0]):  # MODEL.KEY last: it wins
        model, _, name = key.rpartition(".")
        if name in ("tau", "logit_scale"):
            raise click.BadParameter(f"{key}: the temperature is set with --tau", param_hint=option)
        if model and (model not in models or name not in model_params(model)):
            raise click.BadParameter(f"{key}: {model} is not fitted {'in this run' if run else 'here'} or takes no "
                                     f"{name!r}", param_hint=option)
        takers = [model] if model else [m for m in models if name in model_params(m)]
        if not takers:
            raise click.BadParameter(f"no model {'of this run' if run else 'given'} ({', '.join(models)}) takes "
                                     f"{name!r}", param_hint=option)
        for m in takers:
            out.setdefault(m, {})[name] = _value(model_params(m)[name], raw, f"{option} {key}")
    return out


#: Name of the anchor set written by hand, where it sits beside named sets (``serve``).
WRITTEN = "written"


def written_anchor_options(f: Callable) -> Callable:
    """``--anchor TEXT`` (repeatable) and ``--anchor-file FILE``: one anchor set written by hand, given to
    the command as ``anchor_texts`` and ``anchor_file``."""
    f = click.option("--anchor-file", "anchor_file", default=None, metavar="FILE",
                     help="Anchors written by hand, one per line (UTF-8; blank lines and lines starting with # "
                          "are skipped; no templates), after the --anchor texts in the same set.")(f)
    return click.option("--anchor", "anchor_texts", multiple=True, metavar="TEXT",
                        help="An anchor phrase written by hand (repeatable); embedded with the command's encoder "
                             "as one set with the --anchor-file lines.")(f)


def read_anchor_file(path: str) -> list[tuple[int, str]]:
    """``(line number, phrase)`` of each anchor of ``path``: one per line, blank lines and ``#`` lines skipped."""
    from .anchorsfile.parsing import MAX_PHRASES

    def bad(why: str) -> click.BadParameter:
        return click.BadParameter(why, param_hint="--anchor-file")

    try:
        with open(path, encoding="utf-8-sig") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise bad(f"{path!r} does not exist; write the anchors one per line in a UTF-8 text file, "
                  "or give them with --anchor TEXT") from None
    except IsADirectoryError:
        raise bad(f"{path!r} is a folder; give a UTF-8 text file with one anchor per line") from None
    except UnicodeDecodeError as exc:
        raise bad(f"{path!r} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8") from None
    except OSError as exc:
        raise bad(f"cannot read {path!r} ({exc.strerror or exc}); check the path and its permissions") from None
    lines = [(n, s) for n, s in enumerate((line.strip() for line in text.split("\n")), 1)
             if s and not s.startswith("#")]
    if not lines:
        raise bad(f"{path!r} holds no anchors (only blank lines and # comments); write one anchor phrase per line")
    if len(lines) > MAX_PHRASES:
        raise bad(f"{path!r} holds {len(lines)} anchors, more than {MAX_PHRASES}; split it or sample it")
    return lines


def written_anchors(texts: Sequence[str], file: str | None, encoder: Any) -> tuple[str, Any, float | None] | None:
    """``(label, AnchorSet, encoder tau)`` of the ``--anchor`` texts and ``--anchor-file`` lines (one set,
    :meth:`anchordiv.AnchorSet.from_texts` with ``encoder``), or None when neither is given."""
    from .anchors import AnchorSet

    if not texts and file is None:
        return None
    if encoder is None:
        raise click.UsageError(f"{'--anchor' if texts else '--anchor-file'} needs an encoder: pass --encoder SPEC "
                               "(the collection records none)")
    lines = read_anchor_file(file) if file is not None else []
    names = [f"--anchor #{i + 1}" for i in range(len(texts))] + [f"line {n} of {file!r}" for n, _ in lines]
    try:
        aset = AnchorSet.from_texts(list(texts) + [s for _, s in lines], encoder)
    except ValueError as exc:
        found = [int(i) for i in re.findall(r"texts\[(\d+)\]", str(exc))]
        if not found:
            raise
        why = re.sub(r"texts\[(\d+)\]", lambda m: names[int(m.group(1))], str(exc))
        why = why.replace(" (weights= sets how much each counts)", "").rstrip(".")
        raise click.BadParameter(why, param_hint="--anchor" if found[0] < len(texts) else "--anchor-file") from None
    return f"{WRITTEN} ({len(aset)} anchor{'' if len(aset) == 1 else 's'})", aset, getattr(encoder, "tau", None)


def cluster_options(what: str):
    """``--workers N`` (a local Dask cluster) and ``--scheduler ADDRESS`` (an existing one) for ``what``."""
    def wrap(f):
        f = click.option("--scheduler", default=None, metavar="ADDRESS",
                         help=f"{what} on an existing Dask cluster, e.g. tcp://10.0.0.5:8786.")(f)
        return click.option("--workers", type=click.IntRange(min=1), default=None,
                            help=f"{what} on a local Dask cluster of this many worker processes "
                                 "(pip install 'dask[distributed]').")(f)
    return wrap


@contextlib.contextmanager
def dask_client(workers: int | None, scheduler: str | None):
    """A ``distributed.Client`` of a local cluster of ``workers`` processes (on 127.0.0.1) or of
    ``scheduler``; None when neither is given."""
    if workers is not None and scheduler is not None:
        raise click.UsageError("pass either --workers (a local Dask cluster) or --scheduler (an existing one)")
    if workers is None and scheduler is None:
        yield None
        return
    try:
        import distributed
    except ImportError:
        raise click.UsageError("--workers and --scheduler need Dask: pip install 'dask[distributed]'") from None
    if scheduler is not None:
        try:
            client = distributed.Client(scheduler, timeout=10)
        except OSError as exc:
            raise click.UsageError(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({exc})") from None
        with client:
            yield client
        return
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        yield client
