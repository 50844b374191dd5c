"""The scene demo as a service: ``anchordiv demo --serve``."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

#: Label columns of the demo collection.
DEMO_LABELS = ["breed", "place", "clothing"]


def build_demo_service(n: int = 360, seed: int = 0, encoder: Any = "minilm", design: str = "prompt") -> Any:
    """A :class:`~anchordiv.serve.service.Service` over the scene demo collection.

    The ``n`` scene descriptions of :func:`anchordiv.demo.make_scene_collection` and the
    anchor sets of :func:`anchordiv.demo.scene_anchor_sets` (breeds, places, clothing),
    embedded with ``encoder`` (a spec or a loaded encoder).
    """
    from ..anchorsfile import EmbeddedAnchors
    from ..anchors import AnchorSet
    from ..demo import make_scene_collection, scene_anchor_sets
    from ..io import Collection
    from .service import Service

    if isinstance(encoder, str):
        from .. import encoders

        encoder = encoders.load(encoder)
    texts, labels = make_scene_collection(n, seed)
    X = np.asarray(encoder.encode_text(texts, progress=False), dtype=np.float32)
    phrases = scene_anchor_sets(design)
    sets, flat = {}, [p for ps in phrases.values() for p in ps]
    E = np.asarray(encoder.encode_text(flat, progress=False), dtype=np.float32)
    start = 0
    for name, ps in phrases.items():
        sets[name] = AnchorSet(E[start:start + len(ps)], texts=ps)
        start += len(ps)
    tau = float(encoder.tau)
    meta = labels[DEMO_LABELS].copy()
    meta.insert(0, "text", texts)
    coll = Collection(embeddings=X, metadata=meta, kind="text", tau=tau, encoder=getattr(encoder, "name", None),
                      path=f"scene demo (n={n}, seed={seed})")
    anchors = EmbeddedAnchors(path=Path("scene-demo-anchors"), sets=sets, mix={k: 1.0 for k in sets},
                              encoder=getattr(encoder, "name", "encoder"), tau=tau, n_phrases=len(flat))
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
