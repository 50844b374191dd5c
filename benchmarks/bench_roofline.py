"""Benchmark 3: softmax preprocessing throughput against this machine's fp32 GEMM peak.

Softmax statistics κ(η) and ∇κ(η) for n vectors are two GEMMs against the N anchors
(logits ηΓᵀ, then softmax-weights × Γ): 4·n·N·d flops. The peak is a large square
``torch.matmul`` measured in the same run, before and after the sweep.
"""

from __future__ import annotations

import statistics
import sys

import torch

import benchlib as bl

FULL = {"n": 4096, "Ns": [2 ** e for e in range(12, 17)], "gemm": 4096, "gemm_repeats": 5, "repeats": 3}
QUICK = {"n": 512, "Ns": [2 ** e for e in range(12, 15)], "gemm": 2048, "gemm_repeats": 3, "repeats": 2}


def gemm_peak(size: int, repeats: int) -> dict:
    """Median GFLOP/s of a size³ float32 matmul (2·size³ flops)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=g), torch.randn(size, size, generator=g)
    m = bl.measure(lambda: torch.matmul(a, b), repeats=repeats, long_s=1e9)
    return {"gflops": 2 * size ** 3 / m["seconds"] / 1e9, "samples_gflops": [2 * size ** 3 / t / 1e9 for t in m["samples"]]}


def run(quick: bool = False, log=print) -> dict:
    import anchordiv as ad

    cfg = QUICK if quick else FULL
    before = gemm_peak(cfg["gemm"], cfg["gemm_repeats"])
    log(f"  roofline GEMM peak (before): {before['gflops']:.1f} GFLOP/s")
    world = bl.World()
    X = bl.make_vectors(cfg["n"], "queries", world=world)
    sweep = {}
    for n_anchors in cfg["Ns"]:
        model = ad.Softmax(tau=bl.TAU).fit(bl.make_vectors(n_anchors, "anchors", world=world))
        m = bl.measure(lambda: model.query_features(X), repeats=cfg["repeats"])
        flops = 4.0 * cfg["n"] * n_anchors * bl.DIM
        sweep[n_anchors] = {"seconds": m["seconds"], "samples": m["samples"], "gflops": flops / m["seconds"] / 1e9}
        log(f"  roofline N={bl.pow2(n_anchors)}: {sweep[n_anchors]['gflops']:.1f} GFLOP/s")
    after = gemm_peak(cfg["gemm"], cfg["gemm_repeats"])
    log(f"  roofline GEMM peak (after): {after['gflops']:.1f} GFLOP/s")
    peak = statistics.median(before["samples_gflops"] + after["samples_gflops"])
    rows = [[bl.pow2(n), bl.fmt_s(r["seconds"]), f"{r['gflops']:.1f}", f"{100 * r['gflops'] / peak:.0f} %"]
            for n, r in sweep.items()]
    md = f"""
Softmax preprocessing `Softmax(tau={bl.TAU}).query_features(X)` for n = {cfg['n']:,} vectors, d = {bl.DIM}, float32,
{bl.machine()['threads']} torch threads; flops counted as 4·n·N·d (the two GEMMs; exp, max and sums not counted).
GEMM peak: `torch.matmul` of two {cfg['gemm']}×{cfg['gemm']} float32 matrices, median of {cfg['gemm_repeats']}
before and {cfg['gemm_repeats']} after the sweep: **{peak:.1f} GFLOP/s** (before {before['gflops']:.1f}, after {after['gflops']:.1f}).
Each softmax time is the median of {cfg['repeats']} after a warm-up.

{bl.table(['N', 'time', 'GFLOP/s', '% of GEMM peak'], rows)}
"""
    big = {n: r for n, r in sweep.items() if n >= 2 ** 14}
    targets = []
    if big:
        worst = min(big, key=lambda n: big[n]["gflops"])
        frac = big[worst]["gflops"] / peak
        targets.append(bl.target("softmax preprocessing ≥ 50 % of GEMM peak for N ≥ 2^14", frac >= 0.5,
                                 f"min {100 * frac:.0f} % at N={bl.pow2(worst)} ({big[worst]['gflops']:.1f} of {peak:.1f} GFLOP/s)",
                                 "quick sizes" if quick else ""))
    text = bl.write_result("roofline", "Benchmark 3: softmax preprocessing against the GEMM peak", md,
                           {"config": cfg, "gemm_before": before, "gemm_after": after, "peak_gflops": peak,
                            "results": sweep}, targets)
    return {"markdown": text, "targets": targets}


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv)["markdown"])
