"""Benchmark: live contexts on a Dask cluster (1 and 2 workers) at 10⁶ and 10⁷ rows, and the scaling model.

A :class:`anchordiv.contexts.FeatureStore` made with ``client=`` cuts the collection (float16
shards, d = 512, the clustered rows of ``bench_contexts``) into parts of ``PART_ROWS`` rows;
each worker builds and keeps its parts, and a query is answered by every part and merged on
the client (:mod:`anchordiv.contexts.cluster`). For 1 and 2 workers of one thread each
(``LocalCluster``, processes) this reports the time to a ready softmax context of 16 anchors,
the p50/p95 of one query and of 100 queries, and checks that every answer equals the one-process
store's (rows and distances). The one-process store (2 torch threads) is measured beside it.

The scaling model (``docs/scaling.md``) predicts those times from per-part costs measured here
first, in this process with one torch thread (what a worker has):

* ``t_build``: seconds to build one part (fit excluded), ``t_scan``: one query over one part;
* ``c_task``: a Dask task's round trip (submit one tiny task and fetch its result), ``c_part``:
  the added cost per task when a query fans out to many (submit and gather P tiny tasks, ÷ P);
* ``c_query``: the client's own work per query (query terms, checks, merge).

ready(n, W) = c_task + P · c_part + ⌈P/W⌉ · t_build and query(n, W) = c_query + c_task + P · c_part + ⌈P/W⌉ · t_scan,
P = ⌈n / PART_ROWS⌉ parts over W workers. The benchmark prints prediction ÷ measured for each run.

Run: ``.venv/bin/python benchmarks/bench_distributed.py [--quick]`` (quick: 10⁶ rows only).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_contexts as bc  # noqa: E402
import benchlib as bl  # noqa: E402

import anchordiv as ad  # noqa: E402
from anchordiv.contexts import FeatureStore  # noqa: E402
from anchordiv.contexts.cluster import PART_ROWS  # noqa: E402
from anchordiv.io import MappedRows  # noqa: E402

K = 10
N_ANCHORS = 16
FULL = {"sizes": [1_000_000, 10_000_000], "queries": 20, "batches": 3}
QUICK = {"sizes": [1_000_000], "queries": 10, "batches": 2}
WORKERS = (1, 2)
#: Predicted sizes and worker counts in docs/scaling.md.
PREDICT = [(10 ** 8, 8), (10 ** 8, 64), (10 ** 9, 64), (10 ** 9, 512)]
#: Bytes of one stored row (512 float16 numbers), and the assumed per-worker read rate of shards not in the
#: page cache for the predictions (a local NVMe drive; not measured here).
D_BYTES, DISK = 1024, 2e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _noop(x):
    return x


def _part_costs_here(model, part, gemm: dict) -> dict:
    """t_build and t_scan of one part, timed where this runs (a task: on a worker, with its one thread); the
    build with the client's products (``gemm``, :func:`anchordiv._gemm.using`), as a part of a build is."""
    from anchordiv import _gemm

    with _gemm.using(gemm):
        t_build = _timed(FeatureStore(model, part.rows()).build)  # a fresh store, as each part of a build is
    store = FeatureStore(model, part.rows()).build()
    q = np.asarray(part.rows()[:1], dtype=np.float32)
    offsets, phi = model.query_terms(torch.from_numpy(q).double(), compute_dtype=True)
    store.search_terms(offsets, phi, K, None, None)
    t_scan = statistics.median(_timed(lambda: store.search_terms(offsets, phi, K, None, None)) for _ in range(15))
    return {"t_build": t_build, "t_scan": t_scan, "part_rows": len(part)}


def part_costs(client, rows: MappedRows, model, Q: np.ndarray) -> dict:
    """Per-part costs measured on a worker of ``client`` (t_build, t_scan), and c_query in this process."""
    from anchordiv.contexts.cluster import cluster_parts

    part = cluster_parts(rows, block=PART_ROWS)[0]
    from anchordiv import _gemm

    FeatureStore(model, rows)  # the client's GEMM choice for this shape, as a build makes it
    costs = client.submit(_part_costs_here, model, part, _gemm.given_choices(), pure=False).result()
    tiny = FeatureStore(model, MappedRows([rows.parts[0][:K]])).build()
    tiny.search(Q[:1], k=K)
    costs["c_query"] = statistics.median(_timed(lambda: tiny.search(Q[:1], k=K)) for _ in range(30))
    return costs


def dask_costs(client, model, Q: np.ndarray, fan: int = 40) -> dict:
    """c_task: one task's round trip; c_part: the cost per task of a fan-out of ``fan`` tasks; each task
    carries what a query's task carries (the query terms o(q), φ(q)) and does nothing with them."""
    offsets, phi = model.query_terms(torch.from_numpy(Q[:1]).double(), compute_dtype=True)
    client.submit(_noop, (offsets, phi), pure=False).result()
    c_task = statistics.median(_timed(lambda: client.submit(_noop, (offsets, phi), pure=False).result())
                               for _ in range(20))
    many = min(_timed(lambda: client.gather([client.submit(_noop, (offsets, phi), pure=False) for _ in range(fan)]))
               for _ in range(5))
    return {"c_task": c_task, "c_part": max(0.0, (many - c_task) / (fan - 1))}


def predict(n: int, workers: int, costs: dict, part_rows: int = PART_ROWS, disk: float | None = None) -> dict:
    """The model: P = ⌈n / part_rows⌉ parts, ⌈P / W⌉ per worker, each costing t_build (t_scan) scaled by its rows;
    ``disk``: bytes/s each worker reads its float16 shards at (None: they are in the page cache)."""
    parts = math.ceil(n / part_rows)
    per_worker = math.ceil(parts / workers)
    scale = min(n, part_rows) / costs["part_rows"]
    read = 0.0 if disk is None else per_worker * min(n, part_rows) * D_BYTES / disk
    return {"parts": parts, "part_rows": part_rows, "read_s": read,
            "ready_s": costs["c_task"] + parts * costs["c_part"] + per_worker * costs["t_build"] * scale + read,
            "query_s": costs["c_query"] + costs["c_task"] + parts * costs["c_part"] + per_worker * costs["t_scan"] * scale}


def time_store(store: FeatureStore, Q: np.ndarray, n_single: int, n_batches: int) -> dict:
    store.search(Q[:1], k=K)
    single = [_timed(lambda i=i: store.search(Q[i:i + 1], k=K)) for i in range(n_single)]
    Qb = np.concatenate([Q] * (100 // len(Q) + 1))[:100]
    batch = [_timed(lambda: store.search(Qb, k=K)) for _ in range(n_batches)]
    stat = lambda xs: (statistics.median(xs), float(np.percentile(xs, 95)))  # noqa: E731
    return {"single": stat(single), "batch": stat(batch)}


def run(quick: bool = False, log=print) -> dict:
    import distributed

    cfg = QUICK if quick else FULL
    torch.set_num_threads(os.cpu_count() or 1)
    model = ad.Softmax(tau=0.05).fit(bc.clustered(N_ANCHORS, stream=7).numpy())
    results, costs = [], {}
    for n in cfg["sizes"]:
        files = bc.shards(n, log)
        rows = MappedRows.open(files)
        log(f"n={n:,}: shards read in {bc.read_floor(files):.2f} s (the page cache is warm from here)")
        Q = rows.take(np.random.default_rng(1).choice(n, cfg["queries"], replace=False)).astype(np.float32)
        t0 = time.perf_counter()
        one = FeatureStore(model, rows).build()
        ready_one = time.perf_counter() - t0
        truth = one.search(Q, k=K)
        timing = time_store(one, Q, cfg["queries"], cfg["batches"])
        results.append({"n": n, "workers": 0, "ready_s": ready_one, **timing, "equal": True})
        log(f"n={n:,} one process: ready {ready_one:.2f} s, 1 query p50 {1e3 * timing['single'][0]:.1f} ms")
        del one
        for w in WORKERS:
            with distributed.LocalCluster(n_workers=w, threads_per_worker=1, processes=True, host="127.0.0.1",
                                          dashboard_address=None, silence_logs=50) as cluster, \
                    distributed.Client(cluster) as client:
                dc = {**part_costs(client, rows, model, Q), **dask_costs(client, model, Q)}
                costs.setdefault((n, w), dc)
                log(f"  {w} worker(s): per part ({dc['part_rows']:,} rows, on a worker): build {dc['t_build']:.3f} s, "
                    f"scan {1e3 * dc['t_scan']:.2f} ms; client per query {1e3 * dc['c_query']:.2f} ms")
                t0 = time.perf_counter()
                store = FeatureStore(model, rows, client=client).build()
                ready = time.perf_counter() - t0
                got = store.search(Q, k=K)
                equal = bool(np.array_equal(got[1], truth[1]) and np.array_equal(got[0], truth[0]))
                timing = time_store(store, Q, cfg["queries"], cfg["batches"])
                pred = predict(n, w, dc)
                rec = {"n": n, "workers": w, "parts": pred["parts"], "ready_s": ready, **timing, "equal": equal,
                       "predicted": pred, **dc}
                results.append(rec)
                log(f"n={n:,} {w} worker(s), {pred['parts']} parts: ready {ready:.2f} s (model "
                    f"{pred['ready_s']:.2f}), 1 query p50 {1e3 * timing['single'][0]:.1f} ms (model "
                    f"{1e3 * pred['query_s']:.1f}), equal {equal}; task {1e3 * dc['c_task']:.1f} ms, "
                    f"per part {1e3 * dc['c_part']:.2f} ms")
                del store
    out = report(results, costs)
    title = "Live contexts on a Dask cluster: 1 and 2 workers, and the scaling model"
    out["markdown"] = bl.write_result("distributed", title, out["markdown"],
                                      {"results": results, "predictions": out["predictions"],
                                       "costs": [{"n": n, "workers": w, **c} for (n, w), c in costs.items()]},
                                      out["targets"])
    return out


def report(results: list[dict], costs: dict) -> dict:
    ms = lambda s: f"{1e3 * s:.1f}"  # noqa: E731
    rows, cost_rows = [], []
    for r in results:
        p = r.get("predicted")
        rows.append([f"{r['n']:,}", "one process (2 threads)" if r["workers"] == 0 else r["workers"],
                     r.get("parts", "—"), bl.fmt_s(r["ready_s"]), "—" if p is None else f"{p['ready_s'] / r['ready_s']:.2f}",
                     f"{ms(r['single'][0])} / {ms(r['single'][1])}",
                     "—" if p is None else f"{p['query_s'] / r['single'][0]:.2f}",
                     f"{ms(r['batch'][0])} / {ms(r['batch'][1])}", "yes" if r["equal"] else "**no**"])
    for (n, w), c in costs.items():
        cost_rows.append([f"{n:,}", w, f"{c['t_build']:.3f}", f"{ms(c['t_scan'])}", ms(c["c_query"]), ms(c["c_task"]),
                          f"{1e3 * c['c_part']:.2f}"])
    md = (f"Softmax, {N_ANCHORS} anchors, d = 512 float16 shards, parts of {PART_ROWS:,} rows; workers of one "
          "thread each (`LocalCluster`, processes) on this 2-core machine. Per-part costs, measured on a worker of "
          "each cluster before its run (t_build: one part's build; t_scan: one query over one part; c_query: the "
          "client's own work per query; c_task: one task's round trip; c_part: the cost per task of a fan-out):\n\n")
    md += bl.table(["rows", "workers", "t_build s", "t_scan ms", "c_query ms", "c_task ms", "c_part ms"], cost_rows)
    md += "\n\n" + bl.table(["rows", "workers", "parts", "ready", "model ÷ measured", "1 query p50 / p95 ms",
                              "model ÷ measured", "100 queries p50 / p95 ms", "equal to one process"], rows)
    ref = costs[max(costs, key=lambda nw: (nw[1], nw[0]))]
    preds = []
    for n, w in PREDICT:
        for label, part_rows in (("default parts", PART_ROWS), ("one part per worker", -(-n // w))):
            for where, disk in (("page cache", None), ("disk", DISK)):
                preds.append({"n": n, "workers": w, "layout": label, "shards": where,
                              **predict(n, w, ref, part_rows, disk)})
    md += ("\n\nPredicted by the model for larger collections, with the per-part and Dask costs of the "
           f"largest 2-worker run above; 'disk': shards read at an assumed {DISK / 1e9:.0f} GB/s per worker "
           "(see docs/scaling.md for the assumptions):\n\n")
    md += bl.table(["rows", "workers", "parts", "rows per part", "shards in", "ready", "1 query"],
                   [[f"{p['n']:.0e}", p["workers"], f"{p['parts']:,}", f"{p['part_rows']:,}", p["shards"],
                     bl.fmt_s(p["ready_s"]), f"{ms(p['query_s'])} ms"] for p in preds])
    clustered = [r for r in results if r["workers"]]
    ratios = [x for r in clustered for x in (r["predicted"]["ready_s"] / r["ready_s"],
                                            r["predicted"]["query_s"] / r["single"][0])]
    targets = [bl.target("Dask result ÷ one-process result: identical", all(r["equal"] for r in clustered),
                         f"{sum(r['equal'] for r in clustered)} of {len(clustered)} runs identical"),
               bl.target("scaling model ÷ measured within 1.5× (ready and 1 query, 1 and 2 workers)",
                         all(1 / 1.5 <= x <= 1.5 for x in ratios),
                         f"{min(ratios):.2f}–{max(ratios):.2f}×")]
    return {"markdown": md, "targets": targets, "predictions": preds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(run(quick=args.quick)["markdown"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
