"""The ``anchordiv serve`` command and the helpers that run a service on a port."""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import Any

import click

from .._cli_values import WRITTEN, cluster_options, dask_client, written_anchor_options, written_anchors
from .server import DEFAULT_HOST, PortError, bind, is_loopback


def check_deps() -> None:
    """A one-line :class:`click.ClickException` unless the ``serve`` extra is installed."""
    try:
        import fastapi  # noqa: F401
        import multipart  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(f"serving needs {exc.name}: pip install 'anchordiv[serve]'") from None


def bind_port(host: str, port: int) -> Any:
    """The bound socket, or a one-line :class:`click.ClickException` (a busy port, say)."""
    try:
        return bind(host, port)
    except PortError as exc:
        raise click.ClickException(str(exc)) from None


def run_service(service: Any, host: str = DEFAULT_HOST, port: int = 8000, cors_origins: list[str] | None = None,
                echo: Any = click.echo, sock: Any = None, on_started: Any = None) -> None:
    """Serve ``service`` on ``host:port`` (or the socket ``sock`` from :func:`bind_port`) until interrupted.

    The port is bound before anything says it is served: a busy port is a one-line error.
    ``on_started`` runs in a background thread once the server accepts connections.
    """
    from .app import create_app
    from .server import serve

    sock = bind_port(host, port) if sock is None else sock
    if not is_loopback(host):
        warnings.warn(f"binding {host}: the service is reachable from other machines and has no authentication")
    app = create_app(service, loopback_only=is_loopback(host), cors_origins=cors_origins)
    shown = f"[{host}]" if ":" in host else host
    echo(f"Serving {service.title} on http://{shown}:{port}/ (Ctrl-C to stop)")
    serve(app, host=host, port=port, sock=sock, on_started=on_started)
    echo("Stopped.")


def _index_option(value: str) -> tuple[str, str]:
    name, sep, path = value.partition("=")
    if not sep:
        name, path = Path(value).stem, value
    if not name or not os.path.isfile(path):
        raise click.BadParameter(f"{value!r}: give PATH or NAME=PATH of an index file (anchordiv index build)",
                                 param_hint="--index")
    return name, path


def service_anchors(anchors_file: str | None, texts: Any, file: str | None, encoder: Any) -> Any:
    """The service's :class:`~anchordiv.anchorsfile.EmbeddedAnchors`: the sets of ``anchors_file`` and the
    ``--anchor``/``--anchor-file`` anchors as the set ``written``; None without either."""
    from dataclasses import replace

    from ..anchorsfile import EmbeddedAnchors, embed_anchors

    anchors = None
    if anchors_file is not None:
        if encoder is None:
            raise click.UsageError("--anchors needs an encoder: pass --encoder SPEC (the collection records none)")
        anchors = embed_anchors(anchors_file, encoder)
        if WRITTEN in anchors.sets and (texts or file is not None):
            raise click.BadParameter(f"{anchors_file!r} already has a set named {WRITTEN!r}; rename that set to "
                                     "serve it beside the anchors written here", param_hint="--anchor")
    written = written_anchors(texts, file, encoder)
    if written is None:
        return anchors
    if anchors is None:
        return EmbeddedAnchors(path=Path("<written>"), sets={WRITTEN: written[1]}, mix={WRITTEN: 1.0},
                               encoder=encoder.name, tau=written[2], n_phrases=len(written[1]))
    return replace(anchors, sets={**anchors.sets, WRITTEN: written[1]}, mix={**anchors.mix, WRITTEN: 1.0},
                   n_phrases=anchors.n_phrases + len(written[1]))


def open_collection(path: str) -> Any:
    """The collection with its shards memory-mapped as stored (float16 stays float16): opening it reads
    the file headers and the metadata, so start-up does not grow with the number of rows. Rows are
    checked for NaN and inf block by block as contexts are built."""
    from ..io import load_collection

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="mmap=True")
        return load_collection(path, mmap=True, dtype=None, check_finite=False)


def state_folder(path: str, collection: Any) -> Path:
    """Where the contexts written for this collection are kept by default:
    ``$XDG_CACHE_HOME/anchordiv/serve/<digest of its path and fingerprint>`` (``~/.cache`` without it)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anchordiv" / "serve"
    digest = hashlib.sha256(f"{os.path.abspath(path)}\0{collection.fingerprint()}".encode()).hexdigest()[:16]
    return root / digest


@click.command("serve", short_help="Serve a collection over HTTP: JSON API, clip-retrieval endpoints, web page.")
@click.argument("collection", type=click.Path(exists=True))
@click.option("--anchors", "anchors_file", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Anchors file (text or YAML with named sets); its sets become the page's contexts.")
@written_anchor_options
@click.option("--index", "index_specs", multiple=True, metavar="[NAME=]PATH",
              help="A saved index over the collection (anchordiv index build), searchable by NAME (repeatable).")
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to bind (loopback by default).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="TCP port.")
@click.option("--encoder", default=None, metavar="SPEC",
              help="Encoder for text/image queries and anchors; default: the collection's.")
@click.option("--model", "default_model", default="softmax", show_default=True,
              help="Geometry of the default context.")
@click.option("--context", "default_context", default=None, metavar="SETS",
              help="Anchor sets of the default context, e.g. 'style' or 'object:0.7,style:0.3' (at most two); "
                   "default: the file's first set.")
@click.option("--tau", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Default temperature; default from the collection's manifest, else the encoder.")
@click.option("--label", "label_columns", multiple=True, metavar="COLUMN",
              help="Metadata column shown as label chips (repeatable; default: 'label' or the categorical columns).")
@click.option("--cache-mb", type=click.IntRange(min=1), default=1024, show_default=True,
              help="Memory bound of the cache of fitted contexts (models and key features).")
@click.option("--max-contexts", type=click.IntRange(min=1), default=32, show_default=True,
              help="Most contexts held at once, and most contexts written with POST /api/contexts kept.")
@click.option("--state", "state_dir", default=None, type=click.Path(file_okay=False),
              help="Folder keeping the contexts written with POST /api/contexts across restarts "
                   "(default: one per collection under ~/.cache/anchordiv/serve).")
@click.option("--build-wait", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds a search waits for its context's build before answering 503 with the progress.")
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="Allow a browser page from ORIGIN (e.g. a clip-retrieval front end) to call the API (repeatable).")
@click.option("--device", default=None, help="Torch device of the encoder.")
@cluster_options("Build and search the contexts")
def serve_command(collection, anchors_file, anchor_texts, anchor_file, index_specs, host, port, encoder, default_model,
                  default_context, tau, label_columns, cache_mb, max_contexts, state_dir, build_wait, cors_origins,
                  device, workers, scheduler) -> None:
    """Serve COLLECTION: a web page where anchors steer similarity, and a JSON API.

    The page (at /) searches by text, by item (click a result) or by an uploaded image
    (image encoders), under any geometry and any mixture of the anchor sets, and shows
    two or three contexts side by side. The API: GET /api/contexts, POST /api/search,
    GET /api/items/ID, GET /api/thumb/ID (ID: the collection's 'id' column, else the row
    number); clip-retrieval's GET /indices-list, POST /knn-service and POST /metadata.
    Binds 127.0.0.1 unless --host says otherwise. Anchors written by hand (--anchor TEXT,
    --anchor-file FILE) are one more set, 'written'; anchors written on the page or with
    POST /api/contexts make contexts built in the background, kept in --state. The collection
    is memory-mapped: start-up does not grow with its size. With --workers N (a local Dask
    cluster) or --scheduler ADDRESS, the contexts are built and searched on the cluster's
    workers, each mapping its shards; results equal one process's.

    Example:

    \b
      anchordiv serve coll/ --anchors anchors.yaml --port 8000
      anchordiv serve coll/ --anchors anchors.yaml --anchor-file breeds.txt --context written
      curl -s localhost:8000/api/search -H 'Content-Type: application/json' \\
          -d '{"text": "a red car", "context": "softmax:object:0.7,style:0.3", "k": 5}'
    """
    check_deps()
    sock = bind_port(host, port)
    from ..encoders import LazyEncoder
    from ..index import Index
    from .service import Service

    coll = open_collection(collection)
    spec = encoder or coll.encoder
    enc = LazyEncoder(spec, device) if spec else None
    if enc is not None and encoder and coll.encoder and encoder != coll.encoder:
        warnings.warn(f"--encoder {encoder!r} differs from the collection's encoder {coll.encoder!r}")
    anchors = service_anchors(anchors_file, anchor_texts, anchor_file, enc)
    if enc is not None:
        enc.loaded  # load now, so the first query is fast
    indexes = {}
    for value in index_specs:
        name, path = _index_option(value)
        if name in indexes:
            raise click.BadParameter(f"two indexes are named {name!r}", param_hint="--index")
        indexes[name] = Index.load(path, device=device)
    with dask_client(workers, scheduler) as client:
        try:
            service = Service(coll, anchors, enc, indexes=indexes, tau=tau, default_model=default_model,
                              default_context=default_context, label_columns=list(label_columns) or None,
                              cache_bytes=cache_mb << 20, max_contexts=max_contexts, build_wait=build_wait,
                              state=state_dir or state_folder(collection, coll), client=client)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        run_service(service, host=host, port=port, cors_origins=list(cors_origins) or None, sock=sock)

