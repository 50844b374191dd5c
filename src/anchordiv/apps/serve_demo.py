"""The scene demo as a service: ``anchordiv demo --serve``."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..serve.server import DEFAULT_HOST

#: Label columns of the demo collection.
DEMO_LABELS = ["breed", "place", "clothing"]
_CACHE_FORMAT = "anchordiv.serve-demo-embeddings"
_CACHE_VERSION = 1


def demo_cache_dir() -> Path:
    """Where ``anchordiv demo --serve`` caches its embeddings: ``~/.cache/anchordiv/serve-demo``."""
    return Path.home() / ".cache" / "anchordiv" / "serve-demo"


def _digest(encoder_name: str, texts: list[str], phrases: list[str]) -> str:
    """sha256 of the encoder spec and every text embedded (the cache key)."""
    blob = json.dumps({"format": _CACHE_FORMAT, "version": _CACHE_VERSION, "encoder": encoder_name,
                       "texts": texts, "phrases": phrases}, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _read_cache(file: Path, digest: str) -> dict | None:
    """The cached arrays when ``file`` holds embeddings for ``digest``, else None."""
    if not file.is_file():
        return None
    try:
        with np.load(file, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        ok = str(data["format"]) == _CACHE_FORMAT and str(data["sha256"]) == digest
    except Exception:  # a corrupt or foreign file is recomputed
        return None
    return data if ok else None


def build_demo_service(n: int = 360, seed: int = 0, encoder: Any = "minilm", design: str = "prompt",
                       cache: str | os.PathLike | None = None, echo: Callable[[str], Any] | None = None) -> Any:
    """A :class:`~anchordiv.serve.service.Service` over the scene demo collection.

    The ``n`` scene descriptions of :func:`anchordiv.apps.demo.make_scene_collection` and the
    anchor sets of :func:`anchordiv.apps.demo.scene_anchor_sets` (breeds, places, clothing),
    embedded with ``encoder`` (a spec or an encoder).

    With ``cache`` (a folder), the embeddings and τ are kept in
    ``cache/scene-ENCODER-SHA.npz``, keyed by sha256(encoder spec, texts, phrases) and written
    atomically; a later call with the same key reads them and does not load the encoder
    (a :class:`~anchordiv.encoders.LazyEncoder` loads it at the first text query).
    """
    from .._util import atomic_write
    from ..anchorsfile import EmbeddedAnchors, encoder_slug
    from .demo import make_scene_collection, scene_anchor_sets, split_anchor_sets
    from ..io import Collection
    from ..serve.service import Service

    say = echo or (lambda msg: None)
    if isinstance(encoder, str):
        from ..encoders import LazyEncoder

        encoder = LazyEncoder(encoder)
    name = getattr(encoder, "name", None)
    texts, labels = make_scene_collection(n, seed)
    phrases = scene_anchor_sets(design)
    flat = [p for ps in phrases.values() for p in ps]
    data, file = None, None
    if cache is not None and isinstance(name, str) and name:
        digest = _digest(name, texts, flat)
        file = Path(cache) / f"scene-{encoder_slug(name)}-{digest[:16]}.npz"
        data = _read_cache(file, digest)
    if data is not None:
        say(f"Embeddings of {n} scene descriptions and the anchor sets from the cache {file}")
        X, E, tau = data["X"], data["E"], float(data["tau"])
    else:
        say(f"Embedding {n} scene descriptions and the anchor sets ...")
        X = np.asarray(encoder.encode_text(texts, progress=False), dtype=np.float32)
        E = np.asarray(encoder.encode_text(flat, progress=False), dtype=np.float32)
        tau = float(encoder.tau)
        if file is not None:
            arrays = {"format": np.array(_CACHE_FORMAT), "sha256": np.array(digest), "encoder": np.array(name),
                      "X": X, "E": E, "tau": np.array(tau)}
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(file, lambda fh: np.savez(fh, **arrays), advice="remove old files from the cache")
                say(f"Cached them in {file}")
            except OSError as exc:
                warnings.warn(f"could not write the embedding cache {str(file)!r} ({exc}); continuing without it",
                              stacklevel=2)
    sets = split_anchor_sets(E, phrases)
    meta = labels[DEMO_LABELS].copy()
    meta.insert(0, "text", texts)
    coll = Collection(embeddings=X, metadata=meta, kind="text", tau=tau, encoder=name,
                      path=f"scene demo (n={n}, seed={seed})")
    anchors = EmbeddedAnchors(path=Path("scene-demo-anchors"), sets=sets, mix={k: 1.0 for k in sets},
                              encoder=name or "encoder", tau=tau, n_phrases=len(flat))
    return Service(coll, anchors, encoder, label_columns=DEMO_LABELS, default_model="softmax",
                   title=f"anchordiv · scene demo ({n} descriptions)")


@functools.lru_cache(maxsize=4)
def demo_service(n: int = 360, seed: int = 0, encoder: str = "minilm") -> Any:
    """:func:`build_demo_service` for an encoder spec, built once per process (tests, benchmarks).

    The encoder is the command line's process-wide :class:`~anchordiv.encoders.LazyEncoder`, so a
    process that has loaded it already does not load it again.
    """
    from ..encoders import LazyEncoder

    return build_demo_service(n, seed, LazyEncoder(encoder))


def serve_demo(n: int = 360, seed: int = 0, encoder: Any = "minilm", host: str = DEFAULT_HOST,
               port: int = 8000) -> None:
    """Build the scene demo's service and serve it (``anchordiv demo --serve``).

    The embeddings are cached in :func:`demo_cache_dir`; with a warm cache the encoder loads in
    a background thread once the server has started.
    """
    import click

    from ..serve.cli import bind_port, check_deps, run_service

    check_deps()
    sock = bind_port(host, port)
    service = build_demo_service(n=n, seed=seed, encoder=encoder, cache=demo_cache_dir(),
                                 echo=lambda msg: click.echo(msg))
    run_service(service, host=host, port=port, sock=sock, on_started=service.warm_up)
