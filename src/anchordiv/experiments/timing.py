"""The timing worker of the ``runtime`` protocol (paper App. F.4, Table 4).

:func:`worker` times ``model.fit(anchors)`` followed by ``model.search(Q, G, k=10)`` for
one geometry and anchor count N on seeded synthetic vectors (:func:`make_data`), the
same data and parameters as the repository's ``benchmarks/bench_scaling.py``: d = 512,
τ = 0.01 (CLIP's logit scale 100), a GMM of 8 components.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable

import torch

#: Embedding dimension (CLIP ViT-B/32 and ViT-B/16).
DIM = 512
#: Temperature of every anchor model.
TAU = 0.01
#: Parameters beyond the temperature, by registry name.
MODEL_PARAMS = {"gmm": {"n_components": 8, "seed": 0}}


def params(model: str) -> dict:
    """The parameters of geometry ``model`` in the benchmark: τ where it takes one, and :data:`MODEL_PARAMS`."""
    from ..models import model_names

    return {**({"tau": TAU} if model in model_names(takes_temperature=True) else {}), **MODEL_PARAMS.get(model, {})}
#: Mixing weights (cone, concept, in-subspace variation, isotropic noise) per modality.
MIX = {"image": (0.6, 0.6, 0.4, 0.3), "text": (0.6, 0.7, 0.3, 0.2)}
#: Seed offsets, so that anchors, queries and gallery are independent draws.
STREAMS = {"anchors": 1, "queries": 2, "gallery": 3}


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def make_data(n_anchors: int, n_queries: int, n_gallery: int, seed: int = 0, dim: int = DIM,
              n_concepts: int = 1000, n_groups: int = 32, rank: int = 128) -> tuple[torch.Tensor, ...]:
    """(anchors, queries, gallery): seeded unit-norm float32 vectors with CLIP-like structure.

    ``n_concepts`` concept directions lie in a ``rank``-dimensional subspace, grouped
    around ``n_groups`` coarse directions; each modality has its own cone direction c
    (CLIP's modality gap). A vector is ``unit(a·c + b·concept + c'·variation + e·noise)``
    for a random concept, with the weights :data:`MIX` (anchors are texts, queries and
    gallery images).
    """
    g = torch.Generator().manual_seed(seed)
    basis = torch.linalg.qr(torch.randn(dim, rank, generator=g))[0]
    coarse = torch.randn(n_groups, rank, generator=g)
    member = torch.randint(n_groups, (n_concepts,), generator=g)
    concepts = _unit((coarse[member] + 0.7 * torch.randn(n_concepts, rank, generator=g)) @ basis.T)
    cone = torch.randn(dim, generator=g)
    cones = {"image": _unit(cone + 0.8 * torch.randn(dim, generator=g)),
             "text": _unit(cone + 0.8 * torch.randn(dim, generator=g))}

    def draw(n: int, stream: str) -> torch.Tensor:
        modality = "text" if stream == "anchors" else "image"
        a, b, c, e = MIX[modality]
        gs = torch.Generator().manual_seed(1000 * seed + STREAMS[stream])
        out = torch.empty(n, dim)
        for start in range(0, n, 16384):
            m = min(16384, n - start)
            concept = concepts[torch.randint(concepts.shape[0], (m,), generator=gs)]
            variation = torch.randn(m, rank, generator=gs) @ basis.T / math.sqrt(rank)
            noise = torch.randn(m, dim, generator=gs) / math.sqrt(dim)
            out[start:start + m] = _unit(a * cones[modality] + b * concept + c * variation + e * noise)
        return out

    return draw(n_anchors, "anchors"), draw(n_queries, "queries"), draw(n_gallery, "gallery")


def measure(fn: Callable[[], dict], repeats: int = 3, long_s: float = 10.0) -> dict:
    """Time ``fn()``: one warm-up call, then the median of ``repeats`` calls.

    A warm-up call of at least ``long_s`` seconds is kept as the only sample. ``fn``
    returns a dict of phase times in seconds, whose medians are returned too:
    ``{"seconds": median, "samples": [...], "phases": {name: median}}``.
    """
    def call():
        t0 = time.perf_counter()
        phases = fn()
        return time.perf_counter() - t0, phases

    first = call()
    runs = [first] if first[0] >= long_s else [call() for _ in range(repeats)]
    phases = {k: statistics.median(p[k] for _, p in runs) for k in runs[-1][1]}
    return {"seconds": statistics.median(t for t, _ in runs), "samples": [t for t, _ in runs], "phases": phases}


def worker(model: str, n_anchors: int, n_queries: int, n_gallery: int, repeats: int) -> dict[str, Any]:
    """Fit + top-10 search time of geometry ``model`` on ``n_anchors`` anchors.

    Returns ``seconds`` (median of fit + search), ``fit_s``, ``search_s`` and
    ``samples`` (the timed calls).
    """
    from .core import build_geometry

    anchors, queries, gallery = make_data(n_anchors, n_queries, n_gallery)
    geometry = build_geometry(model, TAU, n_anchors, DIM, {model: params(model)}, seed=0, clip=False)

    def once() -> dict:
        t0 = time.perf_counter()
        geometry.fit(anchors)
        t1 = time.perf_counter()
        geometry.search(queries, gallery, k=10, progress=False)
        return {"fit": t1 - t0, "search": time.perf_counter() - t1}

    m = measure(once, repeats=repeats)
    return {"seconds": m["seconds"], "fit_s": m["phases"]["fit"], "search_s": m["phases"]["search"],
            "samples": m["samples"]}
