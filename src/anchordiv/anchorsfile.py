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

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import unicodedata
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from ._util import atomic_write, require, sha256_file
from .anchors import AnchorSet

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
    "ResolvedAnchors",
    "read_anchors_file",
    "resolve_anchor_spec",
    "resolve_anchors",
]

#: Suffixes read as YAML.
YAML_SUFFIXES = (".yaml", ".yml")

_CACHE_FORMAT = "anchordiv.anchors-cache"
_CACHE_VERSION = 1
#: Characters of the spec syntax, which no set name may hold (a label writes them after a backslash).
_SPEC_CHARS = ",:=\\"
#: Most phrases one anchors file may expand to (every set, names × templates included).
MAX_PHRASES = 100_000


class AnchorTexts(NamedTuple):
    """The phrases of one anchor set and their optional weights.

    Attributes
    ----------
    texts : list of str
        The anchor phrases.
    weights : list of float or None
        One non-negative weight per phrase, or None for uniform weights.
    """

    texts: list[str]
    weights: list[float] | None


@dataclass
class AnchorsFile:
    """The parsed content of an anchors file.

    Attributes
    ----------
    path : pathlib.Path
        The file.
    sets : dict of str to AnchorTexts
        The anchor sets, in file order.
    mix : dict of str to float
        Each set's proportion in the default mixture (1.0 unless the file says ``mix:``).
    sha256 : str
        Hash of the file's bytes.
    """

    path: Path
    sets: dict[str, AnchorTexts]
    mix: dict[str, float]
    sha256: str


@dataclass
class EmbeddedAnchors:
    """The anchor sets of a file, embedded by one encoder.

    Attributes
    ----------
    path : pathlib.Path
        The anchors file.
    sets : dict of str to AnchorSet
        One :class:`~anchordiv.AnchorSet` per set, with texts and weights.
    mix : dict of str to float
        Default mixture proportions of the sets.
    encoder : str
        Name of the encoder that produced the embeddings.
    tau : float or None
        The encoder's temperature.
    cache_file : pathlib.Path or None
        Where the embeddings are cached (None when caching is off or failed).
    from_cache : bool
        True when the embeddings were read from the cache rather than computed.
    n_phrases : int
        Number of phrases over all sets.
    """

    path: Path
    sets: dict[str, AnchorSet]
    mix: dict[str, float]
    encoder: str
    tau: float | None
    cache_file: Path | None = None
    from_cache: bool = False
    n_phrases: int = field(default=0)

    def __post_init__(self) -> None:
        for name in self.sets:
            check_set_name(name, f"anchors of {str(self.path)!r}")

    def anchor_set(self, selection: Sequence[tuple[str, float | None]] | None = None,
                   arg: str = "anchors") -> AnchorSet:
        """One anchor set: a single set or a mixture of several.

        Parameters
        ----------
        selection : sequence of (name, proportion or None), optional
            The sets to use, as returned by :func:`parse_anchor_spec`. ``None`` selects every
            set with its default ``mix`` proportion.
        arg : str, optional
            Name of the argument the selection came from, used in error messages.

        Returns
        -------
        AnchorSet
            The set itself when one set is selected, else
            :meth:`AnchorSet.mixture` of the selected sets.

        Raises
        ------
        ValueError
            For an unknown set name, a repeated name, proportions given for only some sets,
            or proportions that are negative, not finite or all zero.
        """
        names, props = _select(list(self.sets), self.mix, selection, arg, self.path)
        if len(names) == 1:
            return self.sets[names[0]]
        return AnchorSet.mixture([self.sets[n] for n in names], props)


# ---------------------------------------------------------------------------
# reading


def _select(available: Sequence[str], mix: Mapping[str, float],
            selection: Sequence[tuple[str, float | None]] | None, arg: str,
            path: Path) -> tuple[list[str], list[float]]:
    """Validate a set selection against a file's sets; return names and proportions."""
    if selection is None:
        names = list(available)
        props = [float(mix[n]) for n in names]
    else:
        names = [n for n, _ in selection]
        unknown = [n for n in names if n not in available]
        if unknown:
            raise ValueError(
                f"{arg}: unknown anchor set {unknown[0]!r} in {str(path)!r}; "
                f"available sets: {', '.join(available)}"
            )
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"{arg}: anchor set {dup[0]!r} is named twice; name each set once")
        given = [p for _, p in selection]
        if all(p is None for p in given):
            props = [1.0] * len(names)
        elif any(p is None for p in given):
            raise ValueError(
                f"{arg}: give a proportion for every set or for none "
                f"(e.g. {','.join(f'{n}:{1 / len(names):.2g}' for n in names)})"
            )
        else:
            props = [float(p) for p in given]  # type: ignore[arg-type]
    _check_proportions(props, names, arg)
    return names, props


def _check_proportions(props: Sequence[float], names: Sequence[str], arg: str) -> None:
    for n, p in zip(names, props):
        _number(p, f"{arg}: proportion of set {n!r}")
    if sum(props) <= 0:
        raise ValueError(f"{arg}: the proportions are all zero; give at least one set a positive proportion")


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return value


def _phrase_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, list):
        raise ValueError(f"{where} must be a list of strings, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise ValueError(f"{where}[{i}] must be a string, got {type(item).__name__}")
        text = str(item).strip()
        if not text:
            raise ValueError(f"{where}[{i}] is empty")
        out.append(text)
    if not out:
        raise ValueError(f"{where} is empty; give at least one phrase")
    return out


def _templates(value: Any, where: str) -> list[str]:
    templates = [value] if isinstance(value, str) else _phrase_list(value, where)
    for t in templates:
        if "{}" not in t:
            raise ValueError(f"{where}: template {t!r} has no '{{}}' placeholder for the name")
    return templates


def _numbers(value: Any, where: str) -> list[float]:
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of numbers, got {type(value).__name__}")
    return [_number(x, f"{where}[{i}]") for i, x in enumerate(value)]


#: The schema of a YAML set given as a mapping: each key with the check of its value,
#: called as ``check(value, "<set>.<key>")`` and returning the parsed value.
_SET_FIELDS: dict[str, Callable[[Any, str], Any]] = {
    "mix": _number,
    "names": _phrase_list,
    "template": _templates,
    "templates": _templates,
    "phrases": _phrase_list,
    "weights": _numbers,
}

#: Which keys a set needs together: (the keys are wrong, the message).
_SET_RULES: tuple[tuple[Callable[[set], bool], str], ...] = (
    (lambda keys: ("names" in keys) == ("phrases" in keys), "{where} needs exactly one of 'phrases:' or 'names:'"),
    (lambda keys: "names" in keys and ("template" in keys) == ("templates" in keys),
     "{where} with 'names:' needs a 'template:' (a string with {{}} or a list of them)"),
    (lambda keys: "phrases" in keys and bool(keys & {"template", "templates"}),
     "{where}: 'template:' needs 'names:' rather than 'phrases:'"),
)


def _check_count(count: int, total: int, limit: int, where: str, how: str) -> None:
    """Raise unless ``total`` phrases (this set's ``count`` included) fit in ``limit``."""
    if total > limit:
        file_total = f", which brings the file to {total:,} phrases" if total != count else ""
        raise ValueError(f"{where} {how} {count:,} phrases{file_total}, over the cap of {limit:,} per file; "
                         "use fewer names or templates, or pass max_phrases= a larger number")


def _parse_set(spec: Any, where: str, before: int = 0, limit: int = MAX_PHRASES) -> tuple[AnchorTexts, float]:
    """One YAML set → (texts and weights, default mix proportion), checked against the schema and
    against ``limit`` phrases for the file, ``before`` of which earlier sets hold."""
    if isinstance(spec, list):
        texts = _phrase_list(spec, where)
        _check_count(len(texts), before + len(texts), limit, where, "has")
        return AnchorTexts(texts, None), 1.0
    if not isinstance(spec, dict):
        raise ValueError(
            f"{where} must be a list of phrases or a mapping with 'phrases:' or 'names:' and "
            f"'template:', got {type(spec).__name__}"
        )
    unknown = sorted(str(k) for k in spec if k not in _SET_FIELDS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; valid keys are {', '.join(sorted(_SET_FIELDS))}")
    for wrong, message in _SET_RULES:
        if wrong(set(spec)):
            raise ValueError(message.format(where=where))
    value = {key: check(spec[key], f"{where}.{key}") for key, check in _SET_FIELDS.items() if key in spec}
    names = value.get("names", [])
    templates = value.get("template", value.get("templates", []))
    if names:
        count = len(names) * len(templates)
        how = f"expands {len(names):,} names × {len(templates):,} templates ="
    else:
        count, how = len(value["phrases"]), "has"
    _check_count(count, before + count, limit, where, how)
    texts = [t.replace("{}", n) for n in names for t in templates] or value["phrases"]
    weights = value.get("weights")
    if weights is not None:
        if names and len(weights) == len(names) != len(texts):
            weights = [w / len(templates) for w in weights for _ in templates]
        if len(weights) != len(texts):
            per = f"one per name ({len(names)}) or one per phrase ({len(texts)})" if names else \
                f"one per phrase ({len(texts)})"
            raise ValueError(f"{where}.weights has {len(value['weights'])} entries; give {per}")
        if sum(weights) <= 0:
            raise ValueError(f"{where}.weights are all zero; give at least one phrase a positive weight")
    return AnchorTexts(texts, weights), value.get("mix", 1.0)


def check_set_name(name: Any, where: str) -> str:
    """``name`` as a set name (see the module docstring), else a ``ValueError`` starting with ``where``.

    Specs, context names and index names join set names raw (``FILE:a:0.7,b``), so a name
    holding ``,`` ``:`` ``=`` or ``\\`` would name other sets or proportions there.
    """
    if isinstance(name, bool) or not isinstance(name, (str, int, float)):
        raise ValueError(f"{where}: set names must be strings, got {name!r}")
    name = str(name)
    if not name.strip() or name != name.strip():
        raise ValueError(f"{where}: set name {name!r} must be non-empty without leading or trailing spaces")
    bad = [c for c in _SPEC_CHARS if c in name] + sorted({c for c in name if unicodedata.category(c) == "Cc"})
    if bad:
        raise ValueError(
            f"{where}: set name {name!r} holds {', '.join(repr(c) for c in bad)}; set names may not hold "
            "',' ':' '=' '\\' or control characters, which separate sets, proportions and labels in "
            "FILE:NAME[:P],NAME specs; rename the set"
        )
    return name


def _split_spec(text: str, sep: str, maxsplit: int = -1) -> list[str]:
    """``text`` split at the ``sep`` characters not escaped by a backslash (escapes kept)."""
    parts, cur, i = [], [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            cur.append(text[i:i + 2])
            i += 2
            continue
        if ch == sep and maxsplit != 0:
            parts.append("".join(cur))
            cur, maxsplit = [], maxsplit - 1
        else:
            cur.append(ch)
        i += 1
    return parts + ["".join(cur)]


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


class _DuplicateKey(Exception):
    """A key given twice in one YAML mapping (``line`` counts from 1)."""

    def __init__(self, key: Any, line: int):
        super().__init__(key, line)
        self.key, self.line = key, line


@functools.cache
def _unique_key_loader() -> type:
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping, at any level
    (SafeLoader keeps the last); keys brought in by a ``<<`` merge may be overridden."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: SafeLoader's own error follows
                    continue
                if duplicate:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def read_anchors_file(path: str | os.PathLike, *, max_phrases: int = MAX_PHRASES) -> AnchorsFile:
    """Parse an anchors file (plain text or YAML).

    Parameters
    ----------
    path : str or os.PathLike
        The file; ``.yaml``/``.yml`` files are read as YAML, others as plain text.
    max_phrases : int, optional
        Most phrases the file may expand to, over all sets (names × templates included).

    Returns
    -------
    AnchorsFile
        The sets with their phrases, weights and default mixture proportions, and the
        file's content hash.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        If the file holds no anchors, is not valid YAML, gives a key twice in one mapping, names a
        set with a character that specs reserve, expands to more than ``max_phrases`` phrases,
        or a set is malformed.
    ImportError
        If a YAML file is given and PyYAML is not installed.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"anchors file {str(p)!r} does not exist")
    if p.is_dir():
        raise ValueError(f"anchors file {str(p)!r} is a directory; pass a .txt or .yaml file")
    digest = sha256_file(p)
    where = f"anchors file {str(p)!r}"
    stem = check_set_name(re.sub(r"[,:=\\\s\x00-\x1f\x7f-\x9f]+", "_", p.stem) or "anchors", where)
    if p.suffix.lower() in YAML_SUFFIXES:
        yaml = require("yaml", "pyyaml", "YAML anchors files")
        try:
            with open(p, encoding="utf-8") as fh:
                data = yaml.load(fh, Loader=_unique_key_loader())
        except _DuplicateKey as exc:
            raise ValueError(f"{where}: duplicate key {exc.key!r} at line {exc.line}; "
                             "give each set and each key of a set once") from None
        except yaml.YAMLError as exc:
            msg = " ".join(str(exc).split())
            raise ValueError(f"{where} is not valid YAML: {msg}") from None
        if isinstance(data, list):
            data = {stem: data}
        if data is not None and not isinstance(data, dict):
            raise ValueError(f"{where} must hold a mapping of set name -> set, got {type(data).__name__}")
        if not data:
            raise ValueError(f"{where} is empty; give at least one anchor set")
        sets: dict[str, AnchorTexts] = {}
        mix: dict[str, float] = {}
        for raw_name, spec in data.items():
            name = check_set_name(raw_name, where)
            if name in sets:
                raise ValueError(f"{where}: set {name!r} is defined twice")
            before = sum(len(t.texts) for t in sets.values())
            sets[name], mix[name] = _parse_set(spec, f"{where}: set {name!r}", before, max_phrases)
        if sum(mix.values()) <= 0:
            raise ValueError(f"{where}: every set has mix: 0; give one a positive mix")
    else:
        with open(p, encoding="utf-8") as fh:
            texts = [t for t in (line.strip() for line in fh) if t and not t.startswith("#")]
        if not texts:
            raise ValueError(f"{where} holds no anchors (only blank lines or # comments)")
        _check_count(len(texts), len(texts), max_phrases, f"{where}: set {stem!r}", "has")
        sets, mix = {stem: AnchorTexts(texts, None)}, {stem: 1.0}
    return AnchorsFile(path=p, sets=sets, mix=mix, sha256=digest)


def load_anchor_texts(path: str | os.PathLike) -> dict[str, AnchorTexts]:
    """The anchor sets of a file as set name → (texts, weights).

    Parameters
    ----------
    path : str or os.PathLike
        Plain-text or YAML anchors file (see the module docstring for the format).

    Returns
    -------
    dict of str to AnchorTexts
        ``weights`` is None for sets with uniform weights.

    Examples
    --------
    >>> sets = load_anchor_texts("anchors.yaml")          # doctest: +SKIP
    >>> texts, weights = sets["object"]                   # doctest: +SKIP
    """
    return read_anchors_file(path).sets


# ---------------------------------------------------------------------------
# embedding and caching


def encoder_slug(name: str) -> str:
    """A file-name-safe form of an encoder name (with a short hash when characters were changed).

    Parameters
    ----------
    name : str
        Encoder name, e.g. ``"minilm"`` or ``"open_clip:ViT-B-32/laion2b_s34b_b79k"``.

    Returns
    -------
    str
        E.g. ``"minilm"``, ``"open_clip-ViT-B-32-laion2b_s34b_b79k-3f2a9c1d"``.
    """
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:64] or "encoder"
    if slug != name:
        slug += "-" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:8]
    return slug


def cache_path(path: str | os.PathLike, encoder_name: str) -> Path:
    """Where :func:`embed_anchors` caches the embeddings of ``path`` made by ``encoder_name``.

    Returns
    -------
    pathlib.Path
        ``FILE.anchors.<encoder-slug>.npz`` in the folder of ``path``.
    """
    p = Path(path)
    return p.with_name(f"{p.name}.anchors.{encoder_slug(encoder_name)}.npz")


def _encoder_name(encoder: Any) -> str:
    if isinstance(encoder, str):
        return encoder
    name = getattr(encoder, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError("encoder must be an encoder spec string or an object with a non-empty .name")
    return name


def _read_cache(file: Path, digest: str, encoder_name: str, names: list[str]) -> dict | None:
    """The cached arrays when ``file`` matches the hash, the encoder and the file's set names, else None."""
    if not file.is_file():
        return None
    try:
        with np.load(file, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
        ok = (
            str(data["format"]) == _CACHE_FORMAT
            and int(data["version"]) == _CACHE_VERSION
            and str(data["sha256"]) == digest
            and str(data["encoder"]) == encoder_name
            and [str(n) for n in data["set_names"]] == names
        )
    except Exception:  # a corrupt or foreign cache is recomputed
        return None
    return data if ok else None


def _write_cache(file: Path, arrays: Mapping[str, np.ndarray]) -> bool:
    try:
        atomic_write(file, lambda fh: np.savez(fh, **arrays), advice="pass cache=False")
        return True
    except OSError as exc:
        warnings.warn(f"could not write the anchor cache {str(file)!r} ({exc}); continuing without it",
                      stacklevel=3)
        return False


def embed_anchors(path: str | os.PathLike, encoder: Any, *, cache: bool = True,
                  refresh: bool = False, max_phrases: int = MAX_PHRASES) -> EmbeddedAnchors:
    """Embed the anchor sets of a file, reusing or writing a cache next to it.

    Parameters
    ----------
    path : str or os.PathLike
        Plain-text or YAML anchors file.
    encoder : Encoder or str
        An encoder (``encode_text``, ``name``, ``tau``), or an encoder spec such as
        ``"minilm"``, loaded with :func:`anchordiv.encoders.load` only when the cache
        cannot be used. An object is asked for ``encode_text`` and ``tau`` only on a
        cache miss, so a lazily loading encoder is never loaded for a cache hit.
    cache : bool, optional
        Read and write ``FILE.anchors.<encoder-slug>.npz``.
    refresh : bool, optional
        Ignore an existing cache and recompute it.
    max_phrases : int, optional
        Most phrases the file may expand to (:func:`read_anchors_file`).

    Returns
    -------
    EmbeddedAnchors
        One AnchorSet per set, the default mixture proportions, the encoder name and tau.

    Notes
    -----
    The cache holds the embeddings, phrases, weights, set boundaries, the encoder name,
    its tau and the SHA-256 of the file's bytes. It is reused only when that hash and the
    encoder name both match; otherwise it is recomputed and overwritten. A cache that
    cannot be written (read-only folder) only triggers a warning.
    """
    parsed = read_anchors_file(path, max_phrases=max_phrases)
    name = _encoder_name(encoder)
    file = cache_path(parsed.path, name)
    names = list(parsed.sets)
    data = _read_cache(file, parsed.sha256, name, names) if cache and not refresh else None
    from_cache = data is not None
    if data is None:
        if isinstance(encoder, str):
            from . import encoders

            encoder = encoders.load(encoder)
        all_texts = [t for s in parsed.sets.values() for t in s.texts]
        unique = list(dict.fromkeys(all_texts))
        vecs = np.asarray(encoder.encode_text(unique), dtype=np.float32)
        if vecs.ndim != 2 or vecs.shape[0] != len(unique):
            raise ValueError(f"encoder {name!r} returned shape {vecs.shape} for {len(unique)} anchor phrases")
        row = {t: i for i, t in enumerate(unique)}
        emb = vecs[[row[t] for t in all_texts]]
        tau = getattr(encoder, "tau", None)
        offsets = np.cumsum([0] + [len(parsed.sets[n].texts) for n in names]).astype(np.int64)
        weights = np.concatenate([
            np.asarray(parsed.sets[n].weights if parsed.sets[n].weights is not None
                       else [np.nan] * len(parsed.sets[n].texts), dtype=np.float64)
            for n in names
        ])
        data = {
            "format": np.array(_CACHE_FORMAT), "version": np.array(_CACHE_VERSION),
            "sha256": np.array(parsed.sha256), "encoder": np.array(name),
            "tau": np.array(np.nan if tau is None else float(tau)),
            "embeddings": emb, "texts": np.array(all_texts, dtype=str),
            "weights": weights, "set_names": np.array(names, dtype=str), "set_offsets": offsets,
            "mix": np.array([parsed.mix[n] for n in names], dtype=np.float64),
        }
        written = _write_cache(file, data) if cache else False
        cache_file = file if written else None
    else:
        cache_file = file
    sets: dict[str, AnchorSet] = {}
    offsets = data["set_offsets"]
    texts = [str(t) for t in data["texts"]]
    for i, n in enumerate(str(x) for x in data["set_names"]):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        w = data["weights"][lo:hi]
        sets[n] = AnchorSet(np.array(data["embeddings"][lo:hi]), texts=texts[lo:hi],
                            weights=None if np.isnan(w).all() else w)
    tau_value = float(data["tau"])
    return EmbeddedAnchors(
        path=parsed.path, sets=sets, mix=dict(zip(sets, (float(m) for m in data["mix"]))),
        encoder=name, tau=None if math.isnan(tau_value) else tau_value,
        cache_file=cache_file, from_cache=from_cache, n_phrases=len(texts),
    )


# ---------------------------------------------------------------------------
# specs


def _parse_selection(text: str, arg: str,
                     labels: dict[str, str] | None = None) -> list[tuple[str, float | None]]:
    """``NAME[:P],...`` (``\\`` escapes ``,``, ``:``, ``=``); with ``labels``, also
    ``NAME=LABEL[:P]``, whose ``NAME → LABEL`` goes into ``labels``."""
    if not text.strip():
        raise ValueError(f"{arg}: empty set selection after ':'; write PATH or PATH:NAME[:P][,NAME[:P]...]")
    out: list[tuple[str, float | None]] = []
    for part in _split_spec(text, ","):
        part = part.strip()
        if not part:
            raise ValueError(f"{arg}: empty entry in the set selection {text!r}")
        name, *rest = _split_spec(part, ":", 1)
        prop, sep = (rest[0], True) if rest else ("", False)
        name, *label = _split_spec(name, "=", 1) if labels is not None else [name]
        name = _unescape(name.strip())
        if not name:
            raise ValueError(f"{arg}: missing set name in {part!r}")
        if label:
            if not _unescape(label[0]).strip():
                raise ValueError(f"{arg}: missing label after '=' in {part!r}; write SET=LABEL")
            labels[name] = _unescape(label[0]).strip()
        if not sep:
            out.append((name, None))
            continue
        try:
            value = float(prop)
            if not math.isfinite(value):
                raise ValueError(prop)
        except ValueError:
            raise ValueError(
                f"{arg}: bad proportion {prop!r} for set {name!r}; write NAME:P with a finite number P >= 0, "
                "e.g. object:0.7,style:0.3"
            ) from None
        out.append((name, value))
    return out


def parse_anchor_spec(spec: str | os.PathLike, arg: str = "anchors",
                      labels: dict[str, str] | None = None) -> tuple[Path, list[tuple[str, float | None]] | None]:
    """Split ``PATH[:NAME[:P][,NAME[:P]...]]`` into the file and the set selection.

    The longest prefix of ``spec`` that names an existing file is the path (so paths
    containing ``:`` work); the rest, after a ``:``, is the selection. Set names hold none of
    ``,`` ``:`` ``=`` ``\\`` (:func:`check_set_name`); spaces need no escape. With a ``labels``
    dict, entries ``NAME=LABEL`` are also accepted and ``NAME → LABEL`` is stored in it (``eval
    table --multilabel``); a label writes ``,`` ``:`` ``=`` ``\\`` with a backslash before each.

    Parameters
    ----------
    spec : str or os.PathLike
        E.g. ``"anchors.yaml"``, ``"anchors.yaml:style"``, ``"anchors.yaml:object:0.7,style:0.3"``.
    arg : str, optional
        Name of the argument, used in error messages.

    Returns
    -------
    path : pathlib.Path
    selection : list of (name, proportion or None), or None
        None when ``spec`` is a bare path.

    Raises
    ------
    FileNotFoundError
        If no prefix of ``spec`` is an existing file.
    ValueError
        If the selection is malformed.
    """
    s = os.fspath(spec)
    if not s:
        raise ValueError(f"{arg}: empty anchors spec; pass a file such as anchors.yaml")
    if os.path.isfile(s):
        return Path(s), None
    for i in [m.start() for m in re.finditer(":", s)][::-1]:
        if os.path.isfile(s[:i]):
            return Path(s[:i]), _parse_selection(s[i + 1:], arg, labels)
    head = s.split(":", 1)[0] if not os.path.exists(s) else s
    if os.path.isdir(head):
        raise ValueError(f"{arg}: {head!r} is a directory; pass an anchors file (.txt or .yaml)")
    raise FileNotFoundError(
        f"{arg}: anchors file {head!r} does not exist (expected PATH or PATH:NAME[:P][,NAME[:P]...])"
    )


@dataclass
class ResolvedAnchors:
    """The result of :func:`resolve_anchor_spec`.

    Attributes
    ----------
    anchors : AnchorSet
        The selected set or mixture.
    embedded : EmbeddedAnchors
        Every set of the file, with the encoder name, tau and cache details.
    selection : list of (name, proportion or None), or None
        The parsed selection (None for a bare path).
    """

    anchors: AnchorSet
    embedded: EmbeddedAnchors
    selection: list[tuple[str, float | None]] | None


def resolve_anchor_spec(spec_or_path: str | os.PathLike, encoder: Any, *, arg: str = "anchors",
                        cache: bool = True, max_phrases: int = MAX_PHRASES) -> ResolvedAnchors:
    """Like :func:`resolve_anchors`, but also return the embedded file and the selection.

    The selection is checked against the file before anything is embedded, so a wrong
    set name or proportion fails fast.

    Returns
    -------
    ResolvedAnchors
    """
    path, selection = parse_anchor_spec(spec_or_path, arg)
    try:
        parsed = read_anchors_file(path, max_phrases=max_phrases)
    except ValueError as exc:
        raise ValueError(f"{arg}: {exc}") from None
    _select(list(parsed.sets), parsed.mix, selection, arg, parsed.path)
    emb = embed_anchors(path, encoder, cache=cache, max_phrases=max_phrases)
    return ResolvedAnchors(emb.anchor_set(selection, arg=arg), emb, selection)


def resolve_anchors(spec_or_path: str | os.PathLike, encoder: Any, *, arg: str = "anchors",
                    cache: bool = True, max_phrases: int = MAX_PHRASES) -> AnchorSet:
    """An :class:`~anchordiv.AnchorSet` from an anchors file or a mixture spec.

    Parameters
    ----------
    spec_or_path : str or os.PathLike
        ``PATH`` (every set, mixed by the file's ``mix:`` values) or
        ``PATH:NAME[:P][,NAME[:P]...]``, e.g. ``anchors.yaml:object:0.7,style:0.3``.
    encoder : Encoder or str
        Encoder or encoder spec (see :func:`embed_anchors`).
    arg : str, optional
        Name of the argument the spec came from, used in error messages.
    cache : bool, optional
        Use the embeddings cache next to the file.
    max_phrases : int, optional
        Most phrases the file may expand to (:func:`read_anchors_file`).

    Returns
    -------
    AnchorSet
        A single set, or the mixture q = Σ_j p_j q_j of the selected sets.

    Raises
    ------
    FileNotFoundError
        If the file does not exist.
    ValueError
        For an empty or malformed file, an unknown set name, or bad proportions; the
        message starts with ``arg``.

    Examples
    --------
    >>> A = resolve_anchors("anchors.yaml:object:0.7,style:0.3", "minilm")   # doctest: +SKIP
    """
    return resolve_anchor_spec(spec_or_path, encoder, arg=arg, cache=cache, max_phrases=max_phrases).anchors
