"""Benchmark 3: softmax preprocessing throughput against this machine's fp32 GEMM peak.

Softmax statistics κ(η) and ∇κ(η) for n vectors are two GEMMs against the N anchors
(logits ηΓᵀ, then softmax-weights × Γ): 4·n·N·d flops. The peak is a large square
``torch.matmul`` measured in the same process, interleaved with the softmax calls: each
round times the GEMM, then one call per N, then the GEMM again. Every time is the minimum
over the rounds (the least disturbed run on a shared machine), and each N's fraction of
the peak is the ratio of those minima.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

import benchlib as bl

FULL = {"n": 4096, "Ns": [2 ** e for e in range(12, 17)], "gemm": 4096, "rounds": 8}
QUICK = {"n": 512, "Ns": [2 ** e for e in range(12, 15)], "gemm": 2048, "rounds": 3}
#: Fraction of the GEMM peak every N should reach.
TARGET_FRACTION = 0.7


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(quick: bool = False, log=print) -> dict:
    import anchordiv as ad

    started, load_before = time.perf_counter(), os.getloadavg()[0]
    cfg = QUICK if quick else FULL
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(cfg["gemm"], cfg["gemm"], generator=g), torch.randn(cfg["gemm"], cfg["gemm"], generator=g)
    gemm = lambda: torch.matmul(a, b)  # noqa: E731
    gemm_flops = 2.0 * cfg["gemm"] ** 3
    world = bl.World()
    X = bl.make_vectors(cfg["n"], "queries", world=world)
    models = {N: ad.Softmax(tau=bl.TAU).fit(bl.make_vectors(N, "anchors", world=world)) for N in cfg["Ns"]}

    gemm()  # warm-up calls
    for model in models.values():
        model.query_features(X)
    gemm_samples, samples = [], {N: [] for N in cfg["Ns"]}
    for r in range(cfg["rounds"]):
        gemm_samples.append(_seconds(gemm))
        for N, model in models.items():
            samples[N].append(_seconds(lambda: model.query_features(X)))
        gemm_samples.append(_seconds(gemm))
        log(f"  roofline round {r + 1}/{cfg['rounds']}: GEMM {gemm_flops / min(gemm_samples[-2:]) / 1e9:.1f} GFLOP/s, "
            + ", ".join(f"{bl.pow2(N)} {4.0 * cfg['n'] * N * bl.DIM / samples[N][-1] / 1e9:.1f}" for N in cfg["Ns"]))

    peak = gemm_flops / min(gemm_samples) / 1e9
    load = [load_before, os.getloadavg()[0]]
    sweep = {}
    for N, times in samples.items():
        flops = 4.0 * cfg["n"] * N * bl.DIM
        best = min(times)
        sweep[N] = {"seconds": best, "median_seconds": statistics.median(times), "samples": times,
                    "gflops": flops / best / 1e9, "fraction_of_peak": flops / best / 1e9 / peak}
        log(f"  roofline N={bl.pow2(N)}: {sweep[N]['gflops']:.1f} GFLOP/s = {100 * sweep[N]['fraction_of_peak']:.0f} % "
            f"of {peak:.1f}")
    rows = [[bl.pow2(N), bl.fmt_s(r["seconds"]), bl.fmt_s(r["median_seconds"]), f"{r['gflops']:.1f}",
             f"{100 * r['fraction_of_peak']:.0f} %"] for N, r in sweep.items()]
    gemm_gflops = [gemm_flops / t / 1e9 for t in gemm_samples]
    md = f"""
Softmax preprocessing `Softmax(tau={bl.TAU}).query_features(X)` for n = {cfg['n']:,} vectors, d = {bl.DIM}, float32,
{bl.machine()['threads']} torch threads; flops counted as 4·n·N·d (the two GEMMs; exp, max and sums not counted).
GEMM peak: `torch.matmul` of two {cfg['gemm']}×{cfg['gemm']} float32 matrices, timed before and after each
of {cfg['rounds']} rounds in the same process as the softmax calls (one call per N per round, after a
warm-up call each): **{peak:.1f} GFLOP/s** from its fastest run (median {statistics.median(gemm_gflops):.1f},
slowest {min(gemm_gflops):.1f}). Each softmax time and fraction of the peak use its fastest run of the
{cfg['rounds']}; the median is shown for the spread on this shared machine (1-minute load average
{load[0]:.1f} at the start, {load[1]:.1f} at the end, on {bl.machine()['cpus']} CPUs).

{bl.table(['N', 'time (min)', 'time (median)', 'GFLOP/s', '% of GEMM peak'], rows)}
"""
    worst = min(sweep, key=lambda N: sweep[N]["fraction_of_peak"])
    frac = sweep[worst]["fraction_of_peak"]
    big = {N: r for N, r in sweep.items() if N >= 2 ** 14}
    note = "quick sizes" if quick else ""
    targets = [bl.target(f"softmax preprocessing ≥ {100 * TARGET_FRACTION:.0f} % of GEMM peak for every N", frac >= TARGET_FRACTION,
                         f"min {100 * frac:.0f} % at N={bl.pow2(worst)} ({sweep[worst]['gflops']:.1f} of {peak:.1f} GFLOP/s)", note)]
    if big:
        worst_big = min(big, key=lambda N: big[N]["fraction_of_peak"])
        frac_big = big[worst_big]["fraction_of_peak"]
        targets.append(bl.target("softmax preprocessing ≥ 50 % of GEMM peak for N ≥ 2^14", frac_big >= 0.5,
                                 f"min {100 * frac_big:.0f} % at N={bl.pow2(worst_big)} "
                                 f"({big[worst_big]['gflops']:.1f} of {peak:.1f} GFLOP/s)", note))
    text = bl.write_result("roofline", "Benchmark 3: softmax preprocessing against the GEMM peak", md,
                           {"mode": "quick" if quick else "full", "wall_s": time.perf_counter() - started,
                            "config": cfg, "load_average": load, "gemm_seconds": gemm_samples, "peak_gflops": peak,
                            "results": sweep}, targets)
    return {"markdown": text, "targets": targets}


if __name__ == "__main__":
    quick = "--quick" in sys.argv
    if quick:  # as in run.py: quick results never overwrite the full ones
        bl.RESULTS = bl.RESULTS / "quick"
    print(run(quick=quick)["markdown"])
