"""``anchordiv demo``: the scene demo."""

from __future__ import annotations

import click

from ..encoders import LazyEncoder


@click.command(short_help="Run the scene demo (AUPRC table and report).")
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False),
              help="Report folder.  [default: demo-report, or emoji-demo-report with --images]")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the collection and the query choice.")
@click.option("--n", "n", type=click.IntRange(min=2), default=360, show_default=True,
              help="Scene descriptions in the demo collection (smaller is faster).")
@click.option("-k", "k", type=click.IntRange(min=1), default=8, show_default=True,
              help="Neighbours shown per query in the report.")
@click.option("--queries", "n_queries", type=click.IntRange(min=1), default=3, show_default=True,
              help="Queries shown in the report.")
@click.option("--encoder", default="minilm", show_default=True, metavar="SPEC", help="Encoder spec.")
@click.option("--device", default=None, help="Torch device of the encoder.")
@click.option("--serve", "serve", is_flag=True, help="Serve the demo collection on a local web page instead.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port of --serve.")
@click.option("--images", "images", is_flag=True,
              help="Run the emoji demo instead: held-out emoji pictures under object and style anchors "
                   "(the committed emoji CLIP; pictures from $ANCHORDIV_EMOJI or ~/.cache/anchordiv/emoji).")
def demo(out_dir: str, seed: int, n: int, k: int, n_queries: int, encoder: str, device: str | None,
         serve: bool, port: int, images: bool) -> None:
    """Run the scene demo: mean AUPRC of every geometry on every factor, and a neighbour report.

    Generates N scene descriptions varying a dog breed, a place and a piece of clothing,
    embeds them, fits cosine, image-text inversion, softmax and Gaussian geometries for
    anchor sets naming each factor, prints the AUPRC table and writes OUT/index.html,
    OUT/grid.png and OUT/auprc.{md,csv}.

    Example:

    \b
      anchordiv demo --out demo-report/ --seed 0
      anchordiv demo --n 60 -k 4 --out /tmp/quick-demo/
      anchordiv demo --serve --port 8000     # the web page at http://127.0.0.1:8000/
      anchordiv demo --images --out /tmp/emoji-demo/   # emoji: object vs style anchors
    """
    from ..apps import demo as demo_module

    if out_dir is None:
        out_dir = "emoji-demo-report" if images else "demo-report"
    if images:
        from ..apps import image_demo

        return image_demo.cli_demo(out_dir=out_dir, seed=seed, k=k, n_queries=n_queries, serve=serve, port=port)

    if serve:
        from ..apps.serve_demo import serve_demo

        return serve_demo(n=n, seed=seed, encoder=LazyEncoder(encoder, device), port=port)

    if k >= n:
        raise click.BadParameter(f"{k} must be below --n {n} (a query's own text is excluded)", param_hint="-k")
    result = demo_module.run_demo(out_dir=out_dir, encoder=LazyEncoder(encoder, device), seed=seed, n=n, k=k,
                                  n_queries=n_queries, echo=None)
    click.echo(f"Mean AUPRC on {n} scene descriptions (encoder {encoder}; relevance = same factor value):")
    click.echo(demo_module.format_table(result.auprc))
    tables = getattr(result, "table_paths", None) or {}
    if tables:
        click.echo("tables: " + ", ".join(str(p) for p in tables.values()))
    click.echo(f"report: {result.report_path}")
