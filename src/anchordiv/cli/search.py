"""``anchordiv search`` and ``anchordiv compare``: neighbours under one or several geometries."""

from __future__ import annotations

import os
from typing import Any

import click

from ..models import model_names
from .common import (
    _ENCODER_HELP,
    _FORMAT_OPTION,
    _anchor_models,
    _anchors_to,
    _as_device,
    _build_model,
    _check_k,
    _check_model_options,
    _cluster_options,
    _collection_encoder,
    _dask_client,
    _default_tau,
    _emit,
    _gather_queries,
    _has_ids,
    _item_column,
    _item_id,
    _item_tag,
    _k_left,
    _load_collection,
    _model_options,
    _ModelChoice,
    _one_anchor_set,
    _own_rows,
    _query_options,
    _resolve_anchor_options,
    _results,
    _split_models,
    _tau_models,
    _to_numpy,
    _written_anchor_options,
    _written_anchors,
)
from .index import _search_index


@click.command(short_help="Nearest neighbours under one anchor geometry.")
@click.argument("collection", type=click.Path(exists=True))
@_query_options
@click.option("--anchors", "anchor_spec", default=None, metavar="PATH[:SETS]",
              help="Anchors file, or PATH:NAME[:P][,NAME[:P]...] for a mixture of its sets.")
@_written_anchor_options
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
@_cluster_options("Build the context and search it")
@_FORMAT_OPTION
def search(collection: str, query_refs, query_texts, query_images, anchor_spec, anchor_texts, anchor_file, model_name,
           tau, components, rank, seed, model_params, k, encoder, index_path, asymmetric, include_self, device,
           workers, scheduler, fmt) -> None:
    """Nearest neighbours of queries in a collection under one anchor geometry.

    Queries are items of the collection (--query-row N, its row number; --query-id ID,
    its value in the 'id' column), texts (--query-text) or images (--query-image),
    embedded with the encoder recorded in the collection (or --encoder). Each result
    shows the item's id (when the collection has an 'id' column) and its row. The
    temperature defaults to the collection's (the encoder's) tau. Anchors come from
    --anchors, or are written by hand with --anchor TEXT and --anchor-file FILE (one set).
    With --workers N or --scheduler ADDRESS the context is built and searched on a Dask
    cluster, each worker mapping its shards of the collection; the results are the same.

    Example:

    \b
      anchordiv search coll/ --anchors anchors.yaml:style --model softmax \\
          --query-text "a watercolor of a harbour" -k 5
      anchordiv search coll/ --anchor "a photo of a husky" --anchor "a photo of a beagle" \\
          --query-text "a dog on the beach" -k 5
      anchordiv search coll/ --anchors anchors.yaml:object:0.7,style:0.3 \\
          --model latent_gaussian --rank 8 --query-id 12 --format json
      anchordiv search coll/ --anchors anchors.yaml --model gmm --param reg_covar=1e-4 --query-row 0
    """
    clustered = workers is not None or scheduler is not None
    coll = _load_collection(collection, mmap=clustered)
    if index_path is not None:
        ctx = click.get_current_context()
        explicit = ctx.get_parameter_source("model_name") == click.core.ParameterSource.COMMANDLINE
        given = [o for o, v in (("--anchors", anchor_spec), ("--anchor", anchor_texts or None),
                                ("--anchor-file", anchor_file), ("--model", model_name if explicit else None),
                                ("--tau", tau), ("--components", components), ("--rank", rank),
                                ("--seed", seed), ("--param", model_params or None),
                                ("--asymmetric", asymmetric or None)) if v is not None]
        given += [o for o, v in (("--workers", workers), ("--scheduler", scheduler)) if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} cannot be combined with --index (the index holds its model)")
        _search_index(index_path, coll, query_refs, query_texts, query_images, k, encoder, include_self, device, fmt)
        return
    params = _check_model_options([model_name], tau, components, rank, seed, model_params)
    enc = _collection_encoder(coll, encoder, device)
    chosen = _one_anchor_set(anchor_spec, anchor_texts, anchor_file, enc, model_name)
    anchor_label, anchor_set, anchor_tau = chosen if chosen is not None else (None, None, None)
    t = _default_tau(tau, coll, [anchor_tau] if chosen else [], enc, [model_name])
    model = _build_model(model_name, _anchors_to(anchor_set, device), t, params)
    queries = _gather_queries(coll, query_refs, query_texts, query_images, enc, coll.dim)
    import numpy as np

    Q = np.stack(queries.vectors).astype(np.float32)
    _check_k(k, len(coll))
    k_left, own = _k_left(k, len(coll), queries, include_self), _own_rows(queries, include_self)
    if clustered:
        dist, idx = _search_on_cluster(model, coll, Q, k_left, not asymmetric, own, workers, scheduler)
    else:
        Qd, Gd = _as_device(device, Q, coll.embeddings)
        dist, idx = model.search(Qd, Gd, k=k_left, symmetric=not asymmetric, exclude=own)
    results = _results(coll, queries, _to_numpy(dist), _to_numpy(idx))
    if anchor_set is not None and t is not None:
        _add_top_anchors(results, anchor_set, Q, t)
    _emit(results, fmt, {"collection": collection, "model": model_name, "anchors": anchor_label,
                         "tau": t if model_name in _tau_models() else None, "k": k}, ids=_has_ids(coll))


def _search_on_cluster(model: Any, coll: Any, Q: Any, k: int, symmetric: bool, own: Any, workers: int | None,
                       scheduler: str | None) -> tuple[Any, Any]:
    """The context built and searched on a Dask cluster (:class:`anchordiv.contexts.FeatureStore`)."""
    from ..contexts import context_store

    with _dask_client(workers, scheduler) as client:
        try:
            store = context_store(model, coll.embeddings, symmetric=symmetric, client=client)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        store.build()
        return store.search(Q, k=k, exclude=own)


def _add_top_anchors(results: list[dict], anchors: Any, Q: Any, tau: float, top: int = 3) -> None:
    """Each query's top anchors and their probabilities under the softmax over ``anchors``."""
    from ..diagnostics import explain

    ex = explain(anchors, Q, tau, top=top)
    for qi, res in enumerate(results):
        res["top_anchors"] = [{"anchor": a, "probability": p} for a, p in ex.top_anchors(qi)]
        res["effective_anchors"] = float(ex.effective_number[qi])


#: An id list of --filter: comma-separated values without spaces, quotes, brackets or comparison signs.
@click.command(short_help="Neighbours under several geometries, as an HTML report.")
@click.argument("collection", type=click.Path(exists=True))
@_query_options
@click.option("--anchors", "anchor_specs", multiple=True, metavar="PATH[:SETS]",
              help="Anchors (repeatable: each spec is compared as its own context).")
@_written_anchor_options
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
def compare(collection, query_refs, query_texts, query_images, anchor_specs, anchor_texts, anchor_file, models, tau,
            components, rank, seed, model_params, k, encoder, label_columns, include_self, asymmetric, title, png,
            out_dir, device) -> None:
    """Neighbours of queries under several geometries side by side, written as an HTML report.

    Every anchor model (--model) is fitted to every --anchors spec; cosine appears once,
    as it takes no anchors. Anchors written by hand (--anchor TEXT, --anchor-file FILE)
    form one more context, 'written'. Writes OUT/index.html (and OUT/grid.png) and prints
    the path of the HTML page.

    Example:

    \b
      anchordiv compare coll/ --query-text "a red car" --query-id 3 \\
          --anchors anchors.yaml:object --anchors anchors.yaml:style \\
          --model softmax,latent_gaussian,cosine -k 6 --out report/
      anchordiv compare coll/ --query-row 3 --anchors anchors.yaml:style \\
          --anchor "a red car" --anchor "a blue car" --model softmax,cosine --out report/
    """
    import numpy as np

    from .. import report

    names = _split_models(models, default="softmax,cosine")
    params = _check_model_options(names, tau, components, rank, seed, model_params)
    if any(m in _anchor_models() for m in names) and not (anchor_specs or anchor_texts or anchor_file is not None):
        raise click.UsageError(f"--model {','.join(m for m in names if m in _anchor_models())} needs --anchors, "
                               "--anchor or --anchor-file")
    coll = _load_collection(collection)
    enc = _collection_encoder(coll, encoder, device)
    written = _written_anchors(anchor_texts, anchor_file, enc)
    anchor_list = _resolve_anchor_options(anchor_specs, enc) + ([written] if written else [])
    t = _default_tau(tau, coll, [a[2] for a in anchor_list], enc, names)
    geometries: dict[str, Any] = {}
    for name in names:
        if name in _anchor_models():
            for j, (spec, aset, _) in enumerate(anchor_list):  # a written label counts its anchors already
                key = name if len(anchor_list) == 1 else f"{name} · {spec}"
                label = f"{name} · {spec}" + (f" ({len(aset)} anchors)" if j < len(anchor_specs) else "")
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
            "anchors": ", ".join(spec for spec, _, _ in anchor_list) or None,
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
