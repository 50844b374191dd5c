"""Embedding the sets of an anchors file, caching them next to it, and resolving specs to an AnchorSet."""

from __future__ import annotations

import hashlib
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .._util import atomic_write
from ..anchors import AnchorSet
from .parsing import MAX_PHRASES, check_set_name, read_anchors_file
from .selection import parse_anchor_spec, select_sets

_CACHE_FORMAT = "anchordiv.anchors-cache"
_CACHE_VERSION = 1


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
        names, props = select_sets(list(self.sets), self.mix, selection, arg, self.path)
        if len(names) == 1:
            return self.sets[names[0]]
        return AnchorSet.mixture([self.sets[n] for n in names], props)


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
            from .. import encoders

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
    select_sets(list(parsed.sets), parsed.mix, selection, arg, parsed.path)
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
