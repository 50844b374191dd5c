"""Shared pieces of the benchmarks: the data generator, the timing helper, result files.

Every benchmark draws its vectors from :func:`make_vectors` (seeded, unit norm, with
anchor structure) and times with :func:`measure` (a warm-up call, then the median of
repeats). Results go to ``benchmarks/results/NAME.md`` and ``NAME.json``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
ROOT = HERE.parent
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

import anchordiv.models.base  # noqa: E402
import anchordiv.exact  # noqa: E402

# no progress bars in benchmark output
anchordiv.models.base.PROGRESS_FLOPS = float("inf")
anchordiv.exact.PROGRESS_WORK = float("inf")

#: Embedding dimension of every benchmark (CLIP ViT-B/32 and ViT-B/16).
DIM = 512
#: Temperature of every anchor model (CLIP's logit scale 100).
TAU = 0.01
#: Keyword arguments of each geometry, by registry name.
MODEL_PARAMS = {
    "cosine": {},
    "iti": {},
    "softmax": {"tau": TAU},
    "gaussian": {"tau": TAU},
    "gmm": {"n_components": 8, "seed": 0, "tau": TAU},
    "latent_gaussian": {"tau": TAU},
    "latent_spherical": {"tau": TAU},
}


# --------------------------------------------------------------------------- data
class World:
    """The shared semantic structure every vector is drawn around (CLIP-like).

    ``n_concepts`` concept directions live in a ``rank``-dimensional subspace and are
    grouped around ``n_groups`` coarse directions; images and texts each sit in their
    own cone (a common direction per modality, as in CLIP's modality gap).
    """

    def __init__(self, dim: int = DIM, n_concepts: int = 1000, n_groups: int = 32, rank: int = 128, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.dim, self.rank = dim, rank
        self.basis = torch.linalg.qr(torch.randn(dim, rank, generator=g))[0]            # (d, r) orthonormal
        groups = torch.randn(n_groups, rank, generator=g)
        member = torch.randint(n_groups, (n_concepts,), generator=g)
        concepts = groups[member] + 0.7 * torch.randn(n_concepts, rank, generator=g)
        self.concepts = unit(concepts @ self.basis.T)                                      # (C, d)
        cone = torch.randn(dim, generator=g)
        self.cone = {"image": unit(cone + 0.8 * torch.randn(dim, generator=g)),
                     "text": unit(cone + 0.8 * torch.randn(dim, generator=g))}


#: Mixing weights (cone, concept, in-subspace variation, isotropic noise) per modality.
MIX = {"image": (0.6, 0.6, 0.4, 0.3), "text": (0.6, 0.7, 0.3, 0.2)}
#: Seed offsets, so that anchors, queries and gallery are independent draws.
STREAMS = {"anchors": 1, "queries": 2, "gallery": 3, "index_gallery": 4, "index_queries": 5}


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True)


def make_vectors(n: int, stream: str, seed: int = 0, world: World | None = None, chunk: int = 16384) -> torch.Tensor:
    """``n`` unit-norm float32 vectors of dimension :data:`DIM`, seeded.

    Each row is ``unit(a·cone + b·concept + c·variation + e·noise)`` for a random concept;
    anchors are texts, everything else images. Rows are drawn in chunks into one
    preallocated tensor, so the peak memory of drawing is the result plus one chunk.
    """
    world = world or World(seed=seed)
    modality = "text" if stream == "anchors" else "image"
    a, b, c, e = MIX[modality]
    g = torch.Generator().manual_seed(1000 * seed + STREAMS[stream])
    out = torch.empty(n, world.dim)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        concept = world.concepts[torch.randint(world.concepts.shape[0], (m,), generator=g)]
        variation = torch.randn(m, world.rank, generator=g) @ world.basis.T / math.sqrt(world.rank)
        noise = torch.randn(m, world.dim, generator=g) / math.sqrt(world.dim)
        out[start:start + m] = unit(a * world.cone[modality] + b * concept + c * variation + e * noise)
    return out


def make_data(n_anchors: int, n_queries: int, n_gallery: int, seed: int = 0):
    """(anchors, queries, gallery) drawn around one :class:`World`."""
    world = World(seed=seed)
    return (make_vectors(n_anchors, "anchors", seed, world), make_vectors(n_queries, "queries", seed, world),
            make_vectors(n_gallery, "gallery", seed, world))


# ------------------------------------------------------------------------- timing
def measure(fn, repeats: int = 3, long_s: float = 10.0) -> dict:
    """Time ``fn()``: one warm-up call, then the median of ``repeats`` calls.

    A warm-up call that takes at least ``long_s`` seconds is kept as the only sample
    (warm-up effects are negligible at that length and the suite stays short). ``fn``
    may return a dict of phase times in seconds; their medians are returned as well.
    Returns ``{"seconds": median, "samples": [...], "phases": {name: median}, "result": last return}``.
    """
    def call():
        t0 = time.perf_counter()
        result = fn()
        return time.perf_counter() - t0, result

    first, result = call()
    runs = [(first, result)] if first >= long_s else [call() for _ in range(repeats)]
    seconds = [t for t, _ in runs]
    phases = {}
    if isinstance(runs[-1][1], dict):
        for key, value in runs[-1][1].items():
            if isinstance(value, (int, float)):
                phases[key] = statistics.median(r[key] for _, r in runs)
    return {"seconds": statistics.median(seconds), "samples": seconds, "phases": phases, "result": result}


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ------------------------------------------------------------------------ results
def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "processor": platform.processor()}


def table(header: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def target(name: str, ok: bool | None, measured: str, note: str = "") -> dict:
    """One target line: PASS, MISS, or n/a (``ok is None``: not measured in this run)."""
    return {"target": name, "status": "n/a" if ok is None else ("PASS" if ok else "MISS"), "measured": measured, "note": note}


def targets_table(targets: list[dict]) -> str:
    return table(["target", "status", "measured", "note"],
                 [[t["target"], f"**{t['status']}**", t["measured"], t["note"]] for t in targets])


def write_result(name: str, title: str, markdown: str, payload: dict, targets: list[dict]) -> str:
    """Write ``results/NAME.md`` and ``results/NAME.json``; returns the Markdown."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = f"# {title}\n\n{markdown.strip()}\n"
    if targets:
        text += "\n## Targets\n\n" + targets_table(targets) + "\n"
    (RESULTS / f"{name}.md").write_text(text)
    payload = {"name": name, "title": title, "machine": machine(), "targets": targets, **payload}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return text


def fmt_s(seconds: float | None) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "—"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


def fmt_mib(n_bytes: float | None) -> str:
    return "—" if n_bytes is None else f"{n_bytes / 2**20:.0f}"


def pow2(n: int) -> str:
    e = int(round(math.log2(n)))
    return f"2^{e}" if 2 ** e == n else str(n)
