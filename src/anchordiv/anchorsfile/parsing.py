"""Reading anchors files: plain text or YAML, the schema of a set, and names × templates expansion."""

from __future__ import annotations

import functools
import math
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

from .._util import require, sha256_file

#: Suffixes read as YAML.
YAML_SUFFIXES = (".yaml", ".yml")

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
