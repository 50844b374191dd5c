"""Selection specs: ``PATH[:NAME[:P][,NAME[:P]...]]`` parsed and checked against a file's sets."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

from .parsing import _number


def select_sets(available: Sequence[str], mix: Mapping[str, float],
                selection: Sequence[tuple[str, float | None]] | None, arg: str,
                path: Path) -> tuple[list[str], list[float]]:
    """The names and proportions of ``selection`` (None: every set, mixed by ``mix``), checked against
    the sets ``available`` in the file ``path``; a ``ValueError`` starts with ``arg``."""
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


def parse_selection(text: str, arg: str,
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
            return Path(s[:i]), parse_selection(s[i + 1:], arg, labels)
    head = s.split(":", 1)[0] if not os.path.exists(s) else s
    if os.path.isdir(head):
        raise ValueError(f"{arg}: {head!r} is a directory; pass an anchors file (.txt or .yaml)")
    raise FileNotFoundError(
        f"{arg}: anchors file {head!r} does not exist (expected PATH or PATH:NAME[:P][,NAME[:P]...])"
    )
