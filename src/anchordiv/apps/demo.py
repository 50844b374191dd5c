"""The scene demo: one collection, three notions of "similar" (the paper's Figure 1, in text).

A generated collection of short scene descriptions varies three factors independently:
a dog **breed**, a **place** and a piece of **clothing**, written with several
paraphrased sentence templates. Cosine similarity mixes the three factors; an anchor set
naming the values of one factor (the breeds, say) defines a geometry in which the texts
that share that factor's value are close, whatever the other two.

:func:`run_demo` embeds the collection with an encoder (``minilm`` by default, offline),
fits the cosine, image-text-inversion, softmax and Gaussian geometries for each anchor
set, prints the mean average precision (AUPRC) of every geometry on every factor, and
writes a side-by-side neighbour report (:mod:`anchordiv.report`).

:func:`make_scene_collection` and :func:`scene_anchor_sets` are reusable on their own.
"""

from __future__ import annotations

import csv
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .._util import positive_int

#: The three factors of a scene, in display order.
FACTORS = ("breed", "place", "clothing")

#: Factor values: the label (first) and the surface forms used in the sentences.
BREEDS: dict[str, tuple[str, ...]] = {
    "husky": ("husky", "Siberian husky"),
    "corgi": ("corgi", "Welsh corgi"),
    "poodle": ("poodle", "white poodle"),
    "dalmatian": ("dalmatian", "spotted dalmatian"),
    "beagle": ("beagle", "young beagle"),
    "pug": ("pug", "little pug"),
}

PLACES: dict[str, tuple[str, ...]] = {
    "beach": ("on a sandy beach", "along the beach"),
    "mountain": ("on a snowy mountain trail", "high up on a mountain path"),
    "city": ("on a busy city street", "on a crowded downtown sidewalk"),
    "forest": ("in a quiet pine forest", "among the trees of a dense forest"),
    "kitchen": ("in a cozy kitchen", "on the kitchen floor"),
    "park": ("in a grassy park", "on the lawn of a public park"),
}

CLOTHING: dict[str, tuple[str, ...]] = {
    "raincoat": ("a red raincoat", "a yellow raincoat"),
    "bandana": ("a striped bandana", "a blue bandana"),
    "sweater": ("a knitted sweater", "a woolly sweater"),
    "bow tie": ("a bow tie", "a black bow tie"),
    "sun hat": ("a straw sun hat", "a floppy sun hat"),
    "boots": ("little rubber boots", "a set of tiny boots"),
}

#: Verbs (third person, present participle): a nuisance factor.
VERBS = (
    ("runs", "running"), ("sits", "sitting"), ("plays", "playing"),
    ("naps", "napping"), ("waits", "waiting"), ("wanders", "wandering"),
)

#: Sentence templates; ``{place}`` is a locative phrase, ``{clothing}`` a noun phrase.
TEMPLATES = (
    "A {breed} wearing {clothing} {verb} {place}.",
    "{Place}, a {breed} in {clothing} {verb}.",
    "Wearing {clothing}, a {breed} {verb} {place}.",
    "{Place} there is a {breed} with {clothing}, {verb_ing}.",
    "This {breed} has {clothing} on and is {verb_ing} {place}.",
    "Someone photographed a {breed} {verb_ing} {place}; it wears {clothing}.",
    "Dressed in {clothing}, the {breed} is {verb_ing} {place}.",
    "My {breed} loves {verb_ing} {place} in {clothing}.",
)

_VALUES = {"breed": BREEDS, "place": PLACES, "clothing": CLOTHING}


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _balanced(n: int, n_values: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` value indices in ``[0, n_values)`` whose counts differ by at most one, shuffled."""
    return rng.permutation(np.arange(n) % n_values)


def make_scene_collection(n: int = 360, seed: int = 0) -> tuple[list[str], "Any"]:
    """Generate ``n`` short scene descriptions with known breed, place and clothing.

    Each factor (and the template) is balanced on its own: the counts of its values
    differ by at most one, exactly equal when ``n`` is a multiple of 6 (of 8 for the
    templates). The factors are drawn independently of one another, so each pair of
    factor values occurs about equally often. Every sentence also draws a surface form
    for each value (``"husky"`` or ``"Siberian husky"``) and a verb.

    Parameters
    ----------
    n : int, optional
        Number of descriptions.
    seed : int, optional
        Random seed; the same ``(n, seed)`` gives the same collection.

    Returns
    -------
    texts : list of str
        The descriptions.
    labels : pandas.DataFrame
        One row per text with columns ``breed``, ``place``, ``clothing`` (the value
        labels, e.g. ``"husky"``, ``"beach"``, ``"raincoat"``) and ``template`` (the
        template index into :data:`TEMPLATES`).

    Raises
    ------
    ValueError
        If ``n`` is not a positive integer.

    Examples
    --------
    >>> texts, labels = make_scene_collection(12, seed=0)
    >>> len(texts), list(labels.columns)
    (12, ['breed', 'place', 'clothing', 'template'])
    """
    import pandas as pd

    n = positive_int(n, "n")
    rng = np.random.default_rng(seed)
    keys = {f: list(_VALUES[f]) for f in FACTORS}
    idx = {f: _balanced(n, len(keys[f]), rng) for f in FACTORS}
    tmpl = _balanced(n, len(TEMPLATES), rng)
    texts = []
    for i in range(n):
        forms = {f: _VALUES[f][keys[f][idx[f][i]]] for f in FACTORS}
        breed, place, clothing = (forms[f][rng.integers(len(forms[f]))] for f in FACTORS)
        verb, verb_ing = VERBS[rng.integers(len(VERBS))]
        texts.append(TEMPLATES[tmpl[i]].format(
            breed=breed, place=place, Place=_cap(place), clothing=clothing, verb=verb,
            verb_ing=verb_ing,
        ))
    labels = pd.DataFrame({f: [keys[f][j] for j in idx[f]] for f in FACTORS})
    labels["template"] = tmpl.astype(int)
    return texts, labels


# ---------------------------------------------------------------------------
# anchors

#: Factor named by each anchor set.
ANCHOR_FACTORS = {"breeds": "breed", "places": "place", "clothing": "clothing"}

#: The value names the anchors use, written independently of the sentences' surface forms.
_ANCHOR_NAMES = {
    "breeds": ("husky", "corgi", "poodle", "dalmatian", "beagle", "pug"),
    "places": ("at the beach", "in the mountains", "in the city", "in a forest", "in a kitchen", "in a park"),
    "clothing": ("a raincoat", "a bandana", "a sweater", "a bow tie", "a sun hat", "boots"),
}

_ANCHOR_TEMPLATES = {
    "prompt": {
        "breeds": ("a photo of a {x}.",),
        "places": ("a photo of a dog {x}.",),
        "clothing": ("a photo of a dog wearing {x}.",),
    },
    "names": {"breeds": ("{x}",), "places": ("{x}",), "clothing": ("{x}",)},
    "prompts3": {
        "breeds": ("a photo of a {x}.", "a {x}, a breed of dog.", "a {x} dog."),
        "places": ("a photo of a dog {x}.", "a scene {x}.", "a photo taken {x}."),
        "clothing": ("a photo of a dog wearing {x}.", "a pet dressed in {x}.", "a dog in {x}."),
    },
}

#: Anchor designs understood by :func:`scene_anchor_sets`.
ANCHOR_DESIGNS = tuple(_ANCHOR_TEMPLATES)


def scene_anchor_sets(design: str = "prompt") -> dict[str, list[str]]:
    """Anchor phrases for the three factors of :func:`make_scene_collection`.

    Each set names the six values of one factor; the factor of each set is in
    :data:`ANCHOR_FACTORS`.

    Parameters
    ----------
    design : {"prompt", "names", "prompts3"}, optional
        ``"prompt"`` (default): one prompt per value in the style of CLIP's zero-shot
        prompts, with the factor's context (``"a photo of a husky."``, ``"a photo of a
        dog at the beach."``, ``"a photo of a dog wearing a raincoat."``).
        ``"names"``: the bare value names (``"husky"``, ``"at the beach"``, ``"a
        raincoat"``). ``"prompts3"``: three prompts per value.

    Returns
    -------
    dict of str to list of str
        ``{"breeds": [...], "places": [...], "clothing": [...]}``.

    Raises
    ------
    ValueError
        For an unknown ``design``.
    """
    if design not in _ANCHOR_TEMPLATES:
        raise ValueError(f"design must be one of {ANCHOR_DESIGNS}, got {design!r}.")
    templates = _ANCHOR_TEMPLATES[design]
    return {
        name: [t.format(x=x) for x in values for t in templates[name]]
        for name, values in _ANCHOR_NAMES.items()
    }


# ---------------------------------------------------------------------------
# the demo


@dataclass
class DemoResult:
    """What :func:`run_demo` computed and wrote.

    Attributes
    ----------
    auprc : pandas.DataFrame
        Mean average precision, one row per geometry (index ``geometry``), one column
        per factor.
    report_path : pathlib.Path
        The HTML report (``out_dir/index.html``).
    png_path : pathlib.Path or None
        The PNG grid (``out_dir/grid.png``).
    table_paths : dict of str to pathlib.Path
        ``{"md": out_dir/auprc.md, "csv": out_dir/auprc.csv}``.
    comparison : anchordiv.report.ComparisonResult
        The neighbours shown in the report.
    texts : list of str
        The collection.
    labels : pandas.DataFrame
        Its labels.
    anchor_sets : dict of str to list of str
        The anchor phrases.
    seconds : float
        Wall time of the whole run.
    timings : dict of str to float
        Seconds per stage (``load``, ``embed``, ``fit_and_score``, ``report``).
    """

    auprc: Any
    report_path: Path
    png_path: Path | None
    table_paths: dict[str, Path]
    comparison: Any
    texts: list[str]
    labels: Any
    anchor_sets: dict[str, list[str]]
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)


def pick_queries(labels: Any, n_queries: int = 3, seed: int = 0, columns: Sequence[str] | None = None) -> list[int]:
    """Rows to show in the report: they differ on every factor and template when possible.

    Parameters
    ----------
    labels : pandas.DataFrame
        Labels from :func:`make_scene_collection`.
    n_queries : int, optional
        How many rows.
    seed : int, optional
        Random seed.
    columns : sequence of str, optional
        The label columns that should differ (default: the scene factors and template).

    Returns
    -------
    list of int
    """
    n = len(labels)
    n_queries = min(int(n_queries), n)
    cols = [c for c in (columns or (*FACTORS, "template")) if c in labels.columns]
    values = labels[cols].to_numpy()
    order = np.random.default_rng(seed).permutation(n)
    chosen: list[int] = []
    for i in order:
        if all((values[i] != values[j]).all() for j in chosen):
            chosen.append(int(i))
        if len(chosen) == n_queries:
            return chosen
    rest = [int(i) for i in order if int(i) not in chosen]
    return chosen + rest[: n_queries - len(chosen)]


def format_table(table: Any, digits: int = 3) -> str:
    """A plain-text table of an AUPRC frame, for printing.

    Parameters
    ----------
    table : pandas.DataFrame
        Geometries as rows (the index), factors as columns.
    digits : int, optional
        Decimals shown.

    Returns
    -------
    str
    """
    cols = [str(c) for c in table.columns]
    names = [str(i) for i in table.index]
    w0 = max(len("geometry"), *(len(s) for s in names))
    ws = [max(len(c), digits + 2) for c in cols]
    lines = ["  ".join(["geometry".ljust(w0)] + [c.rjust(w) for c, w in zip(cols, ws)])]
    lines.append("  ".join(["-" * w0] + ["-" * w for w in ws]))
    for name, row in zip(names, table.to_numpy()):
        lines.append("  ".join([name.ljust(w0)] + [f"{v:.{digits}f}".rjust(w) for v, w in zip(row, ws)]))
    return "\n".join(lines)


def _markdown(table: Any, anchor_sets: dict[str, list[str]], facts: dict[str, Any], digits: int = 3) -> str:
    cols = [str(c) for c in table.columns]
    best = {c: float(np.nanmax(table[c].to_numpy())) for c in cols}
    lines = ["# Scene demo: mean AUPRC per factor", ""]
    lines += [f"- {k}: {v}" for k, v in facts.items()]
    lines += ["", "| geometry | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for name, row in zip(table.index, table.to_numpy()):
        cells = [f"**{v:.{digits}f}**" if np.isclose(v, best[c]) else f"{v:.{digits}f}" for v, c in zip(row, cols)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Relevance: same value of the factor; every text is a query, itself excluded.", "",
              "## Anchor sets", ""]
    for name, phrases in anchor_sets.items():
        lines.append(f"- **{name}** ({ANCHOR_FACTORS.get(name, name)}): " + "; ".join(f"`{p}`" for p in phrases))
    return "\n".join(lines) + "\n"


def run_demo(
    out_dir: str | os.PathLike = "demo-report",
    encoder: Any = "minilm",
    seed: int = 0,
    *,
    n: int = 360,
    k: int = 8,
    n_queries: int = 3,
    query_indices: Sequence[int] | None = None,
    anchor_design: str = "prompt",
    device: Any = None,
    png: bool = True,
    progress: bool | None = None,
    echo: Callable[[str], Any] | None = print,
) -> DemoResult:
    """Run the scene demo: AUPRC of every geometry on every factor, and a neighbour report.

    Steps: generate ``n`` scene descriptions (:func:`make_scene_collection`), embed
    them and the anchor phrases (:func:`scene_anchor_sets`) with ``encoder``; for each
    anchor set fit image-text inversion, softmax and Gaussian geometries (temperature:
    the encoder's τ); score cosine and every fitted geometry by mean average precision
    on each factor (every text a query against all others, relevance = same value of
    the factor); write ``auprc.md`` / ``auprc.csv`` and a report of ``n_queries``
    queries under cosine and each anchor set's softmax and Gaussian geometry
    (``index.html``, ``grid.png``).

    Parameters
    ----------
    out_dir : str or os.PathLike, optional
        Folder for the report and tables (created if needed).
    encoder : str or Encoder, optional
        Encoder spec for :func:`anchordiv.encoders.load` or a loaded encoder
        (with ``encode_text``, ``tau`` and ``name``).
    seed : int, optional
        Seed of the collection and of the query choice.
    n : int, optional
        Number of scene descriptions.
    k : int, optional
        Neighbours shown per query and geometry.
    n_queries : int, optional
        Queries shown in the report (ignored when ``query_indices`` is given).
    query_indices : sequence of int, optional
        Rows to show as queries (default: :func:`pick_queries`).
    anchor_design : str, optional
        Anchor design for :func:`scene_anchor_sets`.
    device : str, optional
        Torch device of the encoder when ``encoder`` is a spec.
    png : bool, optional
        Also draw the report's PNG grid.
    progress : bool, optional
        Progress bar while embedding (default: the encoder decides).
    echo : callable, optional
        Where messages go (``print`` by default; None for silence).

    Returns
    -------
    DemoResult

    Raises
    ------
    ValueError
        For a bad ``n``, ``k`` or ``anchor_design``, or ``k`` not below ``n``.
    """
    say = echo or (lambda *_: None)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    k = positive_int(k, "k")
    anchor_sets = scene_anchor_sets(anchor_design)
    texts, labels = make_scene_collection(n, seed)
    if k >= n:
        raise ValueError(f"k={k} must be below n={n} (a query's own text is excluded).")

    t = time.perf_counter()
    if isinstance(encoder, str):
        from ..encoders import load

        enc = load(encoder, device=device)
    else:
        enc = encoder
    timings["load"] = time.perf_counter() - t

    t = time.perf_counter()
    X, sets, tau = _embed(enc, texts, anchor_sets, progress)
    timings["embed"] = time.perf_counter() - t

    t = time.perf_counter()
    table, shown = _fit_and_score(sets, X, labels, tau)
    timings["fit_and_score"] = time.perf_counter() - t

    t = time.perf_counter()
    qidx = list(query_indices) if query_indices is not None else pick_queries(labels, n_queries, seed)
    facts = {
        "collection": f"{n} generated scene descriptions (seed {seed}), {len(TEMPLATES)} templates",
        "encoder": f"{getattr(enc, 'name', type(enc).__name__)} (τ = {tau:g})",
        "anchors": f"design '{anchor_design}', " + ", ".join(f"{name} ({len(v)})" for name, v in anchor_sets.items()),
    }
    result, paths, md_path, csv_path = _write_report(Path(out_dir), X, texts, labels, shown, table, anchor_sets,
                                                     facts, k=int(k), qidx=qidx, png=png)
    timings["report"] = time.perf_counter() - t
    seconds = time.perf_counter() - t_start

    prevalence = {f: float(labels[f].value_counts().mean() - 1) / (n - 1) for f in FACTORS}
    say(f"Mean AUPRC on {n} scene descriptions ({facts['encoder']}; relevance = same factor value):")
    say(format_table(table))
    say("chance (share of other texts with the query's value): "
        + ", ".join(f"{f} {p:.3f}" for f, p in prevalence.items()))
    say(f"tables: {md_path}, {csv_path}")
    say(f"report: {paths.html}" + (f" (grid: {paths.png})" if paths.png else ""))
    say(f"done in {seconds:.1f} s (load {timings['load']:.1f} s, embed {timings['embed']:.1f} s)")
    return DemoResult(
        auprc=table, report_path=paths.html, png_path=paths.png, table_paths={"md": md_path, "csv": csv_path},
        comparison=result, texts=texts, labels=labels, anchor_sets=anchor_sets, seconds=seconds,
        timings=timings,
    )


def _embed(enc: Any, texts: list[str], anchor_sets: dict[str, list[str]],
           progress: bool | None) -> tuple[Any, dict[str, Any], float]:
    """The texts' embeddings, one :class:`~anchordiv.AnchorSet` per anchor set, and the encoder's τ."""
    X = enc.encode_text(texts, progress=progress)
    phrases = [p for ps in anchor_sets.values() for p in ps]
    E = enc.encode_text(phrases, progress=False)
    return X, split_anchor_sets(E, anchor_sets), float(enc.tau)


def split_anchor_sets(E: Any, phrases: dict[str, list[str]]) -> dict[str, Any]:
    """One :class:`~anchordiv.AnchorSet` per named set, from the embeddings ``E`` of all their
    phrases in order."""
    from ..anchors import AnchorSet

    sets, start = {}, 0
    for name, ps in phrases.items():
        sets[name] = AnchorSet(E[start:start + len(ps)], texts=ps)
        start += len(ps)
    return sets


def _fit_and_score(sets: dict[str, Any], X: Any, labels: Any, tau: float) -> tuple[Any, dict[str, Any]]:
    """Mean AUPRC of cosine and of every geometry fitted to each anchor set (one row per geometry),
    and the geometries the report shows."""
    import pandas as pd

    from .. import report
    from ..experiments.core import mean_auprc
    from ..models import Gaussian, Softmax
    from ..models.baselines import Cosine, ImageTextInversion

    geometries: dict[str, Any] = {"cosine": Cosine()}
    shown: dict[str, report.ReportGeometry] = {"cosine": report.ReportGeometry(Cosine(), label="cosine (no anchors)")}
    for name, aset in sets.items():
        factor = ANCHOR_FACTORS[name]
        for model_name, model in (("iti", ImageTextInversion()), ("softmax", Softmax(tau=tau)),
                                  ("gaussian", Gaussian(tau=tau))):
            key = f"{model_name} · {name}"
            geometries[key] = model.fit(aset)
            if model_name != "iti":
                shown[key] = report.ReportGeometry(
                    model, label=f"{key} ({len(aset)} anchors)", anchors=aset, factor=factor,
                )
    label_arrays = {f: labels[f].to_numpy() for f in FACTORS}
    scores = {key: mean_auprc(geom, X, label_arrays, FACTORS) for key, geom in geometries.items()}
    table = pd.DataFrame.from_dict(scores, orient="index")[list(FACTORS)]
    table.index.name = "geometry"
    return table, shown


def _write_report(out: Path, X: Any, texts: list[str], labels: Any, shown: dict[str, Any], table: Any,
                  anchor_sets: dict[str, list[str]], facts: dict[str, Any], *, k: int, qidx: list[int],
                  png: bool) -> tuple[Any, Any, Path, Path]:
    """The neighbour report (``index.html``, ``grid.png``) and ``auprc.md`` / ``auprc.csv`` in ``out``:
    returns the comparison, the report's paths and the tables' paths."""
    from .. import report

    result = report.compare(
        X, X, shown, k=k, query_indices=qidx, labels=labels[list(FACTORS)], items=texts, kind="text",
        info=facts,
    )
    paths = report.write_report(result, out, title="Scene demo: the same query under different anchor sets", png=png)
    out.mkdir(parents=True, exist_ok=True)
    md_path, csv_path = out / "auprc.md", out / "auprc.csv"
    md_path.write_text(_markdown(table, anchor_sets, facts), encoding="utf-8")
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["geometry", "model", "anchor_set", *FACTORS])
        for key, row in zip(table.index, table.to_numpy()):
            model_name, _, set_name = key.partition(" · ")
            w.writerow([key, model_name, set_name, *(f"{v:.6f}" for v in row)])
    return result, paths, md_path, csv_path
