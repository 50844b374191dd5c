"""Run the anchordiv benchmarks and write their tables to benchmarks/results/.

    .venv/bin/python benchmarks/run.py [--quick] [--only NAME ...]

NAME is one of: scaling, naive, roofline, index, search, memory, milvus, contexts, distributed. ``--quick`` uses small sizes (a smoke
run of a few minutes); the full suite uses the sizes in each benchmark's FULL.
``results/summary.md`` lists the targets of the last run of every benchmark; quick runs
write to ``results/quick/`` instead.
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
    "search": "bench_search",      # 5. exact search throughput against raw torch GEMM + topk
    "memory": "bench_memory",      # 6. peak memory of search / Index.add against memory_budget
    "milvus": "bench_milvus",      # 7. a real Milvus server vs faiss HNSW and exact; sharded build memory
    "contexts": "bench_contexts",  # 8. live contexts over 10^5..10^7 memory-mapped rows; the service at 10^6
    "distributed": "bench_distributed",  # 9. live contexts on 1 and 2 Dask workers; the scaling model
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes in all")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), metavar="NAME",
                        help=f"run only these benchmarks ({', '.join(BENCHMARKS)})")
    args = parser.parse_args(argv)
    names = [n for n in BENCHMARKS if n in (args.only or BENCHMARKS)]
    if args.quick:  # quick results never overwrite the full ones
        bl.RESULTS = bl.RESULTS / "quick"

    def log(msg: str) -> None:
        print(msg, flush=True)

    start = time.perf_counter()
    sections = []
    for name in names:
        log(f"== {name}{' (quick)' if args.quick else ''}")
        t0 = time.perf_counter()
        out = importlib.import_module(BENCHMARKS[name]).run(quick=args.quick, log=log)
        seconds = time.perf_counter() - t0
        log(f"== {name}: {seconds:.0f} s")
        path = bl.RESULTS / f"{name}.json"
        record = json.loads(path.read_text())
        record.update(mode="quick" if args.quick else "full", wall_s=seconds)
        path.write_text(json.dumps(record, indent=2, default=str) + "\n")
        sections.append(out["markdown"])
    total = time.perf_counter() - start
    summary = write_summary()
    log("\n\n".join(sections))
    log(summary)
    log(f"This run: {total:.0f} s.")
    return 0


def write_summary() -> str:
    """results/summary.md and .json: every target of the last run of each benchmark."""
    rows, runs, targets = [], [], []
    for name in BENCHMARKS:
        path = bl.RESULTS / f"{name}.json"
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        runs.append(f"{name} ({record.get('mode', '?')}, {record.get('wall_s', float('nan')):.0f} s)")
        for t in record["targets"]:
            targets.append({"benchmark": name, **t})
            rows.append([name, t["target"], f"**{t['status']}**", t["measured"], t["note"]])
    total = sum(json.loads((bl.RESULTS / f"{n}.json").read_text()).get("wall_s", 0.0)
                for n in BENCHMARKS if (bl.RESULTS / f"{n}.json").exists())
    m = bl.machine()
    text = ("# Benchmark summary\n\n"
            "Command: `.venv/bin/python benchmarks/run.py [--quick] [--only NAME ...]`  \n"
            f"Machine: {m['platform']}, {m['cpus']} CPUs, torch {m['torch']} ({m['threads']} threads).  \n"
            f"Last run of each benchmark: {', '.join(runs)}; {total:.0f} s in all.\n\n"
            "## Targets\n\n" + bl.table(["benchmark", "target", "status", "measured", "note"], rows) + "\n")
    (bl.RESULTS / "summary.md").write_text(text)
    (bl.RESULTS / "summary.json").write_text(json.dumps({"runs": runs, "total_s": total, "targets": targets,
                                                          "machine": m}, indent=2) + "\n")
    return text


if __name__ == "__main__":
    sys.exit(main())
