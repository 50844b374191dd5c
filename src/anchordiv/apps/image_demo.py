"""The emoji demo: the same picture under object anchors and under style anchors.

The held-out emoji of :mod:`anchordiv.apps.emoji` (objects never seen in training, each drawn
by Google and by Twitter) are embedded with the committed emoji CLIP
(``anchordiv.apps.emoji.CLIP_SPEC``). Two anchor sets define two geometries: the
**objects** (``"a {name} emoji"`` for every emoji shown) and the **styles** (the style
captions of every vendor). Under object anchors a picture's neighbours should be the
same emoji in the other style; under style anchors, other emoji in its own style.
:func:`run_image_demo` scores cosine and the softmax geometry of each anchor set by mean
average precision on both factors and writes a neighbour report with thumbnails;
:func:`build_image_demo_service` serves the same collection (``anchordiv demo --images
--serve``).
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import emoji

#: The two factors of a picture.
FACTORS = ("object", "style")


def image_demo_data(encoder: Any = None, cache: Any = None, *, n_emoji: int | None = None,
                    seed: int = 0) -> dict[str, Any]:
    """Held-out emoji pictures, their embeddings and the object and style anchor sets.

    Parameters
    ----------
    encoder : str or Encoder, optional
        Default: the committed emoji CLIP (``anchordiv.apps.emoji.CLIP_SPEC``).
    cache : path, optional
        The emoji folder (default :func:`anchordiv.apps.emoji.default_cache`).
    n_emoji : int, optional
        Use this many held-out emoji (drawn with ``seed``), each in every style; all by default.

    Returns
    -------
    dict
        ``pictures`` (list of :class:`anchordiv.apps.emoji.Emoji`), ``labels`` (DataFrame with
        ``object`` and ``style``), ``X`` (image embeddings), ``anchor_sets`` (name ->
        AnchorSet), ``encoder`` and ``tau``.
    """
    import pandas as pd

    from ..encoders import load
    from .demo import split_anchor_sets

    pictures = [e for e in emoji.load(cache) if emoji.is_held_out(e.name)]
    names = sorted({e.name for e in pictures})
    if not names:
        raise ValueError(f"no held-out emoji in {cache or emoji.default_cache()}; the folder holds too few emoji.")
    if n_emoji is not None:
        if int(n_emoji) < 2:
            raise ValueError(f"n_emoji must be at least 2, got {n_emoji!r}.")
        keep = set(np.random.default_rng(seed).permutation(names)[: int(n_emoji)].tolist())
        pictures = [e for e in pictures if e.name in keep]
        names = sorted(keep)
    enc = load(emoji.CLIP_SPEC, device="cpu") if encoder is None else (
        load(encoder, device="cpu") if isinstance(encoder, str) else encoder)
    X = enc.encode_images([e.path for e in pictures], progress=False)
    phrases = {
        "objects": [emoji.object_anchor(n) for n in names],
        "styles": [t.format(style=v) for v in emoji.VENDORS for t in emoji.STYLE_TEMPLATES],
    }
    flat = [p for ps in phrases.values() for p in ps]
    E = enc.encode_text(flat, progress=False)
    sets = split_anchor_sets(E, phrases)
    labels = pd.DataFrame({"object": [e.name for e in pictures], "style": [e.vendor for e in pictures]})
    return {"pictures": pictures, "labels": labels, "X": X, "anchor_sets": sets, "encoder": enc,
            "tau": float(enc.tau)}


def run_image_demo(out_dir: str | os.PathLike = "emoji-demo-report", encoder: Any = None, cache: Any = None, *,
                   n_emoji: int | None = None, k: int = 8, n_queries: int = 3, seed: int = 0,
                   png: bool = True, echo: Callable[[str], Any] | None = print) -> dict[str, Any]:
    """Mean AUPRC of cosine and of softmax geometries under object and style anchors on the
    held-out emoji, and a report of ``n_queries`` pictures under each (with thumbnails).

    Writes ``index.html`` (and ``grid.png``), ``auprc.md`` and ``auprc.csv`` into
    ``out_dir``. Returns a dict with ``auprc`` (DataFrame: geometry x factor), ``report``
    (path of ``index.html``), ``seconds`` and the data of :func:`image_demo_data`.
    """
    import pandas as pd

    from .. import report
    from .._util import positive_int
    from ..models.baselines import Cosine
    from .demo import format_table, pick_queries
    from ..experiments.core import mean_auprc
    from ..models import Softmax

    say = echo or (lambda *_: None)
    t0 = time.perf_counter()
    k = positive_int(k, "k")
    data = image_demo_data(encoder, cache, n_emoji=n_emoji, seed=seed)
    X, labels, tau = data["X"], data["labels"], data["tau"]
    if k >= len(X):
        raise ValueError(f"k={k} must be below the number of pictures ({len(X)}).")
    shown: dict[str, Any] = {"cosine": report.ReportGeometry(Cosine(), label="cosine (no anchors)")}
    geometries: dict[str, Any] = {"cosine": Cosine()}
    for name, aset in data["anchor_sets"].items():
        model = Softmax(tau=tau).fit(aset)
        geometries[f"softmax · {name}"] = model
        shown[f"softmax · {name}"] = report.ReportGeometry(
            model, label=f"softmax · {name} ({len(aset)} anchors)", anchors=aset,
            factor="object" if name == "objects" else "style")
    label_arrays = {f: labels[f].to_numpy() for f in FACTORS}
    table = pd.DataFrame.from_dict(
        {key: mean_auprc(g, X, label_arrays, FACTORS) for key, g in geometries.items()}, orient="index")
    table = table[list(FACTORS)]
    table.index.name = "geometry"

    out = Path(out_dir)
    qidx = pick_queries(labels, n_queries, seed, columns=FACTORS)
    facts = {
        "collection": f"{len(X)} held-out emoji pictures ({labels['object'].nunique()} emoji never seen in "
                      f"training x {labels['style'].nunique()} styles)",
        "encoder": f"{getattr(data['encoder'], 'name', 'encoder')} (τ = {tau:g})",
        "images": "emoji-datasource-google (Apache-2.0) and emoji-datasource-twitter (CC-BY-4.0)",
    }
    result = report.compare(X, X, shown, k=k, query_indices=qidx, labels=labels, kind="image",
                            items=[str(e.path) for e in data["pictures"]], info=facts)
    paths = report.write_report(result, out, title="Emoji: the same picture under object and style anchors",
                                png=png)
    out.mkdir(parents=True, exist_ok=True)
    (out / "auprc.md").write_text(
        "# Mean AUPRC on held-out emoji\n\n" + "".join(f"- {k_}: {v}\n" for k_, v in facts.items())
        + "\n```\n" + format_table(table) + "\n```\n", encoding="utf-8")
    with open(out / "auprc.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["geometry", *FACTORS])
        for key, row in zip(table.index, table.to_numpy()):
            w.writerow([key, *(f"{v:.6f}" for v in row)])
    seconds = time.perf_counter() - t0
    say(f"Mean AUPRC on {facts['collection']}; {facts['encoder']} ({seconds:.1f} s):")
    say(format_table(table))
    say(f"report: {paths.html}")
    return {"auprc": table, "report": paths.html, "seconds": seconds, **data}


def build_image_demo_service(encoder: Any = None, cache: Any = None, *, n_emoji: int | None = None,
                             seed: int = 0) -> Any:
    """A :class:`~anchordiv.serve.service.Service` over the held-out emoji pictures, with
    the object and style anchor sets and thumbnails (``anchordiv demo --images --serve``)."""
    from ..anchorsfile import EmbeddedAnchors
    from ..io import Collection
    from ..serve.service import Service

    data = image_demo_data(encoder, cache, n_emoji=n_emoji, seed=seed)
    meta = data["labels"].copy()
    meta.insert(0, "image_path", [str(e.path) for e in data["pictures"]])
    enc, tau = data["encoder"], data["tau"]
    coll = Collection(embeddings=data["X"], metadata=meta, kind="image", tau=tau,
                      encoder=getattr(enc, "name", None), path="held-out emoji")
    sets = data["anchor_sets"]
    anchors = EmbeddedAnchors(path=Path("emoji-anchors"), sets=sets, mix={k: 1.0 for k in sets},
                              encoder=getattr(enc, "name", "encoder"), tau=tau,
                              n_phrases=sum(len(s) for s in sets.values()))
    return Service(coll, anchors, enc, label_columns=list(FACTORS), default_model="softmax",
                   title=f"anchordiv · emoji ({len(coll)} held-out pictures)")


def cli_demo(out_dir: str, seed: int, k: int, n_queries: int, serve: bool, port: int) -> None:
    """``anchordiv demo --images``: the report (or with ``serve``, the web page)."""
    import click

    try:
        emoji.load()
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    if serve:
        from ..serve.cli import DEFAULT_HOST, bind_port, check_deps, run_service

        check_deps()
        sock = bind_port(DEFAULT_HOST, port)  # a busy port fails before the embedding
        click.echo("Embedding the held-out emoji pictures and the anchor sets ...")
        return run_service(build_image_demo_service(seed=seed), port=port, sock=sock)
    run_image_demo(out_dir=out_dir, k=k, n_queries=n_queries, seed=seed, echo=click.echo)
