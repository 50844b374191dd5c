"""Benchmark 4: approximate indexes against exact search, recall@10 and queries per second.

A gallery of anchor-structured vectors is indexed under the softmax and the Gaussian
feature maps with ``ad.Index``: the ``exact`` backend (reference top-10 and throughput),
faiss HNSW and IVF, and milvus-lite. Each approximate index is built once and searched
at several operating points (its search-time parameters).
"""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import benchlib as bl

K = 10
WORKER_TIMEOUT_S = 1800.0
FULL = {
    "G": 200_000, "Q": 1_000, "N": 2 ** 10, "repeats": 3, "models": ["softmax", "gaussian"],
    "indexes": {
        "faiss HNSW": {"backend": "faiss", "build": {"index_type": "hnsw", "M": 32, "ef_construction": 64},
                       "points": [{"ef_search": 64}, {"ef_search": 128}, {"ef_search": 256},
                                  {"ef_search": 256, "shortlist": 256}, {"ef_search": 512, "shortlist": 256}]},
        "faiss IVF": {"backend": "faiss", "build": {"index_type": "ivf", "nlist": 1024},
                      "points": [{"nprobe": 8}, {"nprobe": 32}, {"nprobe": 128},
                                 {"nprobe": 32, "shortlist": 256}, {"nprobe": 128, "shortlist": 256}]},
        "milvus-lite IVF_FLAT": {"backend": "milvus", "build": {"index_type": "IVF_FLAT", "nlist": 1024},
                                 "points": [{"nprobe": 16}, {"nprobe": 64}], "queries": 100},
    },
}
QUICK = {
    "G": 10_000, "Q": 100, "N": 2 ** 10, "repeats": 2, "models": ["softmax", "gaussian"],
    "indexes": {
        "faiss HNSW": {"backend": "faiss", "build": {"index_type": "hnsw", "M": 16, "ef_construction": 40},
                       "points": [{"ef_search": 64}, {"ef_search": 128}]},
        "faiss IVF": {"backend": "faiss", "build": {"index_type": "ivf", "nlist": 128},
                      "points": [{"nprobe": 8}, {"nprobe": 32}]},
        "milvus-lite IVF_FLAT": {"backend": "milvus", "build": {"index_type": "IVF_FLAT", "nlist": 128},
                                 "points": [{"nprobe": 16}], "queries": 10},
    },
}


def set_search_params(index, **params) -> None:
    """Change the search-time parameters (``ef_search``, ``nprobe``, ``shortlist``) of a built index."""
    backend = index._backend
    backend.params = backend.check_params({**backend.params, **params})


def recall_at_k(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / truth.shape[1] for f, t in zip(found.tolist(), truth.tolist())]))


def make_inputs(cfg: dict):
    """(anchors, queries, gallery) of a configuration; the same in every process."""
    world = bl.World()
    return (bl.make_vectors(cfg["N"], "anchors", world=world), bl.make_vectors(cfg["Q"], "index_queries", world=world),
            bl.make_vectors(cfg["G"], "index_gallery", world=world))


def evaluate(model, model_name: str, spec: dict, Q, G, truth: np.ndarray, exact_qps: float, cfg: dict,
             scratch: Path) -> dict:
    """Build one approximate index and search it at each of its operating points."""
    from anchordiv.index import Index

    build = dict(spec["build"])
    if spec["backend"] == "milvus":
        build.update(uri=str(scratch / f"{model_name}.db"), collection_name=model_name)
    t0 = time.perf_counter()
    index = Index(model, backend=spec["backend"], **build).add(G)
    build_s = time.perf_counter() - t0
    n_q = spec.get("queries", cfg["Q"])
    points = []
    for point in spec["points"]:
        set_search_params(index, **point)
        m = bl.measure(lambda: index.search(Q[:n_q], k=K), repeats=cfg["repeats"])
        qps = n_q / m["seconds"]
        points.append({"params": point, "queries": n_q, "recall": recall_at_k(m["result"][1], truth[:n_q]), "qps": qps,
                       "speedup": qps / exact_qps, "search_s": m["seconds"], "samples": m["samples"]})
    result = {"build": spec["build"], "build_s": build_s, "points": points, "shortlist": index.params.get("shortlist")}
    if spec["backend"] == "milvus":
        index.close()
    return result


def worker(mode: str, model_name: str, label: str, scratch: str) -> dict:
    """One index in this process (milvus-lite keeps its memory until the process exits)."""
    import anchordiv as ad

    cfg = QUICK if mode == "quick" else FULL
    anchors, Q, G = make_inputs(cfg)
    model = ad.make_model(model_name, **bl.MODEL_PARAMS[model_name]).fit(anchors)
    ref = np.load(Path(scratch) / f"exact_{model_name}.npz")
    return evaluate(model, model_name, cfg["indexes"][label], Q, G, ref["ids"], float(ref["qps"]), cfg, Path(scratch))


def spawn(mode: str, model_name: str, label: str, scratch: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", mode, model_name, label, str(scratch)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {WORKER_TIMEOUT_S:.0f} s"}
    if proc.returncode == -9:
        return {"error": "worker killed by SIGKILL (on Linux usually the out-of-memory killer)"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return {"error": f"worker failed (exit status {proc.returncode}): {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool = False, log=print) -> dict:
    import anchordiv as ad
    from anchordiv.index import Index

    cfg = QUICK if quick else FULL
    anchors, Q, G = make_inputs(cfg)
    scratch = Path(tempfile.mkdtemp(prefix="anchordiv-bench-"))
    results, rows, targets = {}, [], []
    try:
        for model_name in cfg["models"]:
            model = ad.make_model(model_name, **bl.MODEL_PARAMS[model_name]).fit(anchors)
            t0 = time.perf_counter()
            exact = Index(model, backend="exact").add(G)
            exact_build = time.perf_counter() - t0
            m = bl.measure(lambda: exact.search(Q, k=K), repeats=cfg["repeats"])
            truth = m["result"][1]
            exact_qps = cfg["Q"] / m["seconds"]
            np.savez(scratch / f"exact_{model_name}.npz", ids=truth, qps=exact_qps)
            results[model_name] = {"exact": {"build_s": exact_build, "search_s": m["seconds"], "qps": exact_qps,
                                             "samples": m["samples"]}}
            rows.append([model_name, "exact", "—", bl.fmt_s(exact_build), "—", "1.000", f"{exact_qps:,.0f}", "1.0×"])
            log(f"  index {model_name} exact: build {bl.fmt_s(exact_build)}, {exact_qps:,.0f} q/s")
            del exact
            gc.collect()
            for label, spec in cfg["indexes"].items():
                if spec["backend"] == "milvus":
                    r = spawn("quick" if quick else "full", model_name, label, scratch)
                else:
                    try:
                        r = evaluate(model, model_name, spec, Q, G, truth, exact_qps, cfg, scratch)
                    except Exception as exc:  # report a backend that cannot run here instead of stopping the suite
                        r = {"error": f"{type(exc).__name__}: {exc}"}
                    gc.collect()
                results[model_name][label] = r
                if "error" in r:
                    rows.append([model_name, label, "—", "error", "—", "—", "—", r["error"][:100]])
                    log(f"  index {model_name} {label}: {r['error']}")
                    continue
                for p in r["points"]:
                    shown = ", ".join(f"{k}={v}" for k, v in p["params"].items())
                    qps = p["qps"]
                    rows.append([model_name, label, ", ".join(f"{k}={v}" for k, v in spec["build"].items()),
                                 bl.fmt_s(r["build_s"]), shown + ("" if p["queries"] == cfg["Q"] else f" ({p['queries']} queries)"),
                                 f"{p['recall']:.3f}", f"{qps:,.1f}" if qps < 10 else f"{qps:,.0f}", f"{p['speedup']:.2g}×"])
                    log(f"  index {model_name} {label} {shown}: recall@10 {p['recall']:.3f}, {qps:,.1f} q/s "
                        f"({p['speedup']:.2g}× exact)")
            del model
            gc.collect()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    md = f"""
Gallery |G| = {cfg['G']:,} and |Q| = {cfg['Q']:,} queries drawn around {bl.World().concepts.shape[0]} concept
directions in a CLIP-like cone (`benchlib.make_vectors`, not i.i.d. noise), d = {bl.DIM}; N = {bl.pow2(cfg['N'])}
anchors, τ = {bl.TAU}, top-{K}, symmetric divergence. Softmax keys are 2d+1 = {2 * bl.DIM + 1}-dimensional
(inner product, indexed as L2 through the MIPS augmentation); Gaussian keys are its d-dimensional Euclidean embedding.
The approximate backends re-rank a shortlist (default max(4k, 64) = 64 candidates) with exact divergences.
Recall@10 is against the exact backend's top-10; queries/s is |Q| / (median time of `index.search(Q, k=10)`
over {cfg['repeats']} calls after a warm-up), including the query feature maps; exact throughput is measured
in the same run. Build time includes the key feature maps. An index marked "(n queries)" was searched with the
first n queries only (milvus-lite answers too slowly for all of them); its recall and queries/s are over those.
milvus-lite runs in its own process per model: it keeps its memory (≈ 8 GiB for 200k 512-d keys) until the process exits. {bl.machine()['threads']} torch threads; faiss uses its own OpenMP threads.

{bl.table(['model', 'index', 'build params', 'build', 'search params', 'recall@10', 'queries/s', 'vs exact'], rows)}
"""
    for model_name, per in results.items():
        for label, r in per.items():
            if label == "exact":
                continue
            if "error" in r:
                targets.append(bl.target(f"{model_name} / {label}: recall@10 ≥ 0.95 at ≥ 5× exact", False, "error", r["error"][:120]))
                continue
            good = [p for p in r["points"] if p["recall"] >= 0.95]
            best = max(good, key=lambda p: p["qps"]) if good else max(r["points"], key=lambda p: p["recall"])
            ok = bool(good) and best["speedup"] >= 5
            where = ", ".join(f"{k}={v}" for k, v in best["params"].items())
            measured = f"recall {best['recall']:.3f} at {best['speedup']:.1f}× exact ({where})"
            note = ("quick sizes (target is for 200k+)" if quick else "")
            if not ok and good:
                note = (note + "; " if note else "") + f"best point with recall ≥ 0.95 reaches {best['speedup']:.1f}× (needs 5×)"
            elif not good:
                note = (note + "; " if note else "") + "no operating point reached recall 0.95"
            targets.append(bl.target(f"{model_name} / {label}: recall@10 ≥ 0.95 at ≥ 5× exact", ok, measured, note))
    text = bl.write_result("index", "Benchmark 4: approximate indexes, recall@10 and throughput", md,
                           {"config": cfg, "results": results}, targets)
    return {"markdown": text, "targets": targets}


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        print(json.dumps(worker(*sys.argv[2:6])))
    else:
        print(run(quick="--quick" in sys.argv)["markdown"])
