"""Embedding runs: :func:`embed_collection` writes a collection resumably, shard by shard."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .._util import atomic_write, positive_int, require
from ..encoders import open_rgb
from .collections import (_EMB_PREFIX, _FORMAT, _FORMAT_VERSION, _ITEM_COLUMN, _KINDS, _METADATA_DIR,
                          _METADATA_PREFIX, MANIFEST_NAME, _check_choice, _manifest_shards, _read_manifest)
from .readers import _first_nonfinite_row, _pandas, _pyarrow

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: What to do when the disk fills up, besides freeing space (ends the error message).
_DISK_FULL_ADVICE = "rerun to resume, or choose another output folder (--out)"

#: Manifest entries a resumed job relies on, with their types.
_MANIFEST_TYPES = (("kind", str), ("n_items", int), ("n_embedded", int), ("n_shards", int),
                   ("complete", bool), ("skipped", list))


@dataclass
class EmbedResult:
    """Summary of an :func:`embed_collection` run.

    Attributes
    ----------
    out_dir : str
        The collection folder.
    kind : {"text", "image"}
        What was embedded.
    n_items : int
        Number of input items.
    n_embedded : int
        Rows written so far, over all shards.
    skipped : list of dict
        Items that could not be read (images only), each ``{"index", "item", "reason"}``
        where ``index`` is the position in the input.
    n_shards : int
        Number of shards of the complete collection.
    shards_written : int
        Shards written by this call (0 when the collection was already complete).
    resumed : bool
        True when this call continued an existing job.
    complete : bool
        True when every shard is written.
    """

    out_dir: str
    kind: str
    n_items: int
    n_embedded: int
    skipped: list[dict]
    n_shards: int
    shards_written: int
    resumed: bool
    complete: bool

    @property
    def n_skipped(self) -> int:
        """Number of skipped items."""
        return len(self.skipped)


# ---------------------------------------------------------------------------
# writing files


class _WriteOnly:
    """File wrapper exposing only ``write``, so numpy writes through it (keeping errno)."""

    def __init__(self, fh: Any) -> None:
        self.write = fh.write


def _write_json(path: Path, obj: Mapping) -> None:
    data = json.dumps(obj, indent=2, sort_keys=False).encode("utf-8")
    atomic_write(path, lambda fh: fh.write(data), advice=_DISK_FULL_ADVICE)


def _write_npy(path: Path, array: np.ndarray) -> None:
    # numpy's fast path (ndarray.tofile) reports a failed write as byte counts without
    # errno, so a full disk could not be recognised; write through fh.write instead.
    atomic_write(path, lambda fh: np.save(_WriteOnly(fh), array, allow_pickle=False), advice=_DISK_FULL_ADVICE)


def _write_parquet(path: Path, frame: "pd.DataFrame") -> None:
    pa, _, pq = _pyarrow()
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(
            f"metadata could not be stored as parquet ({exc}); give each label column a single "
            "type (str, int, float or bool)"
        ) from exc
    atomic_write(path, lambda fh: pq.write_table(table, fh), advice=_DISK_FULL_ADVICE)


# ---------------------------------------------------------------------------
# arguments


def _accepts_kwarg(fn: Callable, name: str) -> bool:
    """Whether ``fn`` can be called with the keyword argument ``name``."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == name and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in params
    )


def _check_dtype(dtype: Any) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt is None or dt not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise ValueError(f"dtype must be 'float32' or 'float16'; got {dtype!r}")
    return dt


def _sha256(values: Iterable[str]) -> str:
    h = hashlib.sha256()
    for v in values:
        h.update(v.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def _sha256_frame(frame: "pd.DataFrame | None") -> str | None:
    if frame is None:
        return None
    h = hashlib.sha256()
    for col in frame.columns:
        h.update(repr(str(col)).encode("utf-8") + b"\x01")
        for v in frame[col].tolist():
            h.update(repr(v).encode("utf-8", "surrogatepass") + b"\x00")
    return h.hexdigest()


def _prepare_items(items: Any, labels: Any, kind: str, item_col: str) -> tuple[list[str], "pd.DataFrame | None"]:
    """Normalise ``items`` to a list of str and ``labels`` to a DataFrame (or None)."""
    pd = _pandas()
    frame_labels = None
    if isinstance(items, pd.DataFrame):
        if item_col not in items.columns:
            raise ValueError(
                f"items is a DataFrame without an {item_col!r} column (kind={kind!r}); "
                f"columns: {[str(c) for c in items.columns]}"
            )
        rest = items.drop(columns=[item_col]).reset_index(drop=True)
        frame_labels = rest if rest.shape[1] else None
        items = items[item_col].tolist()
    elif isinstance(items, (str, bytes, os.PathLike)):
        raise ValueError(
            "items must be a sequence of items, not a single str or path; for a folder of "
            "images pass list_images(folder), for a text file pass read_texts(path)"
        )
    out: list[str] = []
    for i, it in enumerate(list(items)):
        if kind == "text" and not isinstance(it, str):
            raise ValueError(f"items[{i}] is {type(it).__name__}; texts must be str")
        if kind == "image" and not isinstance(it, (str, os.PathLike)):
            raise ValueError(
                f"items[{i}] is {type(it).__name__}; images must be given as file paths "
                "(str or os.PathLike)"
            )
        out.append(os.fspath(it))
    if not out:
        raise ValueError("items is empty; pass at least one item to embed")

    extra = None
    if isinstance(labels, pd.DataFrame):
        extra = labels.reset_index(drop=True)
    elif isinstance(labels, Mapping):
        bad = {str(k): len(v) for k, v in labels.items() if len(v) != len(out)}
        if bad:
            raise ValueError(f"labels columns must have one value per item ({len(out)}); got lengths {bad}")
        extra = pd.DataFrame({str(k): list(v) for k, v in labels.items()})
    elif labels is not None:
        raise ValueError(
            f"labels must be a dict of column -> list or a pandas DataFrame; got {type(labels).__name__}"
        )
    if extra is not None and len(extra) != len(out):
        raise ValueError(f"labels has {len(extra)} rows but there are {len(out)} items")
    if frame_labels is not None and extra is not None:
        clash = set(map(str, frame_labels.columns)) & set(map(str, extra.columns))
        if clash:
            raise ValueError(f"label columns {sorted(clash)} are given both in items and in labels")
        label_df = pd.concat([frame_labels, extra], axis=1)
    else:
        label_df = frame_labels if frame_labels is not None else extra
    if label_df is None or label_df.shape[1] == 0:
        return out, None
    label_df.columns = [str(c) for c in label_df.columns]
    if item_col in label_df.columns:
        raise ValueError(f"a label column must not be named {item_col!r}; it holds the items")
    return out, label_df


# ---------------------------------------------------------------------------
# the job and its manifest


def _resume(out: Path, job: dict) -> dict:
    """The manifest of the unfinished or finished run of ``job`` in ``out``, checked."""
    path = out / MANIFEST_NAME
    manifest = _read_manifest(path)
    old_job = manifest.get("job")
    if manifest.get("format") != _FORMAT or not isinstance(old_job, dict):
        raise ValueError(
            f"out_dir {str(out)!r} holds a {MANIFEST_NAME} not written by embed_collection; "
            "choose another out_dir"
        )
    diff = sorted(k for k in job if old_job.get(k) != job[k])
    if diff:
        details = "; ".join(
            f"{k}: {old_job.get(k)!r} -> {job[k]!r}" if not k.endswith("sha256")
            else f"{k.replace('_sha256', '')} differ" for k in diff
        )
        raise ValueError(
            f"out_dir {str(out)!r} holds a collection from a different job ({details}); "
            "refusing to mix them. Use a new out_dir, or delete this folder to start over"
        )
    bad_keys = [k for k, t in _MANIFEST_TYPES if not isinstance(manifest.get(k), t)]
    if bad_keys:
        raise ValueError(
            f"manifest {str(path)!r} lacks valid {bad_keys}; it was modified. Delete "
            "the collection folder to start over"
        )
    for rec in _manifest_shards(path, manifest):
        for key in ("embeddings", "metadata"):
            if not (out / rec[key]).is_file():
                raise ValueError(
                    f"out_dir {str(out)!r}: the manifest lists {rec[key]!r} but the file is "
                    "missing; the folder was modified, delete it to start over"
                )
    return manifest


def _result(manifest: dict, out: Path, shards_written: int, resumed: bool) -> EmbedResult:
    return EmbedResult(
        out_dir=str(out),
        kind=manifest["kind"],
        n_items=int(manifest["n_items"]),
        n_embedded=int(manifest["n_embedded"]),
        skipped=[dict(s) for s in manifest["skipped"]],
        n_shards=int(manifest["n_shards"]),
        shards_written=shards_written,
        resumed=resumed,
        complete=bool(manifest["complete"]),
    )


def _open_images(items: Sequence[str], idx: list[int], skipped: list[dict]) -> tuple[list, list[int]]:
    """Items ``idx`` opened as RGB images by the encoders' loader; unreadable ones go to ``skipped``."""
    Image = require("PIL.Image", "pillow", "anchordiv.io")
    unreadable = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)
    images, kept = [], []
    for j in idx:
        try:
            images.append(open_rgb(items[j]))
            kept.append(j)
        except unreadable as exc:
            skipped.append({"index": j, "item": items[j], "reason": f"{type(exc).__name__}: {exc}"})
    return images, kept


def _encoder_name(encoder: Any) -> str:
    return str(getattr(encoder, "name", type(encoder).__name__))


def _encoder_info(encoder: Any) -> tuple[int | None, float | None]:
    """The encoder's ``dim`` and ``tau`` (reading ``dim`` may load its model)."""
    dim = getattr(encoder, "dim", None)
    tau = getattr(encoder, "tau", None)
    return (None if dim is None else int(dim)), (None if tau is None else float(tau))


def _unloaded_tau(encoder: Any) -> tuple[bool, float | None]:
    """``(known, tau)``: the encoder's ``tau`` when it can be read without loading a model.

    A :class:`~anchordiv.encoders.LazyEncoder` would load its encoder to answer; its tau
    follows from its spec, which the job compares by name.
    """
    from ..encoders import LazyEncoder

    if isinstance(encoder, LazyEncoder):
        return False, None
    tau = getattr(encoder, "tau", None)
    return True, None if tau is None else float(tau)


def _checked_vectors(vecs: Any, rows: list[int], dim: int | None, np_dtype: np.dtype, enc_name: str,
                     method: str, items: Sequence[str]) -> np.ndarray:
    """The encoder's output for items ``rows`` as ``(len(rows), d)`` in ``np_dtype``, or a ValueError."""
    vecs = np.asarray(vecs)
    if vecs.ndim != 2 or vecs.shape[0] != len(rows):
        raise ValueError(
            f"encoder {enc_name!r}.{method} returned shape {vecs.shape} for {len(rows)} items; "
            f"expected ({len(rows)}, d)"
        )
    if dim is not None and vecs.shape[1] != dim:
        raise ValueError(f"encoder {enc_name!r}.{method} returned dimension {vecs.shape[1]}, expected {dim}")
    vecs = vecs.astype(np_dtype, copy=False)
    bad = _first_nonfinite_row(vecs)
    if bad is not None:
        raise ValueError(
            f"encoder {enc_name!r} produced NaN/inf for item {rows[bad]} ({items[rows[bad]]!r}) "
            f"when stored as {np_dtype.name}"
        )
    return vecs


def _job(kind: str, enc_name: str, np_dtype: np.dtype, shard_size: int, items: list[str],
         label_df: "pd.DataFrame | None", item_col: str) -> dict:
    """What identifies an embedding run; the encoder's ``encoder_dim`` and ``tau`` are filled in later."""
    return {
        "kind": kind, "encoder": enc_name, "encoder_dim": None, "tau": None, "dtype": np_dtype.name,
        "shard_size": shard_size, "n_items": len(items), "items_sha256": _sha256(items),
        "label_columns": None if label_df is None else list(label_df.columns),
        "labels_sha256": _sha256_frame(label_df),
        **({"item_column": item_col} if item_col != _ITEM_COLUMN[kind] else {}),
    }


def _finished_run(out: Path, job: dict, encoder: Any, n_shards: int) -> EmbedResult | None:
    """The result of the finished run of ``job`` in ``out``, else None (shards remain).

    A finished run is recognised without loading the encoder's model (its dim follows from its name).
    """
    known, tau = _unloaded_tau(encoder)
    finished = {k: v for k, v in job.items() if k not in ("encoder_dim", "tau")}
    manifest = _resume(out, {**finished, "tau": tau} if known else finished)
    if len(manifest["shards"]) < n_shards:
        return None
    if not manifest["complete"]:
        manifest["complete"] = True
        _write_json(out / MANIFEST_NAME, manifest)
    return _result(manifest, out, 0, True)


def _new_manifest(out: Path, job: dict, n_shards: int) -> dict:
    """The manifest of a new run of ``job``, written into ``out`` (which must be new or empty)."""
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(
            f"out_dir {str(out)!r} is not empty and has no {MANIFEST_NAME}; "
            "refusing to write into it. Choose a new or empty folder"
        )
    manifest = {
        "format": _FORMAT, "version": _FORMAT_VERSION, "kind": job["kind"], "encoder": job["encoder"],
        "dim": job["encoder_dim"], "tau": job["tau"], "dtype": job["dtype"], "n_items": job["n_items"],
        "n_embedded": 0, "n_skipped": 0, "n_shards": n_shards, "complete": False, "shards": [], "skipped": [],
        "job": job, **({"item_column": job["item_column"]} if "item_column" in job else {}),
    }
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / MANIFEST_NAME, manifest)
    return manifest


@dataclass
class _Shards:
    """The shards of one run: its items and labels, how they are embedded, and where they go."""

    out: Path
    kind: str
    items: list[str]
    labels: "pd.DataFrame | None"
    item_col: str
    np_dtype: np.dtype
    shard_size: int
    batch_size: int
    encode: Callable
    enc_name: str
    method: str

    def bounds(self, i: int) -> tuple[int, int]:
        """The items of shard ``i``: ``items[lo:hi]``."""
        return i * self.shard_size, min(len(self.items), (i + 1) * self.shard_size)

    def embed(self, i: int, dim: int | None, bar: Any) -> tuple[np.ndarray, list[int], list[dict]]:
        """Shard ``i``'s embeddings (``dim`` wide when known), the rows kept and the items skipped."""
        lo, hi = self.bounds(i)
        chunks: list[np.ndarray] = []
        kept: list[int] = []
        skipped: list[dict] = []
        for b in range(lo, hi, self.batch_size):
            idx = list(range(b, min(hi, b + self.batch_size)))
            if self.kind == "text":
                batch, rows = [self.items[j] for j in idx], idx
            else:
                batch, rows = _open_images(self.items, idx, skipped)
            if rows:
                vecs = _checked_vectors(self.encode(batch), rows, dim, self.np_dtype, self.enc_name, self.method,
                                        self.items)
                dim = int(vecs.shape[1])
                chunks.append(vecs)
                kept.extend(rows)
            if self.kind == "image":
                for img in batch:
                    img.close()
            bar.update(len(idx))
        emb = np.concatenate(chunks) if chunks else np.zeros((0, dim or 0), dtype=self.np_dtype)
        return emb, kept, skipped

    def write(self, i: int, manifest: dict, emb: np.ndarray, kept: list[int], skipped: list[dict]) -> None:
        """Write shard ``i`` and record it in ``manifest``; on an error no unrecorded file is left."""
        pd = _pandas()
        meta = pd.DataFrame({self.item_col: [self.items[j] for j in kept]})
        if self.labels is not None:
            meta = pd.concat([meta, self.labels.iloc[kept].reset_index(drop=True)], axis=1)
        prefix = _EMB_PREFIX[self.kind]
        emb_rel = f"{prefix}/{prefix}_{i}.npy"
        meta_rel = f"{_METADATA_DIR}/{_METADATA_PREFIX}_{i}.parquet"
        lo, hi = self.bounds(i)
        manifest["shards"].append({
            "index": i, "embeddings": emb_rel, "metadata": meta_rel,
            "start": lo, "stop": hi, "n_rows": int(emb.shape[0]),
        })
        manifest["skipped"].extend(skipped)
        manifest["n_embedded"] += int(emb.shape[0])
        manifest["n_skipped"] = len(manifest["skipped"])
        if manifest.get("dim") is None and kept:
            manifest["dim"] = int(emb.shape[1])
        manifest["complete"] = i == -(-len(self.items) // self.shard_size) - 1
        try:
            _write_npy(self.out / emb_rel, np.ascontiguousarray(emb, dtype=self.np_dtype))
            _write_parquet(self.out / meta_rel, meta)
            _write_json(self.out / MANIFEST_NAME, manifest)
        except BaseException:
            # leave no unrecorded shard behind (e.g. when the disk fills up)
            for rel in (emb_rel, meta_rel):
                with contextlib.suppress(OSError):
                    (self.out / rel).unlink()
            raise


def _honours_progress(fn: Callable) -> Callable:
    """Run ``fn`` so that ``progress=False`` also silences the bars of the encoder and of its model's loading."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        from .._progress import progress_scope

        progress = sig.bind(*args, **kwargs).arguments.get("progress", True)
        with progress_scope(bool(progress)):
            return fn(*args, **kwargs)

    return run


@_honours_progress
def embed_collection(
    items: Any,
    encoder: Any,
    out_dir: str | os.PathLike,
    kind: str = "text",
    labels: "Mapping[str, Sequence] | pd.DataFrame | None" = None,
    shard_size: int = 10_000,
    dtype: str = "float32",
    progress: bool = True,
    *,
    batch_size: int = 64,
    item_column: str | None = None,
) -> EmbedResult:
    """Embed texts or images with an encoder and write a resumable sharded collection.

    Items are split into consecutive shards of ``shard_size`` items. Each shard's
    embeddings (``img_emb/img_emb_{i}.npy`` or ``text_emb/text_emb_{i}.npy``) and
    metadata (``metadata/metadata_{i}.parquet``) are written to temporary names and
    moved into place with ``os.replace``; the shard is then recorded in
    ``collection.json``. If the job stops, calling the function again with the same
    arguments resumes after the last recorded shard.

    Parameters
    ----------
    items : sequence of str, pandas.Series or pandas.DataFrame
        Texts (``kind="text"``) or image file paths (``kind="image"``). A DataFrame must
        have a ``caption`` (texts) or ``image_path`` (images) column; its other columns
        become label columns (as returned by :func:`read_texts` and :func:`list_images`).
    encoder : object
        Provides ``encode_text(list[str])`` and/or ``encode_images(list[PIL.Image])``
        returning ``(n, d)`` arrays, and attributes ``name`` (str), ``dim`` (int) and
        ``tau`` (float).
    out_dir : str or os.PathLike
        Collection folder: new, empty, or holding an unfinished or finished run of the
        same job.
    kind : {"text", "image"}, optional
        What ``items`` are.
    labels : dict of str to sequence, or pandas.DataFrame, optional
        Extra per-item columns stored in the metadata, one value per item.
    shard_size : int, optional
        Items per shard (the last shard may be shorter; image shards lose skipped items).
    dtype : {"float32", "float16"}, optional
        Storage type of the embedding shards.
    progress : bool, optional
        Show a tqdm progress bar. ``False`` silences every bar of the run, the encoder's
        and its model's loading ("Loading weights") included, and passes
        ``progress=False`` to the encoder when its method accepts that argument.
    batch_size : int, optional
        Items per encoder call.
    item_column : str, optional
        Name of the metadata column holding the items, and of the DataFrame column they
        are read from (default ``caption`` for texts, ``image_path`` for images); a
        collection records it as :attr:`~anchordiv.io.Collection.item_column`.

    Returns
    -------
    EmbedResult
        Counts, the skipped items and whether the collection is complete.

    Raises
    ------
    ValueError
        On invalid arguments; if ``out_dir`` is not empty and holds no manifest; if it
        holds a job with other items, labels, encoder, kind, shard_size or dtype, or a
        malformed manifest; or if the encoder returns arrays of the wrong shape or with
        NaN/inf values.
    OSError
        If the disk is full (ENOSPC/EDQUOT); the message names the file, and nothing
        half-written is left, so the job can be resumed once there is space.

    Notes
    -----
    Images are opened as the encoders open them (:func:`anchordiv.encoders.open_rgb`,
    ``PIL.Image.open(path).convert("RGB")``); files that cannot be opened or decoded are
    skipped and listed (index in ``items``, path, reason) in the result and the manifest.
    Exceptions raised by the encoder are not caught: they stop the job, which can then be
    resumed. One process at a time should write to a folder. A finished job is recognised
    without loading the encoder's model: by its items, labels, encoder name, kind, shard
    size and dtype, and its ``tau`` unless the encoder is a
    :class:`~anchordiv.encoders.LazyEncoder` (whose tau follows from its name).
    """
    kind = _check_choice(kind, "kind", _KINDS)
    np_dtype = _check_dtype(dtype)
    shard_size = positive_int(shard_size, "shard_size")
    batch_size = positive_int(batch_size, "batch_size")
    item_col = str(item_column) if item_column is not None else _ITEM_COLUMN[kind]
    item_list, label_df = _prepare_items(items, labels, kind, item_col)
    enc_name = _encoder_name(encoder)
    method = "encode_text" if kind == "text" else "encode_images"
    job = _job(kind, enc_name, np_dtype, shard_size, item_list, label_df, item_col)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir {str(out)!r} is a file; pass a folder path")
    n_shards = -(-len(item_list) // shard_size)
    resumed = (out / MANIFEST_NAME).is_file()
    if resumed and (finished := _finished_run(out, job, encoder, n_shards)) is not None:
        return finished
    if not callable(getattr(encoder, method, None)):
        raise ValueError(f"encoder {enc_name!r} has no {method}() method, needed for kind={kind!r}")
    job["encoder_dim"], job["tau"] = _encoder_info(encoder)
    manifest = _resume(out, job) if resumed else _new_manifest(out, job, n_shards)

    start = len(manifest["shards"])
    (out / _EMB_PREFIX[kind]).mkdir(parents=True, exist_ok=True)
    (out / _METADATA_DIR).mkdir(parents=True, exist_ok=True)
    from .._progress import progress_bar

    encode = getattr(encoder, method)
    if not progress and _accepts_kwarg(encode, "progress"):
        encode = functools.partial(encode, progress=False)  # silence the encoder's own bars
    shards = _Shards(out, kind, item_list, label_df, item_col, np_dtype, shard_size, batch_size, encode,
                     enc_name, method)
    bar = progress_bar(total=len(item_list), initial=start * shard_size, unit="item", desc=f"embedding {kind}s",
                       show=bool(progress))
    try:
        for i in range(start, n_shards):
            shards.write(i, manifest, *shards.embed(i, manifest.get("dim"), bar))
    finally:
        bar.close()
    return _result(manifest, out, n_shards - start, resumed)
