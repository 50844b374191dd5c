"""Shared pieces of the ``anchordiv`` command line: errors, option decorators, loading, look-ups and output."""

from __future__ import annotations

import csv
import functools
import io as _io
import json
import warnings
from collections.abc import Sequence
from typing import Any

import click

from .._cli_values import cluster_options as _cluster_options  # noqa: F401 (for the commands)
from .._cli_values import csv_cell as _csv_cell
from .._cli_values import dask_client as _dask_client  # noqa: F401 (for the commands)
from .._cli_values import model_param_values as _model_param_values
from .._cli_values import tau_option as _tau_option
from .._cli_values import written_anchor_options as _written_anchor_options  # noqa: F401 (for the commands)
from .._cli_values import written_anchors as _written_anchors
from .._util import json_scalar
from ..encoders import LazyEncoder
from ..models import default_tau, model_names, registry


def _tau_models() -> tuple[str, ...]:
    """Geometries with a temperature (read from the registry when a command runs)."""
    return model_names(takes_temperature=True)


def _anchor_models() -> tuple[str, ...]:
    """Geometries that need anchors (read from the registry when a command runs)."""
    return model_names(needs_anchors=True)


def __getattr__(name: str) -> Any:
    """``MODEL_NAMES``, ``TAU_MODELS`` and ``ANCHOR_MODELS``: the registry's names now, plug-ins included."""
    table = {"MODEL_NAMES": lambda: tuple(registry()), "TAU_MODELS": _tau_models, "ANCHOR_MODELS": _anchor_models}
    if name in table:
        return table[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _ModelChoice(click.Choice):
    """``--model``: a registry name, the choices read when the command runs (so geometries
    registered after import, and installed plug-ins, are accepted)."""

    def __init__(self) -> None:
        super().__init__((), case_sensitive=True)

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(registry())

    @choices.setter
    def choices(self, value: Any) -> None:
        pass

#: Rows sampled by ``index build`` to measure an approximate index's recall@10, and the level below which it warns.
RECALL_SAMPLE, RECALL_WARNING = 200, 0.95
#: Suffix of the file written next to a saved index with what the command line needs.
INDEX_META_SUFFIX = ".anchordiv.json"

_CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# ---------------------------------------------------------------------------
# error handling


def _one_line(exc: BaseException) -> str:
    """A one-line message for ``exc``."""
    if isinstance(exc, KeyError) and exc.args:
        msg = str(exc.args[0])
    else:
        msg = str(exc)
    if isinstance(exc, click.ClickException):
        msg = exc.format_message()
    msg = " ".join(msg.split())
    known = (click.ClickException, ValueError, OSError, KeyError, RuntimeError, ImportError, TypeError, NotImplementedError)
    if not msg:
        return type(exc).__name__
    if not isinstance(exc, known):
        msg = f"{type(exc).__name__}: {msg}"
    return msg


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    click.echo(f"Warning: {' '.join(str(message).split())}", err=True)


class _Error(click.ClickException):
    """A one-line ``Error: …`` with a chosen exit status."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


class _Group(click.Group):
    """A click group that turns exceptions into one-line errors unless ``--debug`` is given."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        """Parse the group's own options; a usage error there is one line too."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            if parent is not None:
                raise
            raise _Error(f"{_one_line(exc)} (see '{info_name or self.name} --help')", exit_code=exc.exit_code) from None

    def invoke(self, ctx: click.Context) -> Any:
        """Run the subcommand; report a failure as ``Error: …`` (exit 1), or re-raise with ``--debug``."""
        debug = bool(ctx.params.get("debug"))
        if ctx.parent is not None:
            return super().invoke(ctx)
        show = warnings.showwarning
        if not debug:
            warnings.showwarning = _show_warning
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            raise _Error(f"{_one_line(exc)} (see '{where} --help')", exit_code=exc.exit_code) from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if debug:
                raise
            raise _Error(_one_line(exc) + " (rerun with --debug for the traceback)") from None
        finally:
            warnings.showwarning = show


# ---------------------------------------------------------------------------
# shared helpers


def _split_models(values: Sequence[str], default: str = "softmax") -> list[str]:
    """Model names from repeatable, comma-separated ``--model`` values, in order, without repeats."""
    out: list[str] = []
    for v in values or (default,):
        for name in v.split(","):
            name = name.strip()
            if not name:
                continue
            if name not in registry():
                raise click.BadParameter(f"unknown model {name!r}; choose from {', '.join(registry())}",
                                         param_hint="--model")
            if name not in out:
                out.append(name)
    if not out:
        raise click.BadParameter("give at least one model", param_hint="--model")
    return out


def _check_model_options(models: Sequence[str], tau: float | None, components: int | None,
                         rank: Any, seed: int | None = None, params: Sequence[str] = (),
                         option: str = "--param") -> dict[str, dict[str, Any]]:
    """``{model: {param: value}}`` of the model options, checked against each model's declared
    parameters (:func:`anchordiv.models.model_params`); an option that none of ``models`` takes
    is a usage error."""
    if tau is not None and not any(m in _tau_models() for m in models):
        raise click.UsageError(f"--tau applies to {', '.join(_tau_models())}, not to --model {','.join(models)}")
    return _model_param_values(models, {"--components": components, "--rank": rank, "--seed": seed}, params,
                               option=option)


def _build_model(name: str, anchors: Any, tau: float | None, params: dict[str, dict[str, Any]]) -> Any:
    """A fitted geometry from its registry name and ``{name: {param: value}}``
    (:func:`anchordiv.experiments.build_geometry`; an unset seed is 0)."""
    from ..experiments.core import build_geometry

    if name in _tau_models() and tau is None:
        raise click.UsageError(
            f"--model {name} needs a temperature: pass --tau, or use a collection whose manifest records one"
        )
    n = len(anchors) if anchors is not None else 0
    model = build_geometry(name, tau, n, 0, {name: dict(params.get(name, {}))}, seed=0, clip=False)
    if name in _anchor_models():
        if anchors is None:
            raise click.UsageError(f"--model {name} needs --anchors")
        return model.fit(anchors)
    return model.fit(None)


def _load_collection(path: str, mmap: bool = False) -> Any:
    """The collection; ``mmap``: its shards memory-mapped as stored (for Dask workers to map them too)."""
    from ..io import load_collection

    return load_collection(path, mmap=True, dtype=None) if mmap else load_collection(path)


def _collection_encoder(collection: Any, override: str | None, device: str | None,
                        what: str = "the collection") -> LazyEncoder | None:
    """The encoder for queries and anchors: ``--encoder`` or the one recorded in the collection."""
    recorded = getattr(collection, "encoder", None) if collection is not None else None
    if override:
        if recorded and recorded != override:
            warnings.warn(
                f"--encoder {override!r} differs from the encoder {recorded!r} recorded in {what}; "
                "distances mix embeddings of different models"
            )
        return LazyEncoder(override, device)
    if recorded:
        return LazyEncoder(recorded, device)
    return None


def _require_encoder(encoder: LazyEncoder | None, why: str) -> LazyEncoder:
    if encoder is None:
        raise click.UsageError(f"{why} needs an encoder: pass --encoder SPEC (the collection records none)")
    return encoder


def _resolve_anchor_options(specs: Sequence[str], encoder: LazyEncoder | None) -> list[tuple[str, Any, float | None]]:
    """``(spec, AnchorSet, encoder tau)`` for each ``--anchors`` value."""
    from ..anchorsfile import resolve_anchor_spec

    out = []
    for spec in specs:
        enc = _require_encoder(encoder, "--anchors")
        res = resolve_anchor_spec(spec, enc, arg="--anchors")
        out.append((spec, res.anchors, res.embedded.tau))
    return out


def _one_anchor_set(spec: str | None, texts: Sequence[str], file: str | None, encoder: LazyEncoder | None,
                    model_name: str) -> tuple[str, Any, float | None] | None:
    """``(label, AnchorSet, encoder tau)`` of ``--anchors`` or of the written anchors (``--anchor``,
    ``--anchor-file``; label ``written (N anchors)``), or None: the one set of ``search`` and ``index build``."""
    written = bool(texts) or file is not None
    if spec is not None and written:
        raise click.UsageError("give the anchors one way: --anchors PATH[:SETS], or --anchor/--anchor-file, "
                               "not both")
    if model_name in _anchor_models() and spec is None and not written:
        raise click.UsageError(f"--model {model_name} needs --anchors, --anchor or --anchor-file")
    if written:
        return _written_anchors(texts, file, encoder)
    return _resolve_anchor_options([spec], encoder)[0] if spec else None


def _default_tau(tau: float | None, collection: Any, anchor_taus: Sequence[float | None],
                 encoder: LazyEncoder | None, models: Sequence[str]) -> float | None:
    """``--tau``, else the collection's manifest, else the anchors' or the encoder's tau."""
    try:
        return default_tau(models, tau, getattr(collection, "tau", None), *anchor_taus,
                           (lambda: encoder.tau) if encoder is not None else None)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _has_ids(collection: Any) -> bool:
    """Whether the collection has an 'id' metadata column."""
    meta = getattr(collection, "metadata", None)
    return meta is not None and "id" in meta.columns


def _id_column(collection: Any) -> list[str]:
    """Each item's id as text: its 'id' column value, or its row number when there is no such column."""
    if not _has_ids(collection):
        return [str(r) for r in range(len(collection))]
    return [str(v) for v in collection.metadata["id"].tolist()]


def _item_id(collection: Any, row: int) -> Any:
    """The item's id: its value in the collection's 'id' column, or its row number without that column."""
    if collection is not None and _has_ids(collection):
        return json_scalar(collection.metadata["id"].iloc[row])
    return int(row)


def _item_tag(collection: Any, row: int) -> str:
    """``id ID (row N)``, or ``row N`` in a collection without an 'id' column (where the id is the row)."""
    return f"id {_item_id(collection, row)} (row {row})" if _has_ids(collection) else f"row {row}"


def _listed(values: Sequence[Any], most: int = 5) -> str:
    shown = ", ".join(repr(str(v)) for v in values[:most])
    return shown + (f" and {len(values) - most} more" if len(values) > most else "")


def _rows_of_ids(collection: Any, values: Sequence[Any], option: str, row_option: str) -> list[int]:
    """Rows of the items whose id is each of ``values`` (compared as text; see :func:`_id_column`)."""
    if collection is None:
        raise click.BadParameter(f"{option} takes the collection's ids, but no collection is known; pass "
                                 f"--collection, or row numbers with {row_option}", param_hint=option)
    ids = _id_column(collection)
    where: dict[str, list[int]] = {}
    for r, v in enumerate(ids):
        where.setdefault(v, []).append(r)
    missing = [v for v in values if str(v) not in where]
    if missing:
        noun = "id" if len(missing) == 1 else "ids"
        within = "the collection's 'id' column" if _has_ids(collection) else \
            f"this collection (it has no 'id' column, so its ids are its row numbers 0..{len(ids) - 1})"
        raise click.BadParameter(f"no item has {noun} {_listed(missing)} in {within}; pass row numbers with "
                                 f"{row_option}", param_hint=option)
    rows = []
    for v in values:
        found = where[str(v)]
        if len(found) > 1:
            raise click.BadParameter(f"id {str(v)!r} appears {len(found)} times in the 'id' column (rows "
                                     f"{found[:5]}); pick one with {row_option}", param_hint=option)
        rows.append(found[0])
    return rows


def _check_rows(rows: Sequence[int], n: int, option: str) -> list[int]:
    """``rows`` as ints, each a row number of a collection of ``n`` rows."""
    bad = [r for r in rows if not 0 <= int(r) < n]
    if bad:
        raise click.BadParameter(f"row {bad[0]} is out of range; the collection has {n} rows (0..{n - 1})",
                                 param_hint=option)
    return [int(r) for r in rows]


def _find_rows(collection: Any, refs: Sequence[tuple[str, Any]]) -> list[int]:
    """Row numbers for ("row", N) and ("id", VALUE) query references."""
    rows = []
    for kind, v in refs:
        if kind == "row":
            rows += _check_rows([v], len(collection), "--query-row")
        else:
            rows += _rows_of_ids(collection, [v], "--query-id", "--query-row")
    return rows


def _item_column(collection: Any) -> str | None:
    meta = getattr(collection, "metadata", None)
    if meta is None:
        return None
    if getattr(collection, "item_column", None):
        return collection.item_column
    for col in ("caption", "image_path", "text"):
        if col in meta.columns:
            return col
    return None


def _describe_row(collection: Any, row: int) -> str:
    col = _item_column(collection)
    if col is None:
        return f"row {row}"
    return str(collection.metadata[col].iloc[row])


class _Queries:
    """Query vectors with a label and kind for each."""

    def __init__(self) -> None:
        self.vectors: list[Any] = []
        self.labels: list[str] = []
        self.kinds: list[str] = []
        self.rows: list[int | None] = []

    def add(self, vector: Any, label: str, kind: str, row: int | None = None) -> None:
        self.vectors.append(vector)
        self.labels.append(label)
        self.kinds.append(kind)
        self.rows.append(row)


def _gather_queries(collection: Any, refs: Sequence[tuple[str, Any]], texts: Sequence[str], images: Sequence[str],
                    encoder: LazyEncoder | None, dim: int | None, searched: str = "the collection") -> _Queries:
    import numpy as np

    if not (refs or texts or images):
        raise click.UsageError("give at least one query: --query-row, --query-id, --query-text or --query-image")
    q = _Queries()
    if refs:
        if collection is None:
            raise click.UsageError("--query-row and --query-id need a collection")
        for r in _find_rows(collection, refs):
            q.add(np.asarray(collection.embeddings[r], dtype=np.float32),
                  f"{_item_tag(collection, r)}: {_describe_row(collection, r)}", "item", r)
    if texts:
        enc = _require_encoder(encoder, "--query-text")
        for t, v in zip(texts, enc.encode_text(list(texts))):
            q.add(v, t, "text")
    if images:
        enc = _require_encoder(encoder, "--query-image")
        for p, v in zip(images, enc.encode_images(list(images))):
            q.add(v, p, "image")
    if dim is not None:
        bad = [lab for lab, v in zip(q.labels, q.vectors) if v.shape[-1] != dim]
        if bad:
            raise ValueError(
                f"query {bad[0]!r} has dimension {len(q.vectors[q.labels.index(bad[0])])} but {searched} "
                f"has {dim}; embed queries with the encoder of {searched} (--encoder)"
            )
    return q


def _check_k(k: int, n: int) -> None:
    if k > n:
        raise click.BadParameter(f"{k} exceeds the {n} items searched; pass -k {n} or less", param_hint="-k")



def _own_rows(queries: _Queries, include_self: bool) -> Any:
    """Each query's own collection row (−1 for text and image queries) to exclude, or None."""
    import numpy as np

    if include_self or all(r is None for r in queries.rows):
        return None
    return np.array([-1 if r is None else int(r) for r in queries.rows], dtype=np.int64)


def _k_left(k: int, n: int, queries: _Queries, include_self: bool) -> int:
    """k, at most the rows left once each query's own row is excluded."""
    return min(k, n - (0 if _own_rows(queries, include_self) is None else 1))


def _results(collection: Any, queries: _Queries, distances: Any, indices: Any) -> list[dict]:
    """Per query: its label and kind and the top-k rows with metadata."""
    import numpy as np

    meta = getattr(collection, "metadata", None)
    columns = [] if meta is None else [str(c) for c in meta.columns]
    out = []
    for qi, label in enumerate(queries.labels):
        hits = []
        for d, i in zip(np.asarray(distances[qi]).tolist(), np.asarray(indices[qi]).tolist()):
            if i < 0:
                continue
            hit = {"rank": len(hits) + 1, "id": _item_id(collection, i), "row": int(i), "distance": float(d)}
            if meta is not None and i < len(meta):
                for c in columns:
                    if c not in hit or c == "id":
                        hit[c] = json_scalar(meta[c].iloc[i])
            hits.append(hit)
        row = queries.rows[qi]
        out.append({"query": label, "kind": queries.kinds[qi],
                     "id": None if row is None else _item_id(collection, row),
                     "row": row, "results": hits})
    return out


def _shorten(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(h), *(len(r[j]) for r in rows)) if rows else len(h) for j, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def _emit(results: list[dict], fmt: str, info: dict, ids: bool = True) -> None:
    """Print search results as a table, JSON or CSV: each item's ``id`` (see :func:`_item_id`) and ``row``.

    The table leaves out the ``id`` column when ``ids`` is False (the ids are the rows).
    """
    own = ("rank", "id", "row", "distance")
    columns: list[str] = []
    for q in results:
        for h in q["results"]:
            for c in h:
                if c not in own and c not in columns:
                    columns.append(c)
    if fmt == "json":
        click.echo(json.dumps({**info, "queries": results}, indent=2, ensure_ascii=False))
        return

    def cell(v: Any) -> str:
        return "" if v is None else str(v)

    if fmt == "csv":  # every cell through csv_cell: no caption, id or label runs as a spreadsheet formula
        buf = _io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([_csv_cell(c) for c in ["query", "query_kind", "query_id", "query_row", *own, *columns]])
        for q in results:
            for h in q["results"]:
                w.writerow([_csv_cell(c) for c in (q["query"], q["kind"], q.get("id"), q.get("row"), h["rank"],
                                                   h["id"], h["row"], repr(h["distance"]),
                                                   *(h.get(c) for c in columns))])
        click.echo(buf.getvalue(), nl=False)
        return
    header = ["rank", *(["id"] if ids else []), "row", "distance", *columns]
    desc = ", ".join(f"{k}={v}" for k, v in info.items() if v is not None and k != "collection")
    click.echo(f"# {desc}")
    for q in results:
        click.echo(f"\nquery ({q['kind']}): {_shorten(q['query'], 80)}")
        if q.get("top_anchors"):
            click.echo("top anchors: " + "; ".join(f"{_shorten(a['anchor'], 40)} ({a['probability']:.2f})"
                                                  for a in q["top_anchors"]))
        rows = [[str(h["rank"]), *([cell(h["id"])] if ids else []), str(h["row"]), f"{h['distance']:.6g}",
                 *(_shorten(cell(h.get(c)), 60) for c in columns)] for h in q["results"]]
        click.echo(_table(rows, header))


def _as_device(device: str | None, *arrays: Any) -> list[Any]:
    """Move numpy arrays to ``device`` as torch tensors (unchanged when ``device`` is None or cpu)."""
    if device in (None, "cpu"):
        return list(arrays)
    import torch

    return [torch.as_tensor(a).to(device) for a in arrays]


def _anchors_to(anchors: Any, device: str | None) -> Any:
    if anchors is None or device in (None, "cpu"):
        return anchors
    from ..anchors import AnchorSet

    return AnchorSet(anchors.embeddings.to(device), texts=anchors.texts, weights=anchors.weights.to(device))


def _to_numpy(x: Any) -> Any:
    import numpy as np

    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


# ---------------------------------------------------------------------------
# shared options


def _query_options(f):
    """--query-row, --query-id, --query-text, --query-image; the command receives the rows and
    ids together as ``query_refs``, a list of ("row", N) and ("id", VALUE) pairs."""

    @functools.wraps(f)
    def command(*args, query_rows=(), query_id_values=(), **kwargs):
        refs = [("row", r) for r in query_rows] + [("id", v) for v in query_id_values]
        return f(*args, query_refs=refs, **kwargs)

    command = click.option("--query-image", "query_images", multiple=True, metavar="PATH",
                           help="Image query, embedded with the collection's encoder (repeatable).")(command)
    command = click.option("--query-text", "query_texts", multiple=True, metavar="TEXT",
                           help="Text query, embedded with the collection's encoder (repeatable).")(command)
    command = click.option("--query-id", "query_id_values", multiple=True, metavar="ID",
                           help="The item whose value in the collection's 'id' column is ID, as a query "
                                "(repeatable); it is left out of its own results unless --include-self.")(command)
    command = click.option("--query-row", "query_rows", multiple=True, type=click.IntRange(min=0), metavar="N",
                           help="The item at row N (0-based) of the collection, as a query (repeatable); "
                                "it is left out of its own results unless --include-self.")(command)
    return command


def _encoder_option(help_text: str):
    """``--encoder SPEC`` (default minilm), with ``--model`` kept as a deprecated alias that warns."""

    def warn(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            warnings.warn(f"--model {value} names the encoder here, which is now --encoder; "
                          "--model means the geometry in every other command", FutureWarning)
        return value

    def decorate(f):
        @functools.wraps(f)
        def command(*args, deprecated_model=None, **kwargs):
            if deprecated_model is not None:
                kwargs["model"] = deprecated_model
            return f(*args, **kwargs)

        command = click.option("--model", "deprecated_model", default=None, hidden=True, metavar="SPEC",
                               expose_value=True, callback=warn)(command)
        return click.option("--encoder", "model", default="minilm", show_default=True, metavar="SPEC",
                            help=help_text)(command)

    return decorate


def _model_options(*flags: str):
    """The model options: --tau, --components, --rank, --seed and the declared parameters as
    ``flags`` KEY=VALUE (``model_params``), e.g. ``--param`` / ``--model-param``."""
    def decorate(f):
        f = click.option(*flags, "model_params", multiple=True, metavar="[MODEL.]KEY=VALUE",
                         help="A declared model parameter (anchordiv.models.model_params), e.g. reg_covar=1e-4 or "
                              "gmm.max_iter=500; KEY=VALUE goes to every model that takes KEY (repeatable).")(f)
        f = click.option("--seed", type=int, default=None, help="Seed of the fit (gmm: k-means++ initialisation).")(f)
        f = click.option("--rank", default=None, metavar="K|FRACTION",
                         help="Latent models: subspace dimension k, or a variance fraction in (0, 1] "
                              "(default 0.95).")(f)
        f = click.option("--components", type=click.IntRange(min=1), default=None,
                         help="gmm: number of mixture components (default 4, as in the Python API and `eval`).")(f)
        f = click.option("--tau", type=float, default=None, callback=_tau_option,
                         help="Temperature in [1e-4, 100]; default from the collection's manifest, else the "
                              "encoder.")(f)
        return f

    return decorate


_FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
                              show_default=True, help="Output format.")
_ENCODER_HELP = "Encoder spec for queries and anchors; default: the encoder recorded in the collection."
