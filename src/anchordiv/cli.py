"""The ``anchordiv`` command line: embed collections, embed anchors, search, compare, index, demo.

Every command has ``--help`` with a worked example. Errors are printed as one line,
``Error: …``, with exit status 1 (2 for usage errors); the global ``--debug`` option shows
the full traceback instead.

Anchors are given as ``PATH`` or ``PATH:NAME[:P][,NAME[:P]…]`` (a mixture of named sets of
a YAML file, e.g. ``anchors.yaml:object:0.7,style:0.3``); see :mod:`anchordiv.anchorsfile`.
"""

from __future__ import annotations

import contextlib
import csv
import io as _io
import functools
import json
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

import click

from . import __version__
from ._cli_values import csv_cell as _csv_cell, parse_params as _parse_params
from ._cli_values import model_param_values as _model_param_values, tau_option as _tau_option
from ._util import json_scalar
from .index import backend_choice, backend_class
from .encoders import LazyEncoder
from .models import default_tau, model_names, registry


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
    from .experiments.core import build_geometry

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


def _load_collection(path: str) -> Any:
    from .io import load_collection

    return load_collection(path)


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
    from .anchorsfile import resolve_anchor_spec

    out = []
    for spec in specs:
        enc = _require_encoder(encoder, "--anchors")
        res = resolve_anchor_spec(spec, enc, arg="--anchors")
        out.append((spec, res.anchors, res.embedded.tau))
    return out


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


def _index_meta_path(path: str) -> Path:
    return Path(os.fspath(path) + INDEX_META_SUFFIX)


def _read_index_meta(path: str) -> dict:
    p = _index_meta_path(path)
    if not p.is_file():
        return {}
    try:
        with open(p, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--index: cannot read {str(p)!r} ({exc}); rebuild the index") from None
    except RecursionError:
        raise ValueError(f"--index: cannot read {str(p)!r}: its JSON is nested too deeply to be the file "
                         "'index build' writes; rebuild the index") from None
    if not isinstance(data, dict):
        raise ValueError(f"--index: {str(p)!r} is not a JSON object as 'index build' writes; rebuild the index")
    return data


def _write_index_meta(path: str, meta: dict) -> None:
    """Write the sidecar of index ``path`` atomically (a symbolic link there is replaced, never followed)."""
    from ._util import atomic_write

    data = json.dumps(meta, indent=2).encode("utf-8")
    atomic_write(_index_meta_path(path), lambda fh: fh.write(data), advice="choose another --out")


def _current_index_meta(index_path: str, meta: dict, idx: Any, explicit: bool) -> dict:
    """``meta`` when it describes the index file as loaded (``idx``); {} for a stale sidecar when a
    collection is given explicitly; otherwise a ``ValueError`` naming the fix."""
    if not meta:
        return meta
    side = str(_index_meta_path(index_path))
    recorded = meta.get("index_sha256")
    if recorded is None:
        warnings.warn(f"{side!r} records no digest of its index (written by an older anchordiv), so it cannot be "
                      "checked against the index; rebuild the index with 'anchordiv index build' to record one")
        return meta
    if recorded == idx.file_digest:
        return meta
    if not explicit:
        raise ValueError(
            f"--index: {side!r} is stale: it describes another version of {index_path!r} (the index was replaced "
            "after it was written, e.g. by a build stopped before its end). Rebuild the index with "
            "'anchordiv index build', or pass --collection with the collection to search (it is checked against "
            "the index)")
    warnings.warn(f"{side!r} is stale (it describes another version of {index_path!r}); it is ignored, and the "
                  "collection given is checked against the index alone")
    return {}


def _check_index_collection(index_path: str, meta: dict, idx: Any, coll: Any, explicit: bool) -> None:
    """Refuse a collection that is not the one the index was built from: another dimension, or a
    fingerprint other than the one the sidecar recorded at build time."""
    import numpy as np

    from .io.collections import fingerprint_mismatch

    where = (f"--collection: {coll.path!r}" if explicit else
             f"--index: the collection {coll.path!r} named in {str(_index_meta_path(index_path))!r}")
    if idx.dim is not None and coll.dim != idx.dim:
        raise ValueError(f"{where} has dimension {coll.dim} but the index {index_path!r} holds vectors of dimension "
                         f"{idx.dim}; pass the collection the index was built from")
    if "collection_fingerprint" in meta:
        why = fingerprint_mismatch(meta["collection_fingerprint"], coll.fingerprint())
        if why is not None:
            raise ValueError(f"{where} is not the collection {index_path!r} was built from: {why}. Pass that "
                             "collection, or rebuild the index from this one with 'anchordiv index build'")
    if len(idx) and int(np.max(idx.ids)) >= len(coll):
        raise ValueError(f"{where} has {len(coll)} rows but the index {index_path!r} holds rows up to "
                         f"{int(np.max(idx.ids))}; pass the collection the index was built from")


def _as_device(device: str | None, *arrays: Any) -> list[Any]:
    """Move numpy arrays to ``device`` as torch tensors (unchanged when ``device`` is None or cpu)."""
    if device in (None, "cpu"):
        return list(arrays)
    import torch

    return [torch.as_tensor(a).to(device) for a in arrays]


def _anchors_to(anchors: Any, device: str | None) -> Any:
    if anchors is None or device in (None, "cpu"):
        return anchors
    from .anchors import AnchorSet

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


# ---------------------------------------------------------------------------
# the commands


@click.group(cls=_Group, context_settings=_CONTEXT)
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
@click.version_option(__version__, prog_name="anchordiv")
def cli(debug: bool) -> None:
    """Context-specific similarity on fixed embeddings (anchor divergences).

    Embed a collection once, describe the context with text anchors, and search or
    compare neighbours under several geometries.

    Anchors are PATH or PATH:NAME[:P][,NAME[:P]...], e.g. anchors.yaml:object:0.7,style:0.3
    (a mixture of the sets 'object' and 'style' of a YAML anchors file).

    Example:

    \b
      anchordiv embed captions.txt --out coll/
      anchordiv anchors anchors.yaml
      anchordiv search coll/ --anchors anchors.yaml:style --query-text "a red car" -k 5
    """


@cli.command(short_help="Embed images or texts into a collection.")
@click.argument("source", type=click.Path(exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Collection folder to write.")
@_encoder_option("Encoder spec: minilm, open_clip:ARCH/PRETRAINED, hf_clip:NAME, sentence-transformers:NAME.")
@click.option("--column", default=None, help="Text column of a CSV/TSV/parquet file (default: caption, else text).")
@click.option("--shard-size", type=click.IntRange(min=1), default=10_000, show_default=True, help="Items per shard.")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True, help="Items per encoder call.")
@click.option("--device", default=None, help="Torch device of the encoder (default: cuda if available, else cpu).")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
              help="Storage type of the embeddings.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar (default: when stderr is a terminal).")
def embed(source: str, out_dir: str, model: str, column: str | None, shard_size: int, batch_size: int,
          device: str | None, dtype: str, progress: bool | None) -> None:
    """Embed an image folder, a text file or a CSV/parquet text column into a collection.

    SOURCE is a folder of images (labels = parent folder names), a text file (one item
    per line), or a .csv/.tsv/.parquet file whose text column is --column (other columns
    are kept as labels). The output uses the clip-retrieval layout (img_emb/ or
    text_emb/, metadata/, collection.json). Rerunning the same command resumes an
    interrupted job.

    Example:

    \b
      anchordiv embed reviews.csv --column text --out reviews_emb/
      anchordiv embed photos/ --encoder open_clip:ViT-B-32/laion2b_s34b_b79k --out photos_emb/
    """
    from .io import embed_collection, list_images, read_texts

    src = Path(source)
    if src.is_dir():
        if column is not None:
            raise click.UsageError("--column applies to CSV/TSV/parquet files, not to an image folder")
        items, kind = list_images(src), "image"
    else:
        items, kind = read_texts(src, column=column, keep_name=True), "text"
    encoder = LazyEncoder(model, device, batch_size)
    show = sys.stderr.isatty() if progress is None else progress
    res = embed_collection(items, encoder, out_dir, kind=kind, shard_size=shard_size, dtype=dtype,
                           progress=show, batch_size=batch_size,
                           item_column=str(items.columns[0]) if kind == "text" else None)
    noun = "images" if kind == "image" else "texts"
    if res.shards_written == 0 and res.complete:
        click.echo(f"Nothing to do: {res.out_dir} already holds {res.n_embedded} embedded {noun}; "
                   f"skipped {res.n_skipped}.")
    else:
        verb = "Resumed and embedded" if res.resumed else "Embedded"
        click.echo(f"{verb} {res.n_embedded} of {res.n_items} {noun} with {model} into {res.out_dir} "
                   f"({res.shards_written} shard(s) written, {res.n_shards} in all); skipped {res.n_skipped}.")
    for s in res.skipped[:10]:
        click.echo(f"  skipped #{s['index']} {s['item']}: {s['reason']}", err=True)
    if res.n_skipped > 10:
        click.echo(f"  ... and {res.n_skipped - 10} more (listed in collection.json)", err=True)


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_encoder_option("Encoder spec (as for embed).")
@click.option("--device", default=None, help="Torch device of the encoder.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Phrases per encoder call.")
@click.option("--refresh", is_flag=True, help="Recompute even if a matching cache exists.")
@click.option("--diagnose", "diagnose", default=None, metavar="COLLECTION", type=click.Path(exists=True),
              help="Also show how COLLECTION's items use each set: effective number of anchors exp(entropy), "
                   "items concentrated on few anchors, anchors never any item's top one.")
@click.option("--tau", type=float, default=None, callback=_tau_option,
              help="Temperature of --diagnose in [1e-4, 100] (default: the collection's, else the encoder's).")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True,
              help="--diagnose: an item is concentrated when its TOP anchors hold half its mass.")
def anchors(file: str, model: str, device: str | None, batch_size: int | None, refresh: bool,
            diagnose: str | None, tau: float | None, top: int) -> None:
    """Embed an anchors file and cache the result next to it.

    FILE is plain text (one phrase per line, # comments) or YAML with named sets: a list of
    phrases, or {names: [...], template: "a photo of a {}"} (template may be a list), with
    optional weights: (per phrase or per name) and mix: (the set's default proportion).
    The cache FILE.anchors.<encoder>.npz is reused while the file and encoder are unchanged.

    Example:

    \b
      $ cat anchors.yaml
      object:
        names: [cat, dog, car]
        template: "a photo of a {}"
      style: [a watercolor painting, a pencil sketch]
      $ anchordiv anchors anchors.yaml --encoder minilm
    """
    from .anchorsfile import embed_anchors

    enc = LazyEncoder(model, device, batch_size)
    emb = embed_anchors(file, enc, refresh=refresh)
    total_mix = sum(emb.mix.values()) or 1.0
    click.echo(f"{file}: {len(emb.sets)} set(s), {emb.n_phrases} phrase(s); encoder {emb.encoder}"
               + (f" (tau {emb.tau:.6g})" if emb.tau is not None else "")
               + f", dim {next(iter(emb.sets.values())).dim}")
    import torch

    rows = []
    for name, s in emb.sets.items():
        uniform = bool(torch.allclose(s.weights, s.weights.new_full(s.weights.shape, 1.0 / len(s))))
        rows.append([name, str(len(s)), f"{emb.mix[name] / total_mix:.3g}", "uniform" if uniform else "weighted",
                     _shorten(s.texts[0] if s.texts else "", 50)])
    click.echo(_table(rows, ["set", "phrases", "mix", "weights", "first phrase"]))
    state = "reused" if emb.from_cache else ("written" if emb.cache_file else "not written")
    click.echo(f"cache: {emb.cache_file or '-'} ({state})")
    if diagnose is not None:
        _diagnose(diagnose, emb, tau, top)


def _diagnose(collection: str, emb: Any, tau: float | None, top: int) -> None:
    """Print each set's coverage of ``collection`` (:meth:`anchordiv.diagnostics.Explanation.coverage`)."""
    import torch

    from .diagnostics import explain
    from .exact import largest_k

    coll = _load_collection(collection)
    t = _default_tau(tau, coll, [emb.tau], None, ["softmax"])
    click.echo(f"\ncoverage of {collection} ({len(coll)} items, tau {t:.6g}): share of items with half their mass "
               f"on <= {top} anchors, median exp(entropy)")
    rows = []
    for name, s in emb.sets.items():
        if s.dim != coll.dim:
            raise click.UsageError(f"set {name!r} has dimension {s.dim} but {collection} has {coll.dim}; embed both "
                                   "with one encoder")
        cov = explain(s, coll.embeddings, t, top=min(top, len(s))).coverage(few=min(top, len(s)))
        counts = torch.as_tensor(cov.top_counts, dtype=torch.float64)[None]
        most = [s.texts[i] if s.texts else str(i) for i in largest_k(counts, None, min(2, len(s)))[1][0].tolist()]
        rows.append([name, str(len(s)), f"{cov.n_concentrated}/{cov.n_items}", f"{cov.median_effective:.3g}",
                     str(len(cov.never_top)), _shorten("; ".join(map(str, cov.never_top)) or "-", 50),
                     _shorten("; ".join(most), 50)])
    click.echo(_table(rows, ["set", "anchors", "concentrated", "median eff.", "never top", "never top anchors",
                             "most often top"]))


@cli.command(short_help="Nearest neighbours under one anchor geometry.")
@click.argument("collection", type=click.Path(exists=True))
@_query_options
@click.option("--anchors", "anchor_spec", default=None, metavar="PATH[:SETS]",
              help="Anchors file, or PATH:NAME[:P][,NAME[:P]...] for a mixture of its sets.")
@click.option("--model", "model_name", type=_ModelChoice(), default="softmax", show_default=True,
              help="Geometry (a registry name: built-in or an installed plug-in).")
@_model_options("--param", "--model-param")
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True, help="Neighbours per query.")
@click.option("--encoder", default=None, metavar="SPEC", help=_ENCODER_HELP)
@click.option("--index", "index_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Search a saved index (anchordiv index build) instead; its model and anchors are used.")
@click.option("--asymmetric", is_flag=True, help="Rank by d(q‖g) instead of the symmetrized divergence.")
@click.option("--include-self", is_flag=True, help="Keep a --query-row/--query-id item in its own results.")
@click.option("--device", default=None, help="Torch device for the encoder and the search.")
@_FORMAT_OPTION
def search(collection: str, query_refs, query_texts, query_images, anchor_spec, model_name, tau, components, rank,
           seed, model_params, k, encoder, index_path, asymmetric, include_self, device, fmt) -> None:
    """Nearest neighbours of queries in a collection under one anchor geometry.

    Queries are items of the collection (--query-row N, its row number; --query-id ID,
    its value in the 'id' column), texts (--query-text) or images (--query-image),
    embedded with the encoder recorded in the collection (or --encoder). Each result
    shows the item's id (when the collection has an 'id' column) and its row. The
    temperature defaults to the collection's (the encoder's) tau.

    Example:

    \b
      anchordiv search coll/ --anchors anchors.yaml:style --model softmax \\
          --query-text "a watercolor of a harbour" -k 5
      anchordiv search coll/ --anchors anchors.yaml:object:0.7,style:0.3 \\
          --model latent_gaussian --rank 8 --query-id 12 --format json
      anchordiv search coll/ --anchors anchors.yaml --model gmm --param reg_covar=1e-4 --query-row 0
    """
    coll = _load_collection(collection)
    if index_path is not None:
        ctx = click.get_current_context()
        explicit = ctx.get_parameter_source("model_name") == click.core.ParameterSource.COMMANDLINE
        given = [o for o, v in (("--anchors", anchor_spec), ("--model", model_name if explicit else None),
                                ("--tau", tau), ("--components", components), ("--rank", rank),
                                ("--seed", seed), ("--param", model_params or None),
                                ("--asymmetric", asymmetric or None)) if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} cannot be combined with --index (the index holds its model)")
        _search_index(index_path, coll, query_refs, query_texts, query_images, k, encoder, include_self, device, fmt)
        return
    params = _check_model_options([model_name], tau, components, rank, seed, model_params)
    enc = _collection_encoder(coll, encoder, device)
    if model_name in _anchor_models() and anchor_spec is None:
        raise click.UsageError(f"--model {model_name} needs --anchors")
    anchor_list = _resolve_anchor_options([anchor_spec], enc) if anchor_spec else []
    anchor_set = anchor_list[0][1] if anchor_list else None
    t = _default_tau(tau, coll, [a[2] for a in anchor_list], enc, [model_name])
    model = _build_model(model_name, _anchors_to(anchor_set, device), t, params)
    queries = _gather_queries(coll, query_refs, query_texts, query_images, enc, coll.dim)
    import numpy as np

    Q = np.stack(queries.vectors).astype(np.float32)
    _check_k(k, len(coll))
    Qd, Gd = _as_device(device, Q, coll.embeddings)
    dist, idx = model.search(Qd, Gd, k=_k_left(k, len(coll), queries, include_self), symmetric=not asymmetric,
                             exclude=_own_rows(queries, include_self))
    results = _results(coll, queries, _to_numpy(dist), _to_numpy(idx))
    if anchor_set is not None and t is not None:
        _add_top_anchors(results, anchor_set, Q, t)
    _emit(results, fmt, {"collection": collection, "model": model_name, "anchors": anchor_spec,
                         "tau": t if model_name in _tau_models() else None, "k": k}, ids=_has_ids(coll))


def _add_top_anchors(results: list[dict], anchors: Any, Q: Any, tau: float, top: int = 3) -> None:
    """Each query's top anchors and their probabilities under the softmax over ``anchors``."""
    from .diagnostics import explain

    ex = explain(anchors, Q, tau, top=top)
    for qi, res in enumerate(results):
        res["top_anchors"] = [{"anchor": a, "probability": p} for a, p in ex.top_anchors(qi)]
        res["effective_anchors"] = float(ex.effective_number[qi])


#: An id list of --filter: comma-separated values without spaces, quotes, brackets or comparison signs.
_ID_LIST = re.compile(r"[^\s,=<>!()\[\]\"']+(,[^\s,=<>!()\[\]\"']+)*,?")


def _read_list(spec: str, option: str) -> list[str]:
    """The values of ``@PATH`` (whitespace-separated) or of a comma list."""
    if spec.startswith("@"):
        try:
            return Path(spec[1:]).read_text(encoding="utf-8").split()
        except OSError as exc:
            raise click.BadParameter(f"cannot read the file {spec[1:]!r} ({exc.strerror})", param_hint=option)
    return [p.strip() for p in spec.split(",") if p.strip()]


def _parse_filter(coll: Any, ids: str | None, rows: str | None, backend: str, n: int) -> Any:
    """The rows to search from ``--filter`` (ids, or a milvus expression) or ``--filter-rows``; None for all."""
    import numpy as np

    if ids is not None and rows is not None:
        raise click.UsageError("pass either --filter (ids) or --filter-rows (row numbers), not both")
    if rows is not None:
        values = _read_list(rows, "--filter-rows")
        try:
            parsed = [int(v) for v in values]
        except ValueError:
            raise click.BadParameter(f"{rows!r} is not a list of row numbers: pass them as 3,17,42 or @rows.txt "
                                     "(one per line)", param_hint="--filter-rows") from None
        return np.array(_check_rows(parsed, n, "--filter-rows"), dtype=np.int64)
    if ids is None:
        return None
    if not ids.startswith("@") and not _ID_LIST.fullmatch(ids.strip()):
        if backend_class(backend).tags().expression_filters:
            return ids
        raise click.BadParameter(f"{ids!r} is not a list of ids: pass ids as a,b,c or @ids.txt (one per line); "
                                 "boolean expressions need a backend with expression filters (milvus)",
                                 param_hint="--filter")
    values = _read_list(ids, "--filter")
    return np.array(_rows_of_ids(coll, values, "--filter", "--filter-rows"), dtype=np.int64)


def _search_index(index_path: str, coll: Any, query_refs, query_texts, query_images, k: int, encoder: str | None,
                  include_self: bool, device: str | None, fmt: str, load_params: dict | None = None,
                  filter_ids: str | None = None, filter_rows: str | None = None) -> None:
    """Search a saved index and print the results (shared by ``search --index`` and ``index search``)."""
    import numpy as np

    from .index import Index

    meta = _read_index_meta(index_path)
    idx = Index.load(index_path, device=device, **(load_params or {}))
    explicit = coll is not None
    meta = _current_index_meta(index_path, meta, idx, explicit)
    if coll is None and meta.get("collection"):
        coll = _load_collection(meta["collection"])
    if coll is not None:
        _check_index_collection(index_path, meta, idx, coll, explicit)
    enc_name = encoder or meta.get("encoder")
    enc = _collection_encoder(coll, enc_name, device) if coll is not None else (
        LazyEncoder(enc_name, device) if enc_name else None)
    allowed = _parse_filter(coll, filter_ids, filter_rows, idx.backend,
                            len(coll) if coll is not None else int(np.max(idx.ids, initial=-1)) + 1)
    queries = _gather_queries(coll, query_refs, query_texts, query_images, enc, idx.dim, "the index")
    Q = np.stack(queries.vectors).astype(np.float32)
    _check_k(k, len(idx))
    (Qd,) = _as_device(device, Q)
    dist, rows = idx.search(Qd, k=_k_left(k, len(idx), queries, include_self),
                            exclude=_own_rows(queries, include_self), filter=allowed)
    results = _results(coll, queries, _to_numpy(dist), _to_numpy(rows))
    _emit(results, fmt, {"index": index_path, "backend": idx.backend, "model": meta.get("model"),
                         "anchors": meta.get("anchors"), "tau": meta.get("tau"), "k": k}, ids=_has_ids(coll))


@cli.command(short_help="Neighbours under several geometries, as an HTML report.")
@click.argument("collection", type=click.Path(exists=True))
@_query_options
@click.option("--anchors", "anchor_specs", multiple=True, metavar="PATH[:SETS]",
              help="Anchors (repeatable: each spec is compared as its own context).")
@click.option("--model", "models", multiple=True, metavar="NAME[,NAME...]",
              help=f"Geometries to compare (repeatable or comma list) from {', '.join(model_names(builtin=True))} "
                   "or an installed plug-in; "
                   "default softmax,cosine.")
@_model_options("--param", "--model-param")
@click.option("-k", "k", type=click.IntRange(min=1), default=8, show_default=True, help="Neighbours per query.")
@click.option("--encoder", default=None, metavar="SPEC", help=_ENCODER_HELP)
@click.option("--label", "label_columns", multiple=True, metavar="COLUMN",
              help="Metadata column whose shared values mark a neighbour as relevant (repeatable; the first "
                   "gives the green border; default: 'label' when the collection has it).")
@click.option("--include-self", is_flag=True, help="Keep a --query-row/--query-id item in its own results.")
@click.option("--asymmetric", is_flag=True, help="Rank by d(q‖g) instead of the symmetrized divergence.")
@click.option("--title", default="Neighbours under each geometry", show_default=True, help="Report title.")
@click.option("--png/--no-png", default=True, show_default=True, help="Also draw grid.png (needs matplotlib).")
@click.option("--out", "out_dir", default="report", show_default=True, type=click.Path(file_okay=False),
              help="Report folder.")
@click.option("--device", default=None, help="Torch device for the encoder and the search.")
def compare(collection, query_refs, query_texts, query_images, anchor_specs, models, tau, components, rank, seed,
            model_params, k, encoder, label_columns, include_self, asymmetric, title, png, out_dir, device) -> None:
    """Neighbours of queries under several geometries side by side, written as an HTML report.

    Every anchor model (--model) is fitted to every --anchors spec; cosine appears once,
    as it takes no anchors. Writes OUT/index.html (and OUT/grid.png) and prints the path
    of the HTML page.

    Example:

    \b
      anchordiv compare coll/ --query-text "a red car" --query-id 3 \\
          --anchors anchors.yaml:object --anchors anchors.yaml:style \\
          --model softmax,latent_gaussian,cosine -k 6 --out report/
    """
    import numpy as np

    from . import report

    names = _split_models(models, default="softmax,cosine")
    params = _check_model_options(names, tau, components, rank, seed, model_params)
    if any(m in _anchor_models() for m in names) and not anchor_specs:
        raise click.UsageError(f"--model {','.join(m for m in names if m in _anchor_models())} needs --anchors")
    coll = _load_collection(collection)
    enc = _collection_encoder(coll, encoder, device)
    anchor_list = _resolve_anchor_options(anchor_specs, enc)
    t = _default_tau(tau, coll, [a[2] for a in anchor_list], enc, names)
    geometries: dict[str, Any] = {}
    for name in names:
        if name in _anchor_models():
            for spec, aset, _ in anchor_list:
                key = name if len(anchor_list) == 1 else f"{name} · {spec}"
                label = f"{name} · {spec} ({len(aset)} anchors)"
                geom = _build_model(name, _anchors_to(aset, device), t, params)
                geometries[key] = report.ReportGeometry(geom, label=label, anchors=aset)
        else:
            geometries[name] = report.ReportGeometry(_build_model(name, None, t, params),
                                                     label=f"{name} (no anchors)")
    queries = _gather_queries(coll, query_refs, query_texts, query_images, enc, coll.dim)
    meta = coll.metadata
    if label_columns:
        if meta is None:
            raise click.BadParameter("the collection has no metadata columns", param_hint="--label")
        missing = [c for c in label_columns if c not in meta.columns]
        if missing:
            raise click.BadParameter(f"column {missing[0]!r} is not in the collection's metadata; "
                                     f"columns: {', '.join(map(str, meta.columns))}", param_hint="--label")
        label_cols = list(label_columns)
    else:
        label_cols = ["label"] if meta is not None and "label" in meta.columns else []
    for g in geometries.values():  # the first --label is each row's primary factor (green borders)
        g.factor = label_cols[0] if label_cols else None
    item_col = _item_column(coll)
    items = meta[item_col].astype(str).tolist() if item_col is not None else None
    query_items = [(items[r] if items is not None else None) if r is not None else lab
                   for r, lab in zip(queries.rows, queries.labels)]
    Q = np.stack(queries.vectors).astype(np.float32)
    Qd, Gd = _as_device(device, Q, coll.embeddings)
    info = {"collection": collection, "encoder": enc.name if enc else None,
            "anchors": ", ".join(anchor_specs) or None,
            "tau": t if any(m in _tau_models() for m in names) else None}
    result = report.compare(
        Qd, Gd, geometries, k=k, query_rows=queries.rows, exclude_self=not include_self,
        labels={c: meta[c].to_numpy() for c in label_cols} or None, items=items, query_items=query_items,
        query_titles=[_item_tag(coll, r) if r is not None else f"{kind} query"
                      for kind, r in zip(queries.kinds, queries.rows)],
        kind=coll.kind or "text", symmetric=not asymmetric,
        info={key: v for key, v in info.items() if v is not None},
        item_ids=[_item_id(coll, r) for r in range(len(coll))] if _has_ids(coll) else None,
    )
    paths = report.write_report(result, out_dir, title=title, png=png)
    click.echo(os.fspath(paths))


@cli.group(cls=_Group, context_settings=_CONTEXT)
def index() -> None:
    """Build and search saved indexes (exact, faiss, milvus, or a registered plug-in backend).

    Example:

    \b
      anchordiv index build coll/ --anchors anchors.yaml --model softmax \\
          --backend faiss --index-type hnsw --out coll.index
      anchordiv index search coll.index --query-text "a red car" -k 5
    """


@index.command("build")
@click.argument("collection", type=click.Path(exists=True))
@click.option("--anchors", "anchor_spec", default=None, metavar="PATH[:SETS]",
              help="Anchors file, or PATH:NAME[:P][,NAME[:P]...] for a mixture of its sets.")
@click.option("--model", "model_name", type=_ModelChoice(), default="softmax", show_default=True,
              help="Geometry (a registry name: built-in or an installed plug-in).")
@_model_options("--model-param")
@click.option("--backend", type=backend_choice(), default="exact", show_default=True,
              help="Index backend: a registered name, plug-ins included.")
@click.option("--index-type", default=None, help="faiss: flat, hnsw or ivf; milvus: FLAT, HNSW, IVF_FLAT, AUTOINDEX.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Further backend parameter, e.g. M=32, ef_search=128, nlist=256, uri=./gallery.db (repeatable).")
@click.option("--asymmetric", is_flag=True, help="Rank by d(q‖g) instead of the symmetrized divergence.")
@click.option("--encoder", default=None, metavar="SPEC", help=_ENCODER_HELP)
@click.option("--device", default=None, help="Torch device for the encoder and the model.")
@click.option("--out", "out_path", required=True, type=click.Path(dir_okay=False), help="Index file to write.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Build on a local Dask cluster of this many worker processes (pip install 'dask[distributed]').")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Build on an existing Dask cluster, e.g. tcp://10.0.0.5:8786.")
def index_build(collection, anchor_spec, model_name, tau, components, rank, seed, model_params, backend, index_type,
                params, asymmetric, encoder, device, out_path, workers, scheduler) -> None:
    """Fit a geometry and store a collection in a saved index.

    The index keeps the fitted model and keys each vector by its row number in the
    collection; a small OUT.anchordiv.json next to it records the collection, encoder
    and anchors for 'index search', with the index's digest and a fingerprint of the
    collection that 'index search' checks. Milvus without --param uri=... uses a milvus-lite file OUT.milvus.db.

    Example:

    \b
      anchordiv index build coll/ --anchors anchors.yaml:object:0.7,style:0.3 \\
          --model softmax --backend faiss --index-type hnsw --out coll.index
    """
    from .index import build_index

    own = _check_model_options([model_name], tau, components, rank, seed, model_params, "--model-param")
    coll = _load_collection(collection)
    enc = _collection_encoder(coll, encoder, device)
    if model_name in _anchor_models() and anchor_spec is None:
        raise click.UsageError(f"--model {model_name} needs --anchors")
    anchor_list = _resolve_anchor_options([anchor_spec], enc) if anchor_spec else []
    t = _default_tau(tau, coll, [a[2] for a in anchor_list], enc, [model_name])
    model = _build_model(model_name, _anchors_to(anchor_list[0][1] if anchor_list else None, device), t, own)
    kwargs = _parse_params(params)
    backend_cls = backend_class(backend)
    if index_type is not None:
        if "index_type" not in backend_cls.DEFAULTS:
            raise click.UsageError(f"--index-type does not apply to the {backend} backend")
        kwargs["index_type"] = index_type
    kwargs = {**backend_cls.file_params(os.fspath(out_path)), **kwargs}
    import numpy as np

    if workers is not None and scheduler is not None:
        raise click.UsageError("pass either --workers (a local Dask cluster) or --scheduler (an existing one)")
    with _dask_client(workers, scheduler) as client:
        source = collection if Path(collection).is_dir() or str(collection).lower().endswith(".npy") else coll
        idx = build_index(model, source, backend, symmetric=not asymmetric, client=client, **kwargs)
    recall = None
    if not backend_cls.tags().exact:  # how well the approximate index keeps its promise, on a sample of the rows
        rows = np.random.default_rng(0).choice(len(coll), size=min(RECALL_SAMPLE, len(coll)), replace=False)
        (sample,) = _as_device(device, np.asarray(coll.embeddings[np.sort(rows)], dtype=np.float32))
        recall = idx.recall(sample, k=min(10, len(idx)))
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    digest = idx.save(out_path)
    meta = {"collection": os.path.abspath(collection), "encoder": enc.name if enc else None,
            "model": model_name, "anchors": anchor_spec, "tau": t if model_name in _tau_models() else None,
            "backend": backend, "n": len(idx), "recall@10": recall,
            "index_sha256": digest, "collection_fingerprint": coll.fingerprint()}
    _write_index_meta(out_path, meta)
    click.echo(f"Indexed {len(idx)} vectors of {collection} under {model_name} ({backend}) into {out_path}")
    if recall is not None:
        click.echo(f"recall@10 against exact search on {min(RECALL_SAMPLE, len(coll))} sampled rows: {recall:.3f}")
        if recall < RECALL_WARNING:
            warnings.warn(f"recall@10 is {recall:.3f} < {RECALL_WARNING}: raise --param ef_search=... (hnsw), "
                          "nprobe=... (ivf) or shortlist=..., or use --backend exact")


@contextlib.contextmanager
def _dask_client(workers: int | None, scheduler: str | None):
    """A ``distributed.Client`` of a local cluster of ``workers`` processes (on 127.0.0.1) or of
    ``scheduler``; None when neither is given."""
    if workers is None and scheduler is None:
        yield None
        return
    try:
        import distributed
    except ImportError:
        raise click.UsageError("--workers and --scheduler need Dask: pip install 'dask[distributed]'") from None
    if scheduler is not None:
        with distributed.Client(scheduler) as client:
            yield client
        return
    with distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        yield client


@index.command("search")
@click.argument("index_path", metavar="INDEX", type=click.Path(exists=True, dir_okay=False))
@_query_options
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True, help="Neighbours per query.")
@click.option("--collection", default=None, type=click.Path(exists=True),
              help="Collection for metadata, --query-id and --filter (default: the one the index was built from).")
@click.option("--encoder", default=None, metavar="SPEC", help="Encoder for text/image queries (default: the index's).")
@click.option("--include-self", is_flag=True, help="Keep a --query-row/--query-id item in its own results.")
@click.option("--device", default=None, help="Torch device for the encoder and the search.")
@click.option("--param", "params", multiple=True, metavar="KEY=VALUE",
              help="Run-time index parameter, e.g. ef_search=256, shortlist=200, or for milvus uri=... and "
                   "token=... (a token needs uri= in the same command; repeatable).")
@click.option("--filter", "filter_ids", default=None, metavar="IDS|EXPR",
              help="Search only the items with these values of the collection's 'id' column: a,b,c or @ids.txt "
                   "(one per line); for milvus also a boolean expression on the collection's fields, e.g. "
                   "'label == \"cat\"'.")
@click.option("--filter-rows", "filter_rows", default=None, metavar="ROWS",
              help="Search only these row numbers (0-based) of the collection: 3,17,42 or @rows.txt.")
@_FORMAT_OPTION
def index_search(index_path, query_refs, query_texts, query_images, k, collection, encoder, include_self, device,
                 params, filter_ids, filter_rows, fmt) -> None:
    """Search a saved index.

    A Milvus token is sent only to a uri named on the same command line
    (--param uri=... --param token=...), never to the uri stored in the file.

    An id is a value of the collection's 'id' column (--query-id, --filter, the 'id'
    of each result); a row is a 0-based row number (--query-row, --filter-rows, 'row').

    Example:

    \b
      anchordiv index search coll.index --query-text "a red car" -k 5
      anchordiv index search coll.index --query-id 12 --filter 3,17,42 --format csv
      anchordiv index search coll.index --query-row 0 --filter-rows @rows.txt
    """
    coll = _load_collection(collection) if collection else None
    _search_index(index_path, coll, query_refs, query_texts, query_images, k, encoder, include_self, device, fmt,
                  _parse_params(params), filter_ids, filter_rows)


@cli.command(short_help="Run the scene demo (AUPRC table and report).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Report folder.  [default: demo-report, or emoji-demo-report with --images]")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the collection and the query choice.")
@click.option("--n", "n", type=click.IntRange(min=2), default=360, show_default=True,
              help="Scene descriptions in the demo collection (smaller is faster).")
@click.option("-k", "k", type=click.IntRange(min=1), default=8, show_default=True,
              help="Neighbours shown per query in the report.")
@click.option("--queries", "n_queries", type=click.IntRange(min=1), default=3, show_default=True,
              help="Queries shown in the report.")
@click.option("--encoder", default="minilm", show_default=True, metavar="SPEC", help="Encoder spec.")
@click.option("--device", default=None, help="Torch device of the encoder.")
@click.option("--serve", "serve", is_flag=True, help="Serve the demo collection on a local web page instead.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port of --serve.")
@click.option("--images", "images", is_flag=True,
              help="Run the emoji demo instead: held-out emoji pictures under object and style anchors "
                   "(the committed emoji CLIP; pictures from $ANCHORDIV_EMOJI or ~/.cache/anchordiv/emoji).")
def demo(out_dir: str, seed: int, n: int, k: int, n_queries: int, encoder: str, device: str | None,
         serve: bool, port: int, images: bool) -> None:
    """Run the scene demo: mean AUPRC of every geometry on every factor, and a neighbour report.

    Generates N scene descriptions varying a dog breed, a place and a piece of clothing,
    embeds them, fits cosine, image-text inversion, softmax and Gaussian geometries for
    anchor sets naming each factor, prints the AUPRC table and writes OUT/index.html,
    OUT/grid.png and OUT/auprc.{md,csv}.

    Example:

    \b
      anchordiv demo --out demo-report/ --seed 0
      anchordiv demo --n 60 -k 4 --out /tmp/quick-demo/
      anchordiv demo --serve --port 8000     # the web page at http://127.0.0.1:8000/
      anchordiv demo --images --out /tmp/emoji-demo/   # emoji: object vs style anchors
    """
    from . import demo as demo_module

    if out_dir is None:
        out_dir = "emoji-demo-report" if images else "demo-report"
    if images:
        from . import image_demo

        return image_demo.cli_demo(out_dir=out_dir, seed=seed, k=k, n_queries=n_queries, serve=serve, port=port)

    if serve:
        from .serve.cli import serve_demo

        return serve_demo(n=n, seed=seed, encoder=LazyEncoder(encoder, device), port=port)

    if k >= n:
        raise click.BadParameter(f"{k} must be below --n {n} (a query's own text is excluded)", param_hint="-k")
    result = demo_module.run_demo(out_dir=out_dir, encoder=LazyEncoder(encoder, device), seed=seed, n=n, k=k,
                                  n_queries=n_queries, echo=None)
    click.echo(f"Mean AUPRC on {n} scene descriptions (encoder {encoder}; relevance = same factor value):")
    click.echo(demo_module.format_table(result.auprc))
    tables = getattr(result, "table_paths", None) or {}
    if tables:
        click.echo("tables: " + ", ".join(str(p) for p in tables.values()))
    click.echo(f"report: {result.report_path}")


def _register_eval() -> None:
    from .experiments.cli import eval_command

    cli.add_command(eval_command())


def _register_serve() -> None:
    from .serve.cli import serve_command

    cli.add_command(serve_command)


_register_eval()
_register_serve()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``anchordiv`` console script.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default: ``sys.argv[1:]``).
    """
    cli.main(args=list(argv) if argv is not None else None, prog_name="anchordiv")


if __name__ == "__main__":  # pragma: no cover
    main()
