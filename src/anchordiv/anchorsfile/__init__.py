"""Anchor files: text anchors on disk, their cached embeddings, and mixture specs.

An *anchors file* is either

* plain text (any suffix but ``.yaml``/``.yml``): one anchor phrase per line; blank lines
  and lines starting with ``#`` are skipped. It holds one set, named after the file stem
  (``styles.txt`` → ``styles``);
* YAML (``.yaml``/``.yml``): a mapping of set name → set. A set is

  - a list of phrases: ``object: [a photo of a cat, a photo of a dog]``;
  - a mapping with ``phrases:`` (a list), optional ``weights:`` (one non-negative number
    per phrase) and optional ``mix:`` (the set's proportion in the default mixture);
  - a mapping with ``names:`` and ``template:`` (one string with ``{}``, or a list of
    them): every name × template becomes a phrase, in name-major order. ``weights:``
    then has one entry per name (spread evenly over its templates) or one per phrase.

  A YAML file that is a plain list is one set named after the file stem. A key given twice in
  one mapping, at any level, is an error (YAML itself would keep the last).

A set name is any non-empty text without leading or trailing spaces, control characters or the
characters ``,`` ``:`` ``=`` ``\\``, which separate sets, proportions and labels in the specs
below. A file expands to at most :data:`MAX_PHRASES` phrases (names × templates included);
``max_phrases=`` raises the cap.

Example::

    object:
      names: [cat, dog, car]
      template: ["a photo of a {}", "a drawing of a {}"]
      weights: [2, 1, 1]
      mix: 0.7
    style:
      - a watercolor painting
      - a pencil sketch
      - a photograph

A *mixture spec* selects sets of a file and their proportions: ``PATH:NAME[:P][,NAME[:P]…]``,
for example ``anchors.yaml:object:0.7,style:0.3`` (the measure 0.7·q_object + 0.3·q_style,
:meth:`anchordiv.AnchorSet.mixture`) or ``anchors.yaml:style`` (one set). Names without
proportions share the mass equally; either every name has a proportion or none has. A bare
``PATH`` means every set of the file, mixed by their ``mix:`` values (1 each by default).

:func:`embed_anchors` embeds a file with an encoder and caches the result next to it as
``FILE.anchors.<encoder-slug>.npz``; the cache is reused only when the file's content hash,
the encoder name and the set names all match.
"""

from .embedding import (
    EmbeddedAnchors,
    ResolvedAnchors,
    cache_path,
    embed_anchors,
    encoder_slug,
    resolve_anchor_spec,
    resolve_anchors,
)
from .parsing import (
    MAX_PHRASES,
    YAML_SUFFIXES,
    AnchorsFile,
    AnchorTexts,
    check_set_name,
    load_anchor_texts,
    read_anchors_file,
)
from .selection import parse_anchor_spec, parse_selection, select_sets

__all__ = [
    "AnchorTexts",
    "AnchorsFile",
    "EmbeddedAnchors",
    "cache_path",
    "check_set_name",
    "embed_anchors",
    "encoder_slug",
    "load_anchor_texts",
    "MAX_PHRASES",
    "parse_anchor_spec",
    "parse_selection",
    "ResolvedAnchors",
    "read_anchors_file",
    "resolve_anchor_spec",
    "resolve_anchors",
    "select_sets",
    "YAML_SUFFIXES",
]
