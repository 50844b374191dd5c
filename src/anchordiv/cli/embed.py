"""``anchordiv embed`` and ``anchordiv anchors``: embed collections and anchor phrases."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from .._cli_values import tau_option as _tau_option
from ..encoders import LazyEncoder
from .common import _default_tau, _encoder_option, _load_collection, _shorten, _table


@click.command(short_help="Embed images or texts into a collection.")
@click.argument("source", type=click.Path(exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Collection folder to write.")
@_encoder_option("Encoder spec: minilm, open_clip:ARCH/PRETRAINED, hf_clip:NAME, sentence-transformers:NAME.")
@click.option("--column", default=None, help="Text column of a CSV/TSV/parquet file (default: caption, else text).")
@click.option("--shard-size", type=click.IntRange(min=1), default=10_000, show_default=True, help="Items per shard.")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True, help="Items per encoder call.")
@click.option("--device", default=None, help="Torch device of the encoder (default: cuda if available, else cpu).")
@click.option("--dtype", type=click.Choice(["float32", "float16"]), default="float32", show_default=True,
              help="Storage type of the embeddings.")
@click.option("--progress/--no-progress", default=None, help="Show a progress bar (default: when stderr is a terminal).")
def embed(source: str, out_dir: str, model: str, column: str | None, shard_size: int, batch_size: int,
          device: str | None, dtype: str, progress: bool | None) -> None:
    """Embed an image folder, a text file or a CSV/parquet text column into a collection.

    SOURCE is a folder of images (labels = parent folder names), a text file (one item
    per line), or a .csv/.tsv/.parquet file whose text column is --column (other columns
    are kept as labels). The output uses the clip-retrieval layout (img_emb/ or
    text_emb/, metadata/, collection.json). Rerunning the same command resumes an
    interrupted job.

    Example:

    \b
      anchordiv embed reviews.csv --column text --out reviews_emb/
      anchordiv embed photos/ --encoder open_clip:ViT-B-32/laion2b_s34b_b79k --out photos_emb/
    """
    from ..io import embed_collection, list_images, read_texts

    src = Path(source)
    if src.is_dir():
        if column is not None:
            raise click.UsageError("--column applies to CSV/TSV/parquet files, not to an image folder")
        items, kind = list_images(src), "image"
    else:
        items, kind = read_texts(src, column=column, keep_name=True), "text"
    encoder = LazyEncoder(model, device, batch_size)
    show = sys.stderr.isatty() if progress is None else progress
    res = embed_collection(items, encoder, out_dir, kind=kind, shard_size=shard_size, dtype=dtype,
                           progress=show, batch_size=batch_size,
                           item_column=str(items.columns[0]) if kind == "text" else None)
    noun = "images" if kind == "image" else "texts"
    if res.shards_written == 0 and res.complete:
        click.echo(f"Nothing to do: {res.out_dir} already holds {res.n_embedded} embedded {noun}; "
                   f"skipped {res.n_skipped}.")
    else:
        verb = "Resumed and embedded" if res.resumed else "Embedded"
        click.echo(f"{verb} {res.n_embedded} of {res.n_items} {noun} with {model} into {res.out_dir} "
                   f"({res.shards_written} shard(s) written, {res.n_shards} in all); skipped {res.n_skipped}.")
    for s in res.skipped[:10]:
        click.echo(f"  skipped #{s['index']} {s['item']}: {s['reason']}", err=True)
    if res.n_skipped > 10:
        click.echo(f"  ... and {res.n_skipped - 10} more (listed in collection.json)", err=True)


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_encoder_option("Encoder spec (as for embed).")
@click.option("--device", default=None, help="Torch device of the encoder.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Phrases per encoder call.")
@click.option("--refresh", is_flag=True, help="Recompute even if a matching cache exists.")
@click.option("--diagnose", "diagnose", default=None, metavar="COLLECTION", type=click.Path(exists=True),
              help="Also show how COLLECTION's items use each set: effective number of anchors exp(entropy), "
                   "items concentrated on few anchors, anchors never any item's top one.")
@click.option("--tau", type=float, default=None, callback=_tau_option,
              help="Temperature of --diagnose in [1e-4, 100] (default: the collection's, else the encoder's).")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True,
              help="--diagnose: an item is concentrated when its TOP anchors hold half its mass.")
def anchors(file: str, model: str, device: str | None, batch_size: int | None, refresh: bool,
            diagnose: str | None, tau: float | None, top: int) -> None:
    """Embed an anchors file and cache the result next to it.

    FILE is plain text (one phrase per line, # comments) or YAML with named sets: a list of
    phrases, or {names: [...], template: "a photo of a {}"} (template may be a list), with
    optional weights: (per phrase or per name) and mix: (the set's default proportion).
    The cache FILE.anchors.<encoder>.npz is reused while the file and encoder are unchanged.

    Example:

    \b
      $ cat anchors.yaml
      object:
        names: [cat, dog, car]
        template: "a photo of a {}"
      style: [a watercolor painting, a pencil sketch]
      $ anchordiv anchors anchors.yaml --encoder minilm
    """
    from ..anchorsfile import embed_anchors

    enc = LazyEncoder(model, device, batch_size)
    emb = embed_anchors(file, enc, refresh=refresh)
    total_mix = sum(emb.mix.values()) or 1.0
    click.echo(f"{file}: {len(emb.sets)} set(s), {emb.n_phrases} phrase(s); encoder {emb.encoder}"
               + (f" (tau {emb.tau:.6g})" if emb.tau is not None else "")
               + f", dim {next(iter(emb.sets.values())).dim}")
    import torch

    rows = []
    for name, s in emb.sets.items():
        uniform = bool(torch.allclose(s.weights, s.weights.new_full(s.weights.shape, 1.0 / len(s))))
        rows.append([name, str(len(s)), f"{emb.mix[name] / total_mix:.3g}", "uniform" if uniform else "weighted",
                     _shorten(s.texts[0] if s.texts else "", 50)])
    click.echo(_table(rows, ["set", "phrases", "mix", "weights", "first phrase"]))
    state = "reused" if emb.from_cache else ("written" if emb.cache_file else "not written")
    click.echo(f"cache: {emb.cache_file or '-'} ({state})")
    if diagnose is not None:
        _diagnose(diagnose, emb, tau, top)


def _diagnose(collection: str, emb: Any, tau: float | None, top: int) -> None:
    """Print each set's coverage of ``collection`` (:meth:`anchordiv.diagnostics.Explanation.coverage`)."""
    import torch

    from ..diagnostics import explain
    from ..exact import largest_k

    coll = _load_collection(collection)
    t = _default_tau(tau, coll, [emb.tau], None, ["softmax"])
    click.echo(f"\ncoverage of {collection} ({len(coll)} items, tau {t:.6g}): share of items with half their mass "
               f"on <= {top} anchors, median exp(entropy)")
    rows = []
    for name, s in emb.sets.items():
        if s.dim != coll.dim:
            raise click.UsageError(f"set {name!r} has dimension {s.dim} but {collection} has {coll.dim}; embed both "
                                   "with one encoder")
        cov = explain(s, coll.embeddings, t, top=min(top, len(s))).coverage(few=min(top, len(s)))
        counts = torch.as_tensor(cov.top_counts, dtype=torch.float64)[None]
        most = [s.texts[i] if s.texts else str(i) for i in largest_k(counts, None, min(2, len(s)))[1][0].tolist()]
        rows.append([name, str(len(s)), f"{cov.n_concentrated}/{cov.n_items}", f"{cov.median_effective:.3g}",
                     str(len(cov.never_top)), _shorten("; ".join(map(str, cov.never_top)) or "-", 50),
                     _shorten("; ".join(most), 50)])
    click.echo(_table(rows, ["set", "anchors", "concentrated", "median eff.", "never top", "never top anchors",
                             "most often top"]))
