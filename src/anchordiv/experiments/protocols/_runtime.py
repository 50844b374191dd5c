"""``runtime``: fit + search time against the number of anchors (paper App. F.4, Table 4)."""

from __future__ import annotations

from typing import Any, Sequence

from ..._util import positive_int
from ...models import model_names
from .. import timing
from ..core import check_models
from ..report import LinePlot, ProtocolResult, bullets, long_table, pivot_table, tidy
from ._skeleton import Protocol, anchor_free, runs

#: The geometries timed by default.
RUNTIME_MODELS = ("cosine", "softmax", "gaussian", "latent_gaussian", "latent_spherical")
#: Columns of the timings, one row per model and anchor count.
TIMES = ["model", "n_anchors", "n_queries", "n_gallery", "seconds", "fit_s", "search_s", "samples"]
#: The two models whose growth the claim compares: the anchor measure itself (softmax) grows with N, a
#: Euclidean model (the Gaussian: O(d²) per vector) stays flat.
GROWS = next(iter(model_names(builtin=True, nonparametric=True)))
FLAT = next(m for m in RUNTIME_MODELS if m in model_names(builtin=True, euclidean=True))


class Runtime(Protocol):
    """Every model timed at every anchor count N on seeded synthetic data (:mod:`~anchordiv.experiments.timing`)."""

    protocol = "runtime"
    title = "Runtime against the number of anchors"
    claim = ("Softmax runtime grows with the anchor-set size, while the Gaussian anchor divergence stays nearly "
             "constant once the anchor distribution is fitted (paper App. F.4, Table 4).")
    effect_columns = ("model", "n_small", "n_large", "seconds_small", "seconds_large", "growth", "fit_growth",
                      "search_growth")

    def validate(self) -> None:
        self.models = check_models(self.models)
        self.Ns = sorted({positive_int(n, "n_anchors") for n in self.n_anchors})
        self.n_queries = positive_int(self.n_queries, "n_queries")
        self.n_gallery = positive_int(self.n_gallery, "n_gallery")
        self.repeats = positive_int(self.repeats, "repeats")
        if not self.Ns or not self.models:
            raise ValueError("runtime needs at least one model and one anchor count.")
        if self.n_gallery < 10:
            raise ValueError("n_gallery must be at least 10 (the benchmark searches the top 10).")

    def steps(self) -> int:
        return len(self.Ns) * len(self.models)

    def sweep(self, bar: Any) -> list[dict]:
        times = []
        for N in self.Ns:
            for m in self.models:
                out = timing.worker(m, N, self.n_queries, self.n_gallery, self.repeats)
                bar.update()
                times.append({"model": m, "n_anchors": N, "n_queries": self.n_queries, "n_gallery": self.n_gallery,
                              "seconds": float(out["seconds"]), "fit_s": float(out["fit_s"]),
                              "search_s": float(out["search_s"]), "samples": len(out["samples"])})
        return times

    def summarize(self, times: list[dict]) -> None:
        """The timings, and each one's ratio to the time of the first anchor-free geometry (cosine) at its N."""
        self.observations = self.rows = tidy(times, TIMES)
        reference = anchor_free(self.models)[:1]
        cos = {r["n_anchors"]: r["seconds"] for r in times if r["model"] in reference}
        self.summary = [{**r, "ratio_to_cosine": r["seconds"] / cos[r["n_anchors"]] if r["n_anchors"] in cos
                         else float("nan")} for r in times]

    def summary_columns(self) -> list[str]:
        return [*TIMES, "ratio_to_cosine"]

    def measure(self) -> list[dict]:
        """Per model, the time at the largest N over the time at the smallest."""
        effects = []
        for m in self.models:
            t = {r["n_anchors"]: r for r in self.summary if r["model"] == m}
            if len(t) >= 2:
                small, large = t[self.Ns[0]], t[self.Ns[-1]]
                effects.append({"model": m, "n_small": self.Ns[0], "n_large": self.Ns[-1],
                                "seconds_small": small["seconds"], "seconds_large": large["seconds"],
                                "growth": large["seconds"] / small["seconds"],
                                "fit_growth": large["fit_s"] / small["fit_s"] if small["fit_s"] > 0 else float("nan"),
                                "search_growth": large["search_s"] / small["search_s"]})
        return effects

    def judge(self) -> list[str]:
        growth = {e["model"]: e for e in self.effects}
        if GROWS not in growth or FLAT not in growth:
            return []
        sm, ga = growth[GROWS], growth[FLAT]
        return [f"N {self.Ns[0]} → {self.Ns[-1]}: fit + search time × {sm['growth']:.2f} for {GROWS}, × "
                f"{ga['growth']:.2f} for {FLAT} (search alone × {sm['search_growth']:.2f} and × "
                f"{ga['search_growth']:.2f}) → "
                + (f"holds ({GROWS} grows faster)" if sm["growth"] > ga["growth"] else "does not hold")]

    def parameters(self) -> dict:
        return dict(models=self.models, n_anchors=self.Ns, n_queries=self.n_queries, n_gallery=self.n_gallery,
                    repeats=self.repeats, benchmark="anchordiv.experiments.timing.worker",
                    benchmark_params={m: timing.params(m) for m in self.models}, dim=timing.DIM)

    def facts(self) -> dict:
        return {"benchmark": "anchordiv.experiments.timing (worker; the data of benchmarks/bench_scaling.py), "
                             f"synthetic unit vectors, d = {timing.DIM}, top-10 exact search",
                "sizes": f"{self.n_queries} queries, {self.n_gallery} gallery",
                "timing": f"one warm-up, then the median of {self.repeats} calls of fit + search"}

    def sections(self) -> list[tuple[str | None, str]]:
        return [("Fit + search time in seconds (ratio to cosine)", pivot_table(
                    self.summary, [(m, [m]) for m in self.models], [(N, f"N = {N}") for N in self.Ns],
                    lambda r: r["model"], lambda r: r["n_anchors"],
                    lambda r: f"{r['seconds']:.3g} ({r['ratio_to_cosine']:.2f}×)", ["model"])),
                ("Verdict", bullets(self.verdicts)),
                ("Growth from the smallest to the largest N", long_table(self.effects, [
                    ("model", "model"), ("seconds (small N)", lambda e: f"{e['seconds_small']:.3g}"),
                    ("seconds (large N)", lambda e: f"{e['seconds_large']:.3g}"),
                    ("growth", lambda e: f"{e['growth']:.2f}×"), ("fit growth", lambda e: f"{e['fit_growth']:.2f}×"),
                    ("search growth", lambda e: f"{e['search_growth']:.2f}×")]))]

    def plot(self) -> LinePlot:
        return LinePlot(x="n_anchors", y="seconds", series=("model",), band=False, logx=2, logy=True,
                        xlabel="number of anchors N", ylabel="fit + search time (s)",
                        title=f"Runtime, {self.n_queries} queries × {self.n_gallery} gallery", legend_outside=False,
                        legend_size=8)


@runs(Runtime)
def runtime(*, models: Sequence[str] = RUNTIME_MODELS, n_anchors: Sequence[int] = (256, 1024, 4096),
            n_queries: int = 200, n_gallery: int = 2000, repeats: int = 2, out_dir: Any = None,
            progress: bool | str | None = None) -> ProtocolResult:
    """Fit + search time against the number of anchors (paper App. F.4, Table 4).

    For every model and anchor count N, :func:`anchordiv.experiments.timing.worker`
    draws seeded unit vectors (d = 512) for the anchors, queries and gallery, then times
    ``model.fit(anchors)`` followed by ``model.search(queries, gallery, k=10)`` (one
    warm-up, then the median of ``repeats`` calls), in this process. The paper's claim:
    softmax time grows with the number of anchors while the Gaussian model stays nearly
    flat once fitted.

    Parameters
    ----------
    models : sequence of str, optional
        Registry names (τ = 0.01, GMM with 8 components: :mod:`~anchordiv.experiments.timing`).
    n_anchors : sequence of int, optional
        Anchor counts N.
    n_queries, n_gallery : int, optional
        Queries and gallery size (paper: 10,000 and 50,000 on an H100).
    repeats : int, optional
        Timed calls after the warm-up.
    out_dir, progress
        As in :func:`coordinate`.

    Returns
    -------
    ProtocolResult
        ``observations`` and ``rows``: model, n_anchors, n_queries, n_gallery, seconds,
        fit_s, search_s, samples; ``summary`` adds the ratio to cosine (the first geometry
        that needs no anchors); ``effects``: per model the time at the largest N over the
        time at the smallest.
    """
