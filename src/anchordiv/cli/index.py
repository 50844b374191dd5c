"""``anchordiv index``: build and search a saved index, and its sidecar file."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any

import click

from .._cli_values import parse_params as _parse_params
from ..encoders import LazyEncoder
from ..index import backend_choice, backend_class
from .common import (
    _CONTEXT,
    _ENCODER_HELP,
    _FORMAT_OPTION,
    INDEX_META_SUFFIX,
    RECALL_SAMPLE,
    RECALL_WARNING,
    _anchors_to,
    _as_device,
    _build_model,
    _check_k,
    _check_model_options,
    _check_rows,
    _cluster_options,
    _collection_encoder,
    _dask_client,
    _default_tau,
    _emit,
    _gather_queries,
    _Group,
    _has_ids,
    _k_left,
    _load_collection,
    _model_options,
    _ModelChoice,
    _one_anchor_set,
    _own_rows,
    _query_options,
    _results,
    _rows_of_ids,
    _shorten,
    _tau_models,
    _to_numpy,
    _written_anchor_options,
)


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
    from .._util import atomic_write

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

    from ..io.collections import fingerprint_mismatch

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

    from ..index import Index

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


@click.group(cls=_Group, context_settings=_CONTEXT)
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
@_written_anchor_options
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
@_cluster_options("Build")
def index_build(collection, anchor_spec, anchor_texts, anchor_file, model_name, tau, components, rank, seed,
                model_params, backend, index_type, params, asymmetric, encoder, device, out_path, workers,
                scheduler) -> None:
    """Fit a geometry and store a collection in a saved index.

    The index keeps the fitted model and keys each vector by its row number in the
    collection; a small OUT.anchordiv.json next to it records the collection, encoder
    and anchors for 'index search', with the index's digest and a fingerprint of the
    collection that 'index search' checks. Milvus without --param uri=... uses a milvus-lite file OUT.milvus.db.
    Anchors written by hand (--anchor TEXT, --anchor-file FILE) replace --anchors; the
    sidecar records their phrases.

    Example:

    \b
      anchordiv index build coll/ --anchors anchors.yaml:object:0.7,style:0.3 \\
          --model softmax --backend faiss --index-type hnsw --out coll.index
      anchordiv index build coll/ --anchor-file breeds.txt --model softmax --out breeds.index
    """
    from ..index import build_index

    own = _check_model_options([model_name], tau, components, rank, seed, model_params, "--model-param")
    coll = _load_collection(collection)
    enc = _collection_encoder(coll, encoder, device)
    chosen = _one_anchor_set(anchor_spec, anchor_texts, anchor_file, enc, model_name)
    t = _default_tau(tau, coll, [chosen[2]] if chosen else [], enc, [model_name])
    model = _build_model(model_name, _anchors_to(chosen[1] if chosen else None, device), t, own)
    kwargs = _parse_params(params)
    backend_cls = backend_class(backend)
    if index_type is not None:
        if "index_type" not in backend_cls.DEFAULTS:
            raise click.UsageError(f"--index-type does not apply to the {backend} backend")
        kwargs["index_type"] = index_type
    kwargs = {**backend_cls.file_params(os.fspath(out_path)), **kwargs}
    import numpy as np

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
    written = list(chosen[1].texts) if chosen and anchor_spec is None else None
    meta = {"collection": os.path.abspath(collection), "encoder": enc.name if enc else None, "model": model_name,
            "anchors": _shorten("written: " + " | ".join(written), 200) if written else anchor_spec,
            **({"anchor_texts": written} if written else {}), "tau": t if model_name in _tau_models() else None,
            "backend": backend, "n": len(idx), "recall@10": recall,
            "index_sha256": digest, "collection_fingerprint": coll.fingerprint()}
    _write_index_meta(out_path, meta)
    click.echo(f"Indexed {len(idx)} vectors of {collection} under {model_name} ({backend}) into {out_path}")
    if recall is not None:
        click.echo(f"recall@10 against exact search on {min(RECALL_SAMPLE, len(coll))} sampled rows: {recall:.3f}")
        if recall < RECALL_WARNING:
            warnings.warn(f"recall@10 is {recall:.3f} < {RECALL_WARNING}: raise --param ef_search=... (hnsw), "
                          "nprobe=... (ivf) or shortlist=..., or use --backend exact")


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
