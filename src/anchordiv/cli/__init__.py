"""The ``anchordiv`` command line: embed collections, embed anchors, search, compare, index, demo.

Every command has ``--help`` with a worked example. Errors are printed as one line,
``Error: …``, with exit status 1 (2 for usage errors); the global ``--debug`` option shows
the full traceback instead.

Anchors are given as ``PATH`` or ``PATH:NAME[:P][,NAME[:P]…]`` (a mixture of named sets of
a YAML file, e.g. ``anchors.yaml:object:0.7,style:0.3``); see :mod:`anchordiv.anchorsfile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from .. import __version__
from .common import (
    _CONTEXT,
    INDEX_META_SUFFIX,
    RECALL_SAMPLE,
    RECALL_WARNING,
    _anchor_models,
    _Group,
    _tau_models,
)
from .common import (
    _gather_queries as _gather_queries,
)
from .demo import demo
from .embed import anchors, embed
from .index import index
from .search import compare, search

__all__ = ["INDEX_META_SUFFIX", "RECALL_SAMPLE", "RECALL_WARNING", "cli", "main"]


def __getattr__(name: str) -> Any:
    """``MODEL_NAMES``, ``TAU_MODELS`` and ``ANCHOR_MODELS``: the registry's names now, plug-ins included."""
    from ..models import registry

    table = {"MODEL_NAMES": lambda: tuple(registry()), "TAU_MODELS": _tau_models, "ANCHOR_MODELS": _anchor_models}
    if name in table:
        return table[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@click.group(cls=_Group, context_settings=_CONTEXT)
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
@click.version_option(__version__, prog_name="anchordiv")
def cli(debug: bool) -> None:
    """Context-specific similarity on fixed embeddings (anchor divergences).

    Embed a collection once, describe the context with text anchors, and search or
    compare neighbours under several geometries.

    Anchors are PATH or PATH:NAME[:P][,NAME[:P]...], e.g. anchors.yaml:object:0.7,style:0.3
    (a mixture of the sets 'object' and 'style' of a YAML anchors file).

    Example:

    \b
      anchordiv embed captions.txt --out coll/
      anchordiv anchors anchors.yaml
      anchordiv search coll/ --anchors anchors.yaml:style --query-text "a red car" -k 5
    """


for _command in (embed, anchors, search, compare, index, demo):
    cli.add_command(_command)


def _register_eval() -> None:
    from ..experiments.cli import eval_command

    cli.add_command(eval_command())


def _register_serve() -> None:
    from ..serve.cli import serve_command

    cli.add_command(serve_command)


_register_eval()
_register_serve()


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``anchordiv`` console script.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default: ``sys.argv[1:]``).
    """
    cli.main(args=list(argv) if argv is not None else None, prog_name="anchordiv")
