"""Reading and writing embedding collections.

A *collection* is a set of embeddings of texts or images computed once by a fixed
encoder, with per-row metadata. On disk it uses the clip-retrieval / autofaiss
layout::

    out_dir/
        collection.json                 # manifest (written by embed_collection)
        img_emb/img_emb_0.npy           # or text_emb/text_emb_0.npy; (n_i, d) arrays
        img_emb/img_emb_1.npy
        ...
        metadata/metadata_0.parquet     # image_path or caption column + label columns,
        metadata/metadata_1.parquet     # same row order as the matching shard
        ...

:func:`embed_collection` writes such a folder, resumably: each shard is written
atomically and recorded in the manifest, and a rerun with the same arguments continues
after the last recorded shard. :func:`load_collection` reads that layout (with or
without a manifest) and also a parquet file with an ``embedding`` column, a plain
``.npy`` file, or a folder of ``.npy`` shards.

pandas and pyarrow are needed for parquet and metadata, Pillow for images; they are
imported only when used.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import inspect
import json
import os
import re
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "IMAGE_EXTENSIONS",
    "MANIFEST_NAME",
    "Collection",
    "EmbedResult",
    "embed_collection",
    "list_images",
    "load_collection",
    "read_texts",
]

#: File extensions (lower case) that :func:`list_images` picks up.
IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm",
)

#: Name of the manifest file inside a collection folder.
MANIFEST_NAME = "collection.json"

_FORMAT = "anchordiv.collection"
_FORMAT_VERSION = 1
_KINDS = ("text", "image")
_EMB_PREFIX = {"image": "img_emb", "text": "text_emb"}
_ITEM_COLUMN = {"image": "image_path", "text": "caption"}
_METADATA_DIR = "metadata"
_METADATA_PREFIX = "metadata"
_PARTIAL_MARK = ".partial-"
_FINITE_CHECK_ROWS = 65536


# ---------------------------------------------------------------------------
# optional dependencies


def _pandas():
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "anchordiv.io needs pandas for metadata; install it with `pip install pandas pyarrow`"
        ) from exc
    return pd


def _pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "anchordiv.io needs pyarrow for parquet files; install it with `pip install pyarrow`"
        ) from exc
    return pa, pc, pq


def _pil_image():
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "anchordiv.io needs Pillow to read images; install it with `pip install pillow`"
        ) from exc
    return Image


# ---------------------------------------------------------------------------
# Collection


@dataclass(repr=False, eq=False)
class Collection:
    """Embeddings of a set of texts or images, with optional per-row metadata.

    Parameters
    ----------
    embeddings : numpy.ndarray of shape (n, d)
        One embedding per row (float32 unless loaded with another ``dtype``; a read-only
        ``numpy.memmap`` when loaded with ``mmap=True`` from a single file).
    metadata : pandas.DataFrame or None
        One row per embedding, same order (for example ``image_path`` or ``caption``
        and label columns).
    kind : {"text", "image"} or None
        What was embedded, when known.
    tau : float or None
        Temperature of the encoder, from the manifest when present.
    encoder : str or None
        Name of the encoder, from the manifest when present.
    path : str or None
        Where the collection was read from.
    manifest : dict or None
        The parsed ``collection.json``, when present.

    Examples
    --------
    >>> import numpy as np
    >>> c = Collection(np.eye(3, dtype=np.float32))
    >>> len(c), c.dim
    (3, 3)
    """

    embeddings: np.ndarray
    metadata: "pd.DataFrame | None" = None
    kind: str | None = None
    tau: float | None = None
    encoder: str | None = None
    path: str | None = None
    manifest: dict | None = field(default=None)

    def __post_init__(self) -> None:
        if not isinstance(self.embeddings, np.ndarray):
            self.embeddings = np.asarray(self.embeddings)
        if self.embeddings.ndim != 2:
            raise ValueError(
                f"embeddings must be a 2-D array of shape (n, d); got shape {self.embeddings.shape}"
            )
        if self.metadata is not None and len(self.metadata) != self.embeddings.shape[0]:
            raise ValueError(
                f"metadata has {len(self.metadata)} rows but embeddings has "
                f"{self.embeddings.shape[0]}; they must describe the same rows in the same order"
            )

    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def dim(self) -> int:
        """Embedding dimension ``d``."""
        return int(self.embeddings.shape[1])

    @property
    def columns(self) -> list[str]:
        """Metadata column names (empty when there is no metadata)."""
        return [] if self.metadata is None else [str(c) for c in self.metadata.columns]

    def labels(self, column: str) -> np.ndarray:
        """Values of one metadata column, one per embedding.

        Parameters
        ----------
        column : str
            Metadata column name, for example ``"label"``, ``"caption"`` or ``"image_path"``.

        Returns
        -------
        numpy.ndarray of shape (n,)

        Raises
        ------
        ValueError
            If the collection has no metadata.
        KeyError
            If ``column`` is not a metadata column.
        """
        if self.metadata is None:
            raise ValueError(
                "this collection has no metadata, so labels(column) has nothing to return; "
                "load a collection that has metadata/ shards or parquet columns besides the embedding"
            )
        if column not in self.metadata.columns:
            raise KeyError(
                f"column {column!r} is not in the metadata; available columns: {self.columns}"
            )
        return self.metadata[column].to_numpy()

    def __repr__(self) -> str:
        n, d = self.embeddings.shape
        parts = [f"n={n}", f"dim={d}", f"dtype={self.embeddings.dtype}"]
        if self.kind is not None:
            parts.append(f"kind={self.kind!r}")
        if self.encoder is not None:
            parts.append(f"encoder={self.encoder!r}")
        if self.tau is not None:
            parts.append(f"tau={self.tau!r}")
        if self.metadata is not None:
            parts.append(f"columns={self.columns}")
        return f"Collection({', '.join(parts)})"


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
# small helpers


def _natural_key(name: str) -> list:
    """Sort key that orders embedded integers numerically (``x_2`` before ``x_10``)."""
    parts = re.split(r"(\d+)", name)
    return [int(p) if i % 2 else p for i, p in enumerate(parts)]


_DISK_FULL_ERRNOS = {errno.ENOSPC} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    """Write ``path`` through a temporary sibling file and ``os.replace``.

    The temporary file is removed on any error; a full disk (ENOSPC, EDQUOT) is
    re-raised as an OSError that names ``path`` and the fix.
    """
    tmp = path.with_name(f"{path.name}{_PARTIAL_MARK}{uuid.uuid4().hex}")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS:
            raise OSError(
                exc.errno,
                f"the disk is full (or over quota) while writing {str(path)!r}; nothing "
                "half-written was kept. Free some space and rerun to resume, or choose another "
                "output folder (--out)",
            ) from exc
        raise


class _WriteOnly:
    """File wrapper exposing only ``write``, so numpy writes through it (keeping errno)."""

    def __init__(self, fh: Any) -> None:
        self.write = fh.write


def _write_json(path: Path, obj: Mapping) -> None:
    data = json.dumps(obj, indent=2, sort_keys=False).encode("utf-8")
    _atomic_write(path, lambda fh: fh.write(data))


def _write_npy(path: Path, array: np.ndarray) -> None:
    # numpy's fast path (ndarray.tofile) reports a failed write as byte counts without
    # errno, so a full disk could not be recognised; write through fh.write instead.
    _atomic_write(path, lambda fh: np.save(_WriteOnly(fh), array, allow_pickle=False))


def _write_parquet(path: Path, frame: "pd.DataFrame") -> None:
    pa, _, pq = _pyarrow()
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise ValueError(
            f"metadata could not be stored as parquet ({exc}); give each label column a single "
            "type (str, int, float or bool)"
        ) from exc
    _atomic_write(path, lambda fh: pq.write_table(table, fh))


def _check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}")
    return value


def _check_positive_int(value: Any, name: str) -> int:
    """``value`` as a Python int >= 1; numpy integers are accepted, bools and floats are not."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


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


def _check_dtype(dtype: Any, name: str = "dtype") -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise ValueError(f"{name} must be 'float32' or 'float16'; got {dtype!r}") from exc
    if dt not in (np.dtype(np.float32), np.dtype(np.float16)):
        raise ValueError(f"{name} must be 'float32' or 'float16'; got {dtype!r}")
    return dt


def _sha256_strings(values: Iterable[str]) -> str:
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
        h.update(repr(str(col)).encode("utf-8"))
        h.update(b"\x01")
        for v in frame[col].tolist():
            h.update(repr(v).encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
    return h.hexdigest()


def _first_nonfinite_row(array: np.ndarray) -> int | None:
    """Index of the first row holding NaN or inf, or None; reads in blocks."""
    for start in range(0, array.shape[0], _FINITE_CHECK_ROWS):
        block = np.asarray(array[start:start + _FINITE_CHECK_ROWS])
        bad = ~np.isfinite(block).all(axis=1)
        if bad.any():
            return start + int(np.argmax(bad))
    return None


def _open_image(item: str):
    """Open ``item`` as an RGB PIL image; return ``(image, None)`` or ``(None, reason)``."""
    Image = _pil_image()
    errors: tuple[type[BaseException], ...] = (
        OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError,
    )
    try:
        with Image.open(item) as im:
            return im.convert("RGB"), None
    except errors as exc:
        return None, f"{type(exc).__name__}: {exc}"


# ---------------------------------------------------------------------------
# inputs


def list_images(
    folder: str | os.PathLike,
    *,
    extensions: Iterable[str] = IMAGE_EXTENSIONS,
    label_column: str | None = "label",
) -> "pd.DataFrame":
    """List the image files under a folder, recursively and in sorted order.

    Parameters
    ----------
    folder : str or os.PathLike
        Root folder.
    extensions : iterable of str, optional
        File extensions to keep, compared case-insensitively (default
        :data:`IMAGE_EXTENSIONS`).
    label_column : str or None, optional
        Name of a column holding each file's parent folder name (``"label"`` by default,
        which suits ``root/<class>/<file>`` trees); ``None`` for no label column.

    Returns
    -------
    pandas.DataFrame
        Column ``image_path`` (``folder`` joined with the relative path, as str), plus the
        label column. Rows are sorted by relative path. Files are not opened, so
        unreadable images are listed too; :func:`embed_collection` skips them.

    Raises
    ------
    FileNotFoundError
        If ``folder`` does not exist or holds no file with one of ``extensions``.
    ValueError
        If ``folder`` is not a directory.
    """
    pd = _pandas()
    root = Path(folder)
    if not root.exists():
        raise FileNotFoundError(f"folder {str(root)!r} does not exist; pass an existing image folder")
    if not root.is_dir():
        raise ValueError(f"folder {str(root)!r} is a file, not a directory; pass the folder that holds the images")
    exts = {e.lower() if e.startswith(".") else "." + e.lower() for e in extensions}
    rels = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.suffix.lower() in exts and p.is_file()
    )
    if not rels:
        raise FileNotFoundError(
            f"no image files with extensions {sorted(exts)} under folder {str(root)!r}; "
            "check the path or pass extensions="
        )
    paths = [str(root / r) for r in rels]
    data: dict[str, list] = {"image_path": paths}
    if label_column is not None:
        if label_column == "image_path":
            raise ValueError("label_column must not be 'image_path'; choose another name")
        data[label_column] = [(root / r).parent.name for r in rels]
    return pd.DataFrame(data)


def read_texts(
    path: str | os.PathLike,
    column: str | None = None,
    *,
    encoding: str = "utf-8",
) -> "pd.DataFrame":
    """Read texts to embed from a text, CSV/TSV or parquet file.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.csv``, ``.tsv`` or ``.parquet`` file with a text column, or any other file
        read as plain text with one item per line (surrounding whitespace stripped,
        blank lines skipped).
    column : str, optional
        The text column of a CSV/TSV/parquet file. By default ``"caption"``, else
        ``"text"``, else the only string column.
    encoding : str, optional
        Encoding of text and CSV files.

    Returns
    -------
    pandas.DataFrame
        Column ``caption`` with the texts; for tables, the other columns follow as label
        columns. Rows whose text is missing or blank are dropped (with a warning for
        tables). In CSV/TSV files only empty cells are missing: "NA", "None", "null" and
        the like are kept as text.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If the text column cannot be determined, ``column`` is missing, ``column`` is
        given for a plain text file, or no text remains.
    """
    pd = _pandas()
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"path {str(p)!r} does not exist; pass a .txt, .csv, .tsv or .parquet file")
    if p.is_dir():
        raise ValueError(f"path {str(p)!r} is a directory; pass a .txt, .csv, .tsv or .parquet file")
    suffix = p.suffix.lower()
    if suffix in (".csv", ".tsv", ".parquet"):
        if suffix == ".parquet":
            frame = pd.read_parquet(p)
        else:
            # only empty cells are missing: captions such as "None", "NA" or "null" are text
            read = dict(sep="\t" if suffix == ".tsv" else ",", encoding=encoding, keep_default_na=False, na_values=[""])
            frame = pd.read_csv(p, **read)
            as_read = pd.read_csv(p, dtype=str, **read)  # the text column as written ("007" stays "007")
        cols = [str(c) for c in frame.columns]
        if column is None:
            if "caption" in cols:
                column = "caption"
            elif "text" in cols:
                column = "text"
            else:
                str_cols = [
                    c for c in frame.columns
                    if frame[c].dtype == object or pd.api.types.is_string_dtype(frame[c].dtype)
                ]
                if len(str_cols) != 1:
                    raise ValueError(
                        f"cannot tell which column of {str(p)!r} holds the texts (columns: {cols}); "
                        "pass column="
                    )
                column = str(str_cols[0])
        if column not in frame.columns:
            raise ValueError(f"column {column!r} is not in {str(p)!r}; available columns: {cols}")
        if column != "caption" and "caption" in frame.columns:
            raise ValueError(
                f"{str(p)!r} has a 'caption' column besides the text column {column!r}; "
                "rename one of them or pass column='caption'"
            )
        if suffix != ".parquet":
            frame[column] = as_read[column]
        texts = frame[column]
        keep = texts.notna().to_numpy() & (texts.astype(str).str.strip() != "").to_numpy()
        if not keep.all():
            warnings.warn(
                f"read_texts: dropped {int((~keep).sum())} rows of {str(p)!r} with a missing or blank "
                f"{column!r}",
                stacklevel=2,
            )
        frame = frame.loc[keep].reset_index(drop=True)
        frame[column] = frame[column].astype(str)
        frame = frame.rename(columns={column: "caption"})
        frame = frame[["caption"] + [c for c in frame.columns if c != "caption"]]
    else:
        if column is not None:
            raise ValueError(
                f"column={column!r} applies to .csv, .tsv and .parquet files; {str(p)!r} is read "
                "as plain text with one item per line, so leave column=None"
            )
        with open(p, encoding=encoding) as fh:
            lines = [line.strip() for line in fh]
        frame = pd.DataFrame({"caption": [line for line in lines if line]})
    if len(frame) == 0:
        raise ValueError(f"no texts found in {str(p)!r}")
    return frame


def _prepare_items(items: Any, labels: Any, kind: str) -> tuple[list[str], "pd.DataFrame | None"]:
    """Normalise ``items`` to a list of str and ``labels`` to a DataFrame (or None)."""
    pd = _pandas()
    item_col = _ITEM_COLUMN[kind]
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
    elif isinstance(items, pd.Series):
        items = items.tolist()
    elif isinstance(items, (str, bytes, os.PathLike)):
        raise ValueError(
            "items must be a sequence of items, not a single str or path; for a folder of "
            "images pass list_images(folder), for a text file pass read_texts(path)"
        )
    else:
        items = list(items)

    out: list[str] = []
    for i, it in enumerate(items):
        if kind == "text":
            if not isinstance(it, str):
                raise ValueError(f"items[{i}] is {type(it).__name__}; texts must be str")
            out.append(it)
        else:
            if not isinstance(it, (str, os.PathLike)):
                raise ValueError(
                    f"items[{i}] is {type(it).__name__}; images must be given as file paths "
                    "(str or os.PathLike)"
                )
            out.append(os.fspath(it))
    if not out:
        raise ValueError("items is empty; pass at least one item to embed")

    extra = None
    if labels is not None:
        if isinstance(labels, pd.DataFrame):
            extra = labels.reset_index(drop=True)
        elif isinstance(labels, Mapping):
            lengths = {str(k): len(v) for k, v in labels.items()}
            bad = {k: n for k, n in lengths.items() if n != len(out)}
            if bad:
                raise ValueError(
                    f"labels columns must have one value per item ({len(out)}); got lengths {bad}"
                )
            extra = pd.DataFrame({str(k): list(v) for k, v in labels.items()})
        else:
            raise ValueError(
                f"labels must be a dict of column -> list or a pandas DataFrame; got {type(labels).__name__}"
            )
        if len(extra) != len(out):
            raise ValueError(f"labels has {len(extra)} rows but there are {len(out)} items")
    if frame_labels is not None and extra is not None:
        clash = set(map(str, frame_labels.columns)) & set(map(str, extra.columns))
        if clash:
            raise ValueError(f"label columns {sorted(clash)} are given both in items and in labels")
        label_df = pd.concat([frame_labels, extra], axis=1)
    else:
        label_df = frame_labels if frame_labels is not None else extra
    if label_df is not None:
        label_df.columns = [str(c) for c in label_df.columns]
        if item_col in label_df.columns:
            raise ValueError(f"a label column must not be named {item_col!r}; it holds the items")
        if label_df.shape[1] == 0:
            label_df = None
    return out, label_df


# ---------------------------------------------------------------------------
# writing


def _encoder_info(encoder: Any) -> tuple[str, int | None, float | None]:
    name = str(getattr(encoder, "name", type(encoder).__name__))
    dim = getattr(encoder, "dim", None)
    tau = getattr(encoder, "tau", None)
    return name, (None if dim is None else int(dim)), (None if tau is None else float(tau))


def _read_manifest(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"cannot read manifest {str(path)!r} ({exc}); repair it or delete the collection folder"
        ) from exc
    if not isinstance(manifest, dict):
        raise ValueError(f"manifest {str(path)!r} is not a JSON object; repair it or delete the collection folder")
    return manifest


def _manifest_shards(path: Path, manifest: dict) -> list[dict]:
    """The ``shards`` records of manifest ``path``, checked to name files inside its folder."""
    shards = manifest.get("shards")
    if not isinstance(shards, list):
        what = "has no 'shards' list" if shards is None else f"has 'shards' of type {type(shards).__name__}"
        raise ValueError(
            f"manifest {str(path)!r} {what}; it must list the shard files. Repair or remove it"
        )
    root = path.parent
    real_root = root.resolve()
    for i, rec in enumerate(shards):
        if not isinstance(rec, dict) or not all(
            isinstance(rec.get(k), str) and rec.get(k) for k in ("embeddings", "metadata")
        ):
            raise ValueError(
                f"manifest {str(path)!r}: shards[{i}] must be an object whose 'embeddings' and "
                f"'metadata' are file names; got {rec!r:.200}. Repair or remove the manifest"
            )
        for key in ("embeddings", "metadata"):
            rel = rec[key]
            try:
                inside = not Path(rel).is_absolute() and (root / rel).resolve().is_relative_to(real_root)
            except (OSError, ValueError):
                inside = False
            if not inside:
                raise ValueError(
                    f"manifest {str(path)!r}: shards[{i}].{key} = {rel!r} points outside the "
                    f"collection folder {str(root)!r}; refusing to read it. Shard paths must be "
                    "relative paths inside the folder, such as 'img_emb/img_emb_0.npy'"
                )
    return shards


def _remove_partials(folder: Path) -> None:
    if folder.is_dir():
        for f in folder.iterdir():
            if _PARTIAL_MARK in f.name and f.is_file():
                with contextlib.suppress(OSError):
                    f.unlink()


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
        Show a tqdm progress bar. ``False`` also passes ``progress=False`` to the encoder
        when its method accepts that argument.
    batch_size : int, optional
        Items per encoder call.

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
    Images are opened with ``PIL.Image.open(path).convert("RGB")``; files that cannot be
    opened or decoded are skipped and listed (index in ``items``, path, reason) in the
    result and the manifest. Exceptions raised by the encoder are not caught: they stop
    the job, which can then be resumed. One process at a time should write to a folder.
    """
    kind = _check_choice(kind, "kind", _KINDS)
    np_dtype = _check_dtype(dtype)
    shard_size = _check_positive_int(shard_size, "shard_size")
    batch_size = _check_positive_int(batch_size, "batch_size")
    item_list, label_df = _prepare_items(items, labels, kind)
    enc_name, enc_dim, enc_tau = _encoder_info(encoder)
    method = "encode_text" if kind == "text" else "encode_images"
    if not callable(getattr(encoder, method, None)):
        raise ValueError(f"encoder {enc_name!r} has no {method}() method, needed for kind={kind!r}")

    n = len(item_list)
    n_shards = -(-n // shard_size)
    job = {
        "kind": kind,
        "encoder": enc_name,
        "encoder_dim": enc_dim,
        "tau": enc_tau,
        "dtype": np_dtype.name,
        "shard_size": shard_size,
        "n_items": n,
        "items_sha256": _sha256_strings(item_list),
        "label_columns": None if label_df is None else list(label_df.columns),
        "labels_sha256": _sha256_frame(label_df),
    }

    out = Path(out_dir)
    prefix = _EMB_PREFIX[kind]
    emb_dir = out / prefix
    meta_dir = out / _METADATA_DIR
    manifest_path = out / MANIFEST_NAME
    if out.exists() and not out.is_dir():
        raise ValueError(f"out_dir {str(out)!r} is a file; pass a folder path")

    resumed = False
    if manifest_path.is_file():
        manifest = _read_manifest(manifest_path)
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
        bad_keys = [
            k for k, t in (("kind", str), ("n_items", int), ("n_embedded", int), ("n_shards", int),
                           ("complete", bool), ("skipped", list))
            if not isinstance(manifest.get(k), t)
        ]
        if bad_keys:
            raise ValueError(
                f"manifest {str(manifest_path)!r} lacks valid {bad_keys}; it was modified. Delete "
                "the collection folder to start over"
            )
        for rec in _manifest_shards(manifest_path, manifest):
            for key in ("embeddings", "metadata"):
                if not (out / rec[key]).is_file():
                    raise ValueError(
                        f"out_dir {str(out)!r}: the manifest lists {rec[key]!r} but the file is "
                        "missing; the folder was modified, delete it to start over"
                    )
        resumed = True
    else:
        if out.is_dir() and any(out.iterdir()):
            raise ValueError(
                f"out_dir {str(out)!r} is not empty and has no {MANIFEST_NAME}; "
                "refusing to write into it. Choose a new or empty folder"
            )
        manifest = {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "kind": kind,
            "encoder": enc_name,
            "dim": enc_dim,
            "tau": enc_tau,
            "dtype": np_dtype.name,
            "n_items": n,
            "n_embedded": 0,
            "n_skipped": 0,
            "n_shards": n_shards,
            "complete": False,
            "shards": [],
            "skipped": [],
            "job": job,
        }
        out.mkdir(parents=True, exist_ok=True)
        _write_json(manifest_path, manifest)

    start = len(manifest["shards"])
    if start >= n_shards:
        if not manifest["complete"]:
            manifest["complete"] = True
            _write_json(manifest_path, manifest)
        return _result(manifest, out, 0, resumed)

    _remove_partials(emb_dir)
    _remove_partials(meta_dir)
    emb_dir.mkdir(parents=True, exist_ok=True)
    meta_dir.mkdir(parents=True, exist_ok=True)

    pd = _pandas()
    from tqdm.auto import tqdm

    dim = manifest.get("dim")
    encode = getattr(encoder, method)
    if not progress and _accepts_kwarg(encode, "progress"):
        encode = functools.partial(encode, progress=False)  # silence the encoder's own bars
    item_col = _ITEM_COLUMN[kind]
    written = 0
    bar = tqdm(
        total=n, initial=start * shard_size, unit="item", desc=f"embedding {kind}s",
        disable=not progress,
    )
    try:
        for s in range(start, n_shards):
            lo, hi = s * shard_size, min(n, (s + 1) * shard_size)
            chunks: list[np.ndarray] = []
            kept: list[int] = []
            skipped_here: list[dict] = []
            for b in range(lo, hi, batch_size):
                idx = list(range(b, min(hi, b + batch_size)))
                if kind == "text":
                    batch_idx = idx
                    vecs = encode([item_list[j] for j in idx]) if idx else None
                else:
                    images, batch_idx = [], []
                    for j in idx:
                        img, reason = _open_image(item_list[j])
                        if img is None:
                            skipped_here.append({"index": j, "item": item_list[j], "reason": reason})
                        else:
                            images.append(img)
                            batch_idx.append(j)
                    vecs = encode(images) if images else None
                    for img in images:
                        img.close()
                if batch_idx:
                    vecs = np.asarray(vecs)
                    if vecs.ndim != 2 or vecs.shape[0] != len(batch_idx):
                        raise ValueError(
                            f"encoder {enc_name!r}.{method} returned shape {vecs.shape} for "
                            f"{len(batch_idx)} items; expected ({len(batch_idx)}, d)"
                        )
                    if dim is None:
                        dim = int(vecs.shape[1])
                    elif vecs.shape[1] != dim:
                        raise ValueError(
                            f"encoder {enc_name!r}.{method} returned dimension {vecs.shape[1]}, "
                            f"expected {dim}"
                        )
                    vecs = vecs.astype(np_dtype, copy=False)
                    bad = _first_nonfinite_row(vecs)
                    if bad is not None:
                        raise ValueError(
                            f"encoder {enc_name!r} produced NaN/inf for item {batch_idx[bad]} "
                            f"({item_list[batch_idx[bad]]!r}) when stored as {np_dtype.name}"
                        )
                    chunks.append(vecs)
                    kept.extend(batch_idx)
                bar.update(len(idx))
            if chunks:
                emb = np.ascontiguousarray(np.concatenate(chunks, axis=0), dtype=np_dtype)
            else:
                emb = np.zeros((0, dim or 0), dtype=np_dtype)
            meta = pd.DataFrame({item_col: [item_list[j] for j in kept]})
            if label_df is not None:
                meta = pd.concat([meta, label_df.iloc[kept].reset_index(drop=True)], axis=1)

            emb_rel = f"{prefix}/{prefix}_{s}.npy"
            meta_rel = f"{_METADATA_DIR}/{_METADATA_PREFIX}_{s}.parquet"
            manifest["shards"].append({
                "index": s, "embeddings": emb_rel, "metadata": meta_rel,
                "start": lo, "stop": hi, "n_rows": int(emb.shape[0]),
            })
            manifest["skipped"].extend(skipped_here)
            manifest["n_embedded"] += int(emb.shape[0])
            manifest["n_skipped"] = len(manifest["skipped"])
            if manifest.get("dim") is None and dim is not None:
                manifest["dim"] = dim
            manifest["complete"] = s == n_shards - 1
            try:
                _write_npy(out / emb_rel, emb)
                _write_parquet(out / meta_rel, meta)
                _write_json(manifest_path, manifest)
            except BaseException:
                # leave no unrecorded shard behind (e.g. when the disk fills up)
                for rel in (emb_rel, meta_rel):
                    with contextlib.suppress(OSError):
                        (out / rel).unlink()
                raise
            written += 1
    finally:
        bar.close()
    return _result(manifest, out, written, resumed)


# ---------------------------------------------------------------------------
# reading


def _load_npy_shards(
    files: Sequence[Path], dtype: np.dtype | None, mmap: bool, arg: str
) -> tuple[np.ndarray, list[int]]:
    """Stack ``(n_i, d)`` arrays from ``files``; returns the array and per-file row counts."""
    arrays = []
    for f in files:
        if os.path.getsize(f) == 0:
            raise ValueError(
                f"{arg}: {str(f)!r} is empty (0 bytes), probably from an interrupted copy or write; "
                "restore it or recompute that shard"
            )
        try:
            a = np.load(f, mmap_mode="r", allow_pickle=False)
        except (ValueError, EOFError) as exc:
            raise ValueError(
                f"{arg}: cannot read {str(f)!r} as a numeric .npy array ({exc}); it may be "
                "truncated or not a .npy file: restore it or recompute that shard"
            ) from exc
        if a.ndim != 2:
            raise ValueError(
                f"{arg}: {str(f)!r} has shape {a.shape}; embeddings must be 2-D (n, d). "
                "Reshape and save it again"
            )
        if a.dtype.kind not in "fiu":
            raise ValueError(f"{arg}: {str(f)!r} has dtype {a.dtype}; embeddings must be numeric")
        arrays.append(a)
    dims = {a.shape[1] for a in arrays}
    if len(dims) > 1:
        by_file = ", ".join(f"{Path(f).name}: {a.shape[1]}" for f, a in zip(files, arrays))
        raise ValueError(
            f"{arg}: shards have inconsistent embedding dimensions ({by_file}); all shards must "
            "come from the same encoder, remove or recompute the odd ones"
        )
    rows = [int(a.shape[0]) for a in arrays]
    target = np.dtype(dtype) if dtype is not None else np.result_type(*[a.dtype for a in arrays])
    if mmap and len(arrays) == 1 and arrays[0].dtype == target:
        return arrays[0], rows
    if mmap:
        why = "there are several shards" if len(arrays) > 1 else f"{arrays[0].dtype} is converted to {target}"
        warnings.warn(
            f"mmap=True: embeddings are read into memory because {why}", stacklevel=3
        )
    out = np.empty((sum(rows), dims.pop()), dtype=target)
    pos = 0
    for a, r in zip(arrays, rows):
        out[pos:pos + r] = a
        pos += r
    return out, rows


def _read_parquet(f: Path, arg: str = "path") -> Any:
    """``pyarrow.parquet.read_table(f)`` with an error that names ``f`` and the fix."""
    pa, _, pq = _pyarrow()
    try:
        return pq.read_table(f)
    except pa.ArrowInvalid as exc:
        raise ValueError(
            f"{arg}: cannot read {str(f)!r} as parquet ({exc}); it may be empty, truncated or not "
            "a parquet file: restore it or recompute it"
        ) from exc


def _list_column_to_array(table: Any, column: str, source: str) -> np.ndarray:
    pa, pc, _ = _pyarrow()
    chunked = table.column(column)
    arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        raise ValueError(
            f"path: column {column!r} of {source!r} has type {t}; it must hold one list/array of "
            "numbers per row"
        )
    if arr.null_count:
        raise ValueError(f"path: column {column!r} of {source!r} has {arr.null_count} missing rows")
    n = len(arr)
    if pa.types.is_fixed_size_list(t):
        d = t.list_size
    else:
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        uniq = np.unique(lengths)
        if len(uniq) > 1:
            first_bad = int(np.argmax(lengths != lengths[0]))
            raise ValueError(
                f"path: rows of column {column!r} in {source!r} have inconsistent lengths "
                f"({sorted(int(u) for u in uniq)[:5]}; row 0 has {int(lengths[0])}, row {first_bad} "
                f"has {int(lengths[first_bad])}); every embedding must have the same dimension"
            )
        d = int(uniq[0]) if n else 0
    values = arr.flatten()
    if values.null_count:
        raise ValueError(f"path: column {column!r} of {source!r} holds missing values inside embeddings")
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise ValueError(f"path: column {column!r} of {source!r} holds {values.type}, not numbers")
    return values.to_numpy(zero_copy_only=False).reshape(n, d)


def _load_parquet_files(
    files: Sequence[Path], column: str, dtype: np.dtype | None
) -> tuple[np.ndarray, "pd.DataFrame | None"]:
    embs, metas = [], []
    for f in files:
        table = _read_parquet(f)
        if column not in table.column_names:
            raise ValueError(
                f"path: {str(f)!r} has no {column!r} column (columns: {table.column_names}); "
                "pass embedding_column= with the name of the column holding the embeddings"
            )
        embs.append(_list_column_to_array(table, column, str(f)))
        rest = table.drop([column])
        metas.append(rest.to_pandas() if rest.num_columns else None)
    dims = {e.shape[1] for e in embs}
    if len(dims) > 1:
        raise ValueError(
            f"path: parquet files have inconsistent embedding dimensions "
            f"({', '.join(f'{Path(f).name}: {e.shape[1]}' for f, e in zip(files, embs))})"
        )
    target = np.dtype(dtype) if dtype is not None else np.result_type(*[e.dtype for e in embs])
    emb = np.concatenate(embs, axis=0).astype(target, copy=False)
    if all(m is None for m in metas):
        return emb, None
    if any(m is None for m in metas):
        raise ValueError("path: some parquet files have metadata columns and others do not")
    return emb, _concat_frames(metas)


def _concat_frames(frames: list["pd.DataFrame"]) -> "pd.DataFrame":
    pd = _pandas()
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    nonempty = [f for f in frames if len(f)] or frames[:1]
    return pd.concat(nonempty, ignore_index=True)


def _numbered(folder: Path, prefix: str, suffix: str) -> dict[int, Path]:
    pattern = re.compile(rf"^{re.escape(prefix)}_(\d+){re.escape(suffix)}$")
    found: dict[int, Path] = {}
    for f in folder.iterdir() if folder.is_dir() else ():
        m = pattern.match(f.name)
        if m and f.is_file():
            i = int(m.group(1))
            if i in found:
                raise ValueError(
                    f"path: {str(folder)!r} holds two files for shard {i} ({found[i].name}, {f.name}); "
                    "remove one of them"
                )
            found[i] = f
    return found


def _check_numbering(found: Mapping[int, Path], folder: Path, prefix: str, suffix: str) -> None:
    """Raise if shard numbers ``found`` are not exactly 0, 1, ..., n - 1."""
    for expected, i in enumerate(sorted(found)):
        if i != expected:
            raise ValueError(
                f"path: {prefix}_{expected}{suffix} is missing from {str(folder)!r} (found shards up "
                f"to {prefix}_{max(found)}{suffix}); without {MANIFEST_NAME} the rows after it would "
                "shift. Restore the missing file, or renumber the shards from 0 without gaps"
            )


def _load_layout(
    root: Path, kind: str, manifest: dict | None, dtype: np.dtype | None, mmap: bool,
    allow_partial: bool,
) -> tuple[np.ndarray, "pd.DataFrame | None"]:
    prefix = _EMB_PREFIX[kind]
    meta_dir = root / _METADATA_DIR
    if manifest is not None:
        records = _manifest_shards(root / MANIFEST_NAME, manifest)
        if not manifest.get("complete", False) and not allow_partial:
            raise ValueError(
                f"path: the collection in {str(root)!r} is incomplete ({len(records)} of "
                f"{manifest.get('n_shards')} shards); run embed_collection again with the same "
                "arguments to finish it, or pass allow_partial=True"
            )
        emb_files, meta_files = [], []
        for rec in records:
            for key, dest in (("embeddings", emb_files), ("metadata", meta_files)):
                f = root / rec[key]
                if not f.is_file():
                    raise FileNotFoundError(
                        f"path: {str(f)!r}, listed in {MANIFEST_NAME}, is missing; restore it or "
                        "recompute the collection"
                    )
                dest.append(f)
        if not emb_files:
            raise FileNotFoundError(
                f"path: the collection in {str(root)!r} has no shards yet; run embed_collection to fill it"
            )
    else:
        shards = _numbered(root / prefix, prefix, ".npy")
        if not shards:
            raise FileNotFoundError(
                f"path: no {prefix}_<i>.npy files in {str(root / prefix)!r}"
            )
        _check_numbering(shards, root / prefix, prefix, ".npy")
        order = sorted(shards)
        emb_files = [shards[i] for i in order]
        metas = _numbered(meta_dir, _METADATA_PREFIX, ".parquet")
        if metas:
            missing = [f"{_METADATA_PREFIX}_{i}.parquet" for i in order if i not in metas]
            extra = [metas[i].name for i in sorted(set(metas) - set(order))]
            if missing or extra:
                raise ValueError(
                    f"path: embedding shards and metadata shards in {str(root)!r} do not match "
                    f"(missing metadata files: {missing[:10]}; metadata files without an embedding "
                    f"shard: {extra[:10]}); restore the missing files, or remove the metadata folder "
                    "or the unmatched files"
                )
            meta_files = [metas[i] for i in order]
        else:
            meta_files = []

    emb, rows = _load_npy_shards(emb_files, dtype, mmap, "path")
    if not meta_files:
        return emb, None
    frames = []
    for ef, mf, r in zip(emb_files, meta_files, rows):
        frame = _read_parquet(mf).to_pandas()
        if len(frame) != r:
            raise ValueError(
                f"path: {str(mf)!r} has {len(frame)} rows but {str(ef)!r} has {r}; a metadata shard "
                "must have one row per embedding. Recompute that shard or remove the metadata folder"
            )
        frames.append(frame)
    return emb, _concat_frames(frames)


def load_collection(
    path: str | os.PathLike,
    *,
    kind: str | None = None,
    mmap: bool = False,
    dtype: str | None = "float32",
    embedding_column: str = "embedding",
    check_finite: bool = True,
    allow_partial: bool = False,
) -> Collection:
    """Load embeddings (and metadata) from disk.

    Accepted inputs:

    * a collection folder in the clip-retrieval / autofaiss layout (``img_emb/`` or
      ``text_emb/`` shards, optional ``metadata/`` shards, optional ``collection.json``);
      shards are ordered by their number (``_2`` before ``_10``);
    * a ``collection.json`` file (its folder is loaded);
    * a ``.parquet`` file with an embedding column holding one list/array per row (other
      columns become metadata), or a folder of such files;
    * a ``.npy`` file of shape (n, d), or a folder of ``.npy`` shards (ordered by the
      numbers in their names).

    Parameters
    ----------
    path : str or os.PathLike
        File or folder to load.
    kind : {"text", "image"}, optional
        Which embeddings to load from a folder holding both ``img_emb/`` and
        ``text_emb/``; otherwise inferred.
    mmap : bool, optional
        Memory-map a single ``.npy`` file (or single-shard collection) read-only instead
        of reading it. Ignored, with a warning, when shards must be concatenated or
        converted to ``dtype``.
    dtype : str or None, optional
        Type of the returned embeddings (``"float32"`` by default, so float16 shards are
        upcast); ``None`` keeps the stored type.
    embedding_column : str, optional
        Name of the embedding column in parquet inputs.
    check_finite : bool, optional
        Raise if any embedding holds NaN or inf (checked block-wise).
    allow_partial : bool, optional
        Load the finished shards of an incomplete :func:`embed_collection` job.

    Returns
    -------
    Collection

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist, a folder holds no embeddings, or a file listed in the
        manifest is missing.
    ValueError
        On an unsupported file type, metadata and shard row counts that differ,
        inconsistent dimensions across shards, NaN/inf values, an incomplete collection,
        an ambiguous ``kind``, an empty or unreadable shard, a malformed manifest or one
        naming files outside the collection folder, or (without a manifest) a gap in the
        shard numbering.
    """
    if kind is not None:
        _check_choice(kind, "kind", _KINDS)
    target = None if dtype is None else np.dtype(dtype)
    if target is not None and target.kind != "f":
        raise ValueError(f"dtype must be a float type such as 'float32' or None; got {dtype!r}")
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(
            f"path {str(p)!r} does not exist; pass a collection folder, a .npy file, or a "
            ".parquet file with an embedding column"
        )
    if p.is_file() and p.name == MANIFEST_NAME:
        p = p.parent

    manifest = None
    metadata = None
    if p.is_file():
        suffix = p.suffix.lower()
        if suffix == ".npy":
            emb, _ = _load_npy_shards([p], target, mmap, "path")
        elif suffix == ".parquet":
            if mmap:
                warnings.warn("mmap=True has no effect for parquet files", stacklevel=2)
            emb, metadata = _load_parquet_files([p], embedding_column, target)
        else:
            raise ValueError(
                f"path {str(p)!r} has an unsupported type {suffix or '(none)'!r}; pass a .npy file, "
                "a .parquet file with an embedding column, or a collection folder"
            )
    else:
        if (p / MANIFEST_NAME).is_file():
            manifest = _read_manifest(p / MANIFEST_NAME)
            if kind is not None and manifest.get("kind") not in (None, kind):
                raise ValueError(
                    f"kind={kind!r} but the collection in {str(p)!r} holds {manifest.get('kind')!r} embeddings"
                )
            kind = manifest.get("kind")
            if kind not in _KINDS:
                raise ValueError(f"manifest {str(p / MANIFEST_NAME)!r} has an invalid kind {kind!r}")
            tau = manifest.get("tau")
            if tau is not None and (isinstance(tau, bool) or not isinstance(tau, (int, float))):
                raise ValueError(
                    f"manifest {str(p / MANIFEST_NAME)!r} has a non-numeric tau {tau!r}; repair or remove it"
                )
            emb, metadata = _load_layout(p, kind, manifest, target, mmap, allow_partial)
        else:
            present = [k for k in _KINDS if (p / _EMB_PREFIX[k]).is_dir()]
            if present:
                if kind is None:
                    if len(present) > 1:
                        raise ValueError(
                            f"path {str(p)!r} holds both img_emb/ and text_emb/; pass kind='image' "
                            "or kind='text'"
                        )
                    kind = present[0]
                elif kind not in present:
                    raise FileNotFoundError(
                        f"path {str(p)!r} has no {_EMB_PREFIX[kind]}/ folder for kind={kind!r}"
                    )
                emb, metadata = _load_layout(p, kind, None, target, mmap, allow_partial)
            else:
                npys = sorted(
                    (f for f in p.iterdir() if f.suffix.lower() == ".npy" and f.is_file()),
                    key=lambda f: _natural_key(f.name),
                )
                parquets = sorted(
                    (f for f in p.iterdir() if f.suffix.lower() == ".parquet" and f.is_file()),
                    key=lambda f: _natural_key(f.name),
                )
                if npys:
                    emb, _ = _load_npy_shards(npys, target, mmap, "path")
                elif parquets:
                    emb, metadata = _load_parquet_files(parquets, embedding_column, target)
                else:
                    raise FileNotFoundError(
                        f"path {str(p)!r} holds no embeddings: expected img_emb/ or text_emb/ "
                        "shards, .npy files, or .parquet files with an embedding column"
                    )

    if check_finite:
        bad = _first_nonfinite_row(emb)
        if bad is not None:
            raise ValueError(
                f"path {str(p)!r}: embedding row {bad} holds NaN or inf; recompute or drop those "
                "rows, or pass check_finite=False to load anyway"
            )
    tau = manifest.get("tau") if manifest else None
    return Collection(
        embeddings=emb,
        metadata=metadata,
        kind=kind,
        tau=None if tau is None else float(tau),
        encoder=manifest.get("encoder") if manifest else None,
        path=str(p),
        manifest=manifest,
    )
