"""Run the anchordiv benchmarks and write their tables to benchmarks/results/.

    .venv/bin/python benchmarks/run.py [--quick] [--only NAME ...]

NAME is one of: scaling, naive, roofline, index. ``--quick`` uses small sizes (a smoke
run of a few minutes); the full suite uses the sizes in each benchmark's FULL.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time

import benchlib as bl

BENCHMARKS = {
    "scaling": "bench_scaling",    # 1. end-to-end time and peak memory against N (Table 4 analog)
    "naive": "bench_naive",        # 2. direct KL and cached statistics against model.search
    "roofline": "bench_roofline",  # 3. softmax preprocessing against the fp32 GEMM peak
    "index": "bench_index",        # 4. faiss / milvus-lite recall@10 and throughput against exact
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes in all")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), metavar="NAME",
                        help=f"run only these benchmarks ({', '.join(BENCHMARKS)})")
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)

    def log(msg: str) -> None:
        print(msg, flush=True)

    start = time.perf_counter()
    sections, targets, timings = [], [], {}
    for name in names:
        log(f"== {name}{' (quick)' if args.quick else ''}")
        t0 = time.perf_counter()
        out = importlib.import_module(BENCHMARKS[name]).run(quick=args.quick, log=log)
        timings[name] = time.perf_counter() - t0
        log(f"== {name}: {timings[name]:.0f} s")
        sections.append(out["markdown"])
        targets += [{"benchmark": name, **t} for t in out["targets"]]
    total = time.perf_counter() - start

    mode = "quick" if args.quick else "full"
    summary = (f"# Benchmark summary ({mode} run)\n\n"
               f"Command: `.venv/bin/python benchmarks/run.py{' --quick' if args.quick else ''}"
               f"{' --only ' + ' '.join(names) if args.only else ''}`  \n"
               f"Machine: {bl.machine()['platform']}, {bl.machine()['cpus']} CPUs, torch {bl.machine()['torch']} "
               f"({bl.machine()['threads']} threads).  \n"
               f"Total runtime: {total:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ").\n\n"
               "## Targets\n\n"
               + bl.table(["benchmark", "target", "status", "measured", "note"],
                          [[t["benchmark"], t["target"], f"**{t['status']}**", t["measured"], t["note"]] for t in targets])
               + "\n")
    bl.RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if not args.only else "-" + "-".join(names)
    (bl.RESULTS / f"summary{suffix}.md").write_text(summary)
    (bl.RESULTS / f"summary{suffix}.json").write_text(json.dumps(
        {"mode": mode, "benchmarks": names, "total_s": total, "seconds": timings, "targets": targets,
         "machine": bl.machine()}, indent=2) + "\n")
    log("\n\n".join(sections))
    log(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
