"""Benchmark: peak memory of exact search and index building against ``memory_budget``.

Each case runs in a fresh process. The process draws its inputs (clustered unit vectors,
:func:`bench_search.clustered`), fits the model, returns freed heap memory to the system
(``malloc_trim``), records its resident set size (the *inputs* level) and resets its peak
(``/proc/self/clear_refs``, so that drawing the inputs cannot mask the case's peak). The
case's cost is then ``ru_maxrss`` minus that level, minus what the index backend stores
(n × width × 4 bytes) for an ``add``. A thread samples the RSS every millisecond and keeps
the stack of the main thread at the highest sample: where the peak happens.
"""

from __future__ import annotations

import ctypes
import gc
import json
import resource
import subprocess
import sys
import threading
import time
import traceback

import benchlib as bl

K = 10
MiB = 2 ** 20
#: Target: peak above the inputs (and above the backend's storage) ≤ SLACK × budget.
SLACK = 1.1
WORKER_TIMEOUT_S = 1800.0
FULL = {
    "d": 512, "N": 4096, "Q": 2000, "G": 200_000, "budgets": [64 * MiB, 256 * MiB], "faiss": True,
    "growth": {"Ns": [2 ** 10, 2 ** 16], "Q": 1000, "G": 20_000, "budgets": [64 * MiB, 256 * MiB]},
}
QUICK = {
    "d": 512, "N": 1024, "Q": 500, "G": 20_000, "budgets": [64 * MiB], "faiss": True,
    "growth": {"Ns": [2 ** 10, 2 ** 13], "Q": 500, "G": 5_000, "budgets": [64 * MiB]},
}


# -------------------------------------------------------------------- the worker
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def reset_peak() -> None:
    """Make ``ru_maxrss`` start again from the current RSS (Linux ≥ 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


class PeakSampler:
    """Samples the RSS every ``interval`` s; keeps the main thread's stack at the highest sample."""

    def __init__(self, interval: float = 0.001):
        self.interval, self.main = interval, threading.main_thread().ident
        self.peak, self.where, self._stop = 0, [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self._stop.is_set():
            rss = rss_bytes()
            if rss > self.peak:
                frame = sys._current_frames().get(self.main)
                self.peak = rss
                self.where = [f"{fs.filename.split('/src/')[-1]}:{fs.lineno} {fs.name}"
                              for fs in traceback.extract_stack(frame) if "anchordiv" in fs.filename] if frame else []
            time.sleep(self.interval)

    def __enter__(self):
        self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def measured(fn, level: int) -> dict:
    """Run ``fn`` after resetting the peak; its peak RSS above ``level`` and the sampled peak's stack."""
    reset_peak()
    t0 = time.perf_counter()
    with PeakSampler() as sampler:
        out = fn()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak": peak, "above": peak - level, "sampled_above": sampler.peak - level, "where": sampler.where,
            "seconds": seconds, "out": out}


def worker(spec: dict) -> dict:
    import torch

    import anchordiv as ad
    from anchordiv.index import Index
    from bench_search import clustered

    torch.manual_seed(0)
    d, B = spec["d"], spec["budget"]
    start = rss_bytes()
    anchors = clustered(spec["N"], d, "anchors")
    Q, G = clustered(spec["Q"], d, "queries"), clustered(spec["G"], d, "gallery")
    trim()
    before_fit = rss_bytes()
    model = ad.Softmax(tau=bl.TAU).fit(anchors)
    trim()
    level = rss_bytes()
    res = {"import_rss": start, "inputs_rss": level, "inputs_bytes": level - start, "fit_bytes": level - before_fit,
           "anchor_bytes": anchors.numel() * 4, "input_tensor_bytes": (anchors.numel() + Q.numel() + G.numel()) * 4}
    if spec["case"] == "model.search":
        m = measured(lambda: model.search(Q, G, k=K, memory_budget=B), level)
        res["search"] = {k: v for k, v in m.items() if k != "out"}
        return res
    backend = spec["case"]
    params = {"memory_budget": B} if backend == "exact" else {"index_type": "flat", "memory_budget": B}
    index = Index(model, backend=backend, **params)
    m = measured(lambda: index.add(G), level)
    if backend == "exact":
        storage = sum(b.numel() * b.element_size() for b in index._backend.blocks)
        width = index._backend.blocks[0].shape[1]
    else:
        width = index._backend.layout.vector_dim
        storage = index._backend.index.ntotal * width * 4
    res["add"] = {**{k: v for k, v in m.items() if k != "out"}, "storage": storage, "width": width,
                  "above_storage": m["above"] - storage}
    trim()
    level2 = rss_bytes()
    m = measured(lambda: index.search(Q, k=K), level2)
    res["search"] = {**{k: v for k, v in m.items() if k != "out"}, "level": level2}
    res["stored_rss_above_inputs"] = level2 - level
    return res


def spawn(spec: dict) -> dict:
    cmd = [sys.executable, __file__, "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, cwd=bl.HERE)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {WORKER_TIMEOUT_S:.0f} s"}
    if proc.returncode == -9:
        return {"error": "worker killed by SIGKILL (on Linux usually the out-of-memory killer)"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return {"error": f"worker failed (exit status {proc.returncode}): {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------ driver
def faiss_available() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def where(stack: list[str]) -> str:
    """The innermost anchordiv frame of a sampled stack, short."""
    return stack[-1].replace("anchordiv/", "") if stack else "—"


def run(quick: bool = False, log=print) -> dict:
    from bench_search import source_note, source_state

    cfg = QUICK if quick else FULL
    t_start = time.perf_counter()
    source_before = source_state()
    d = cfg["d"]
    specs = []
    for B in cfg["budgets"]:
        base = {"d": d, "N": cfg["N"], "Q": cfg["Q"], "G": cfg["G"], "budget": B}
        specs.append({**base, "case": "model.search"})
        specs.append({**base, "case": "exact"})
        if cfg["faiss"] and faiss_available():
            specs.append({**base, "case": "faiss"})
    g = cfg["growth"]
    for N in g["Ns"]:
        for B in g["budgets"]:
            specs.append({"d": d, "N": N, "Q": g["Q"], "G": g["G"], "budget": B, "case": "model.search", "growth": True})

    rows, records = [], []

    def row(label, spec, r, above, extra_storage=None, note=""):
        B = spec["budget"]
        ok = above <= SLACK * B
        rows.append([label, bl.pow2(spec["N"]), f"{spec['Q']:,}", f"{spec['G']:,}", f"{B // MiB}",
                     bl.fmt_mib(r["inputs_bytes"]), "—" if extra_storage is None else bl.fmt_mib(extra_storage),
                     bl.fmt_mib(above), f"{above / B:.2f}", f"**{'PASS' if ok else 'MISS'}**", note])
        records.append({"case": label, **{k: spec[k] for k in ("N", "Q", "G", "budget")}, "above": above,
                        "ratio": above / B, "status": "PASS" if ok else "MISS", "storage": extra_storage, "where": note})
        log(f"  {label:<28} N={bl.pow2(spec['N']):<5} B={B // MiB:>4} MiB: {above / MiB:7.1f} MiB above "
            f"({above / B:.2f}× budget) {'PASS' if ok else 'MISS'}  [{note}]")
        return ok

    raw = []
    for spec in specs:
        t0 = time.perf_counter()
        r = spawn(spec)
        spec_s = time.perf_counter() - t0
        raw.append({"spec": spec, "result": r, "wall_s": spec_s})
        if "error" in r:
            label = {"model.search": "model.search", "exact": "Index exact", "faiss": "Index faiss flat"}[spec["case"]]
            rows.append([label, bl.pow2(spec["N"]), f"{spec['Q']:,}", f"{spec['G']:,}", f"{spec['budget'] // MiB}",
                         "—", "—", "—", "—", "**MISS**", r["error"][:100]])
            records.append({"case": label, **{k: spec[k] for k in ("N", "Q", "G", "budget")}, "status": "MISS",
                            "error": r["error"]})
            log(f"  {label} N={spec['N']} B={spec['budget'] // MiB}: {r['error']}")
            continue
        if spec["case"] == "model.search":
            row("model.search" + (" (growth)" if spec.get("growth") else ""), spec, r, r["search"]["above"],
                note=where(r["search"]["where"]))
        else:
            name = "Index exact" if spec["case"] == "exact" else "Index faiss flat"
            a = r["add"]
            row(f"{name} .add(G)", spec, r, a["above_storage"], a["storage"], note=where(a["where"]))
            row(f"{name} .search(Q)", spec, r, r["search"]["above"], note=where(r["search"]["where"]))
        log(f"    ({spec_s:.0f} s)")

    # growth of model.search's peak with the number of anchors
    growth_rows, growth = [], {}
    for B in g["budgets"]:
        pts = {x["spec"]["N"]: x["result"] for x in raw
               if x["spec"].get("growth") and x["spec"]["budget"] == B and "error" not in x["result"]}
        if len(pts) < 2:
            continue
        n0, n1 = min(pts), max(pts)
        dn = (n1 - n0) * d * 4
        search_growth = pts[n1]["search"]["above"] - pts[n0]["search"]["above"]
        fit_growth = pts[n1]["fit_bytes"] - pts[n0]["fit_bytes"]
        total_growth = (pts[n1]["search"]["peak"] - pts[n1]["import_rss"]) - (pts[n0]["search"]["peak"] - pts[n0]["import_rss"])
        growth[B] = {"N0": n0, "N1": n1, "anchor_growth": dn, "search_growth": search_growth, "fit_growth": fit_growth,
                     "total_growth": total_growth}
        growth_rows.append([f"{B // MiB}", f"{bl.pow2(n0)} → {bl.pow2(n1)}", bl.fmt_mib(dn),
                            f"{search_growth / MiB:+.1f} ({search_growth / dn:+.3f})",
                            f"{fit_growth / MiB:+.1f} ({fit_growth / dn:+.3f})",
                            f"{total_growth / MiB:+.1f} ({total_growth / dn:+.3f})"])
    wall = time.perf_counter() - t_start
    source_after = source_state()
    md = f"""
Softmax (τ = {bl.TAU}), symmetric, k = {K}, float32, d = {d}, clustered unit vectors (`bench_search.clustered`:
1000 centres, radius ≈ 0.66). Each row is one fresh process: it draws anchors, Q and G, fits the model, calls
`malloc_trim(0)`, takes its RSS as the *inputs* level (column "inputs": RSS above the bare imports) and resets
its peak (`/proc/self/clear_refs`); "above" is `ru_maxrss` − inputs level, and for `.add(G)` also minus the
backend's storage (exact: n × D × 4 with D = 2d+1; faiss: n × (D+1) × 4, the MIPS-augmented vectors).
`.search(Q)` runs in the same process right after the add, from a new level (inputs + index) and a new peak
reset. Target: above ≤ {SLACK} × budget. "peak at": the anchordiv line where the main thread was when a
1-ms RSS sampler saw its highest value.

{bl.table(['case', 'N', '|Q|', '|G|', 'budget MiB', 'inputs MiB', 'storage MiB', 'above MiB', 'above / budget', 'status', 'peak at'], rows)}

Growth with the number of anchors (model.search, |Q| = {g['Q']:,}, |G| = {g['G']:,}): change of each quantity
from the smaller to the larger N, in MiB and (in parentheses) as a multiple of the anchors' own growth ΔN·d·4.
"search peak" is the peak above inputs; "fit" the RSS that `fit` adds; "total" the whole process' peak above
its imports (anchors, Q, G and model included).

{bl.table(['budget MiB', 'N', 'ΔN·d·4 MiB', 'search peak', 'fit', 'total'], growth_rows)}

Wall time {wall:.0f} s. {source_note(source_before, source_after)}
"""
    targets = []
    for label in dict.fromkeys(r["case"] for r in records):
        sel = [r for r in records if r["case"] == label]
        bad = [r for r in sel if r["status"] == "MISS"]
        worst = max((r for r in sel if "ratio" in r), key=lambda r: r["ratio"], default=None)
        measured_s = (f"max {worst['ratio']:.2f}× budget (N={bl.pow2(worst['N'])}, {worst['budget'] // MiB} MiB)"
                      if worst else "error")
        targets.append(bl.target(f"{label}: peak above inputs{' and storage' if '.add' in label else ''} ≤ {SLACK}× budget",
                                 not bad, measured_s, ("quick sizes; " if quick else "") +
                                 "; ".join(f"{r['budget'] // MiB} MiB: {r.get('ratio', float('nan')):.2f}×" for r in bad)))
    text = bl.write_result("memory", "Peak memory against memory_budget", md,
                           {"config": cfg, "rows": records, "growth": growth, "raw": raw, "wall_s": wall,
                            "source": {"before": source_before, "after": source_after}}, targets)
    return {"markdown": text, "targets": targets}


if __name__ == "__main__":
    if "--worker" in sys.argv:
        print(json.dumps(worker(json.loads(sys.argv[sys.argv.index("--worker") + 1])), default=str))
    else:
        if "--quick" in sys.argv:
            bl.RESULTS = bl.RESULTS / "quick"
        print(run(quick="--quick" in sys.argv)["markdown"])
