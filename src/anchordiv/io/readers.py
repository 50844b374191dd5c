"""Input readers: texts and image folders to embed, and embedding files (.npy, parquet)."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from .._util import require

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: File extensions (lower case) that :func:`list_images` picks up.
IMAGE_EXTENSIONS: tuple[str, ...] = (
    ".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm",
)

_NEEDED_BY = "anchordiv.io"
_FINITE_CHECK_ROWS = 65536


def _pandas():
    return require("pandas", "pandas pyarrow", _NEEDED_BY)


def _pyarrow():
    return (require("pyarrow", "pyarrow", _NEEDED_BY), require("pyarrow.compute", "pyarrow", _NEEDED_BY),
            require("pyarrow.parquet", "pyarrow", _NEEDED_BY))


def _natural_key(name: str) -> list:
    """Sort key that orders embedded integers numerically (``x_2`` before ``x_10``)."""
    parts = re.split(r"(\d+)", name)
    return [int(p) if i % 2 else p for i, p in enumerate(parts)]


def _first_nonfinite_row(array: np.ndarray) -> int | None:
    """Index of the first row holding NaN or inf, or None; reads in blocks."""
    for start in range(0, array.shape[0], _FINITE_CHECK_ROWS):
        bad = ~np.isfinite(np.asarray(array[start:start + _FINITE_CHECK_ROWS])).all(axis=1)
        if bad.any():
            return start + int(np.argmax(bad))
    return None


# ---------------------------------------------------------------------------
# what to embed


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
        Column ``image_path`` (the absolute path of ``folder`` joined with the relative
        path, as str), plus the label column. Rows are sorted by relative path. Files are
        not opened, so unreadable images are listed too; :func:`embed_collection` skips them.

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
    absolute = Path(os.path.abspath(root))  # valid from any working directory
    data: dict[str, list] = {"image_path": [str(absolute / r) for r in rels]}
    if label_column is not None:
        if label_column == "image_path":
            raise ValueError("label_column must not be 'image_path'; choose another name")
        data[label_column] = [(root / r).parent.name for r in rels]
    return pd.DataFrame(data)


def _text_column(frame: "pd.DataFrame", p: Path) -> str:
    """The default text column of a table: ``caption``, else ``text``, else the only string column."""
    pd = _pandas()
    for name in ("caption", "text"):
        if name in frame.columns:
            return name
    str_cols = [c for c in frame.columns
                if frame[c].dtype == object or pd.api.types.is_string_dtype(frame[c].dtype)]
    if len(str_cols) != 1:
        raise ValueError(
            f"cannot tell which column of {str(p)!r} holds the texts (columns: "
            f"{[str(c) for c in frame.columns]}); pass column="
        )
    return str(str_cols[0])


def read_texts(
    path: str | os.PathLike,
    column: str | None = None,
    *,
    encoding: str = "utf-8",
    keep_name: bool = False,
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
    keep_name : bool, optional
        Keep the text column's name instead of renaming it ``caption`` (pass the name to
        :func:`embed_collection` as ``item_column``).

    Returns
    -------
    pandas.DataFrame
        Column ``caption`` (the text column's own name with ``keep_name``) with the texts,
        first; for tables, the other columns follow as label
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
    if suffix not in (".csv", ".tsv", ".parquet"):
        if column is not None:
            raise ValueError(
                f"column={column!r} applies to .csv, .tsv and .parquet files; {str(p)!r} is read "
                "as plain text with one item per line, so leave column=None"
            )
        with open(p, encoding=encoding) as fh:
            frame = pd.DataFrame({"caption": [s for s in (line.strip() for line in fh) if s]})
        if len(frame) == 0:
            raise ValueError(f"no texts found in {str(p)!r}")
        return frame
    if suffix == ".parquet":
        frame = as_read = pd.read_parquet(p)
    else:
        # only empty cells are missing: captions such as "None", "NA" or "null" are text
        read = dict(sep="\t" if suffix == ".tsv" else ",", encoding=encoding, keep_default_na=False, na_values=[""])
        frame = pd.read_csv(p, **read)
        as_read = pd.read_csv(p, dtype=str, **read)  # the text column as written ("007" stays "007")
    if column is None:
        column = _text_column(frame, p)
    if column not in frame.columns:
        raise ValueError(f"column {column!r} is not in {str(p)!r}; available columns: {[str(c) for c in frame.columns]}")
    if column != "caption" and "caption" in frame.columns and not keep_name:
        raise ValueError(
            f"{str(p)!r} has a 'caption' column besides the text column {column!r}; "
            "rename one of them or pass column='caption'"
        )
    frame[column] = as_read[column]
    texts = frame[column]
    keep = texts.notna().to_numpy() & (texts.astype(str).str.strip() != "").to_numpy()
    if not keep.all():
        warnings.warn(
            f"read_texts: dropped {int((~keep).sum())} rows of {str(p)!r} with a missing or blank {column!r}",
            stacklevel=2,
        )
    frame = frame.loc[keep].reset_index(drop=True)
    frame[column] = frame[column].astype(str)
    name = column if keep_name else "caption"
    frame = frame.rename(columns={column: name})
    frame = frame[[name] + [c for c in frame.columns if c != name]]
    if len(frame) == 0:
        raise ValueError(f"no texts found in {str(p)!r}")
    return frame


# ---------------------------------------------------------------------------
# embedding files


def _load_npy_shards(
    files: Sequence[Path], dtype: np.dtype | None, mmap: bool, arg: str = "path"
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
        if not isinstance(a, np.ndarray):  # np.load opens a .npz archive whatever the file's name
            names = list(getattr(a, "files", []))
            if hasattr(a, "close"):
                a.close()
            raise ValueError(
                f"{arg}: {str(f)!r} is a .npz archive (arrays {names[:5]}), not a .npy array; save the "
                "embeddings with np.save, or take the array out of the archive (np.load(path)[name])"
            )
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
    if mmap and all(a.dtype == target for a in arrays):
        if len(arrays) == 1:
            return arrays[0], rows
        from .mapped import MAPPED_DTYPES, MappedRows

        if target in MAPPED_DTYPES:  # several shards: one (n, d) view of their maps
            return MappedRows(arrays), rows
    if mmap:
        why = f"{arrays[0].dtype} is converted to {target}" if arrays[0].dtype != target else \
            f"{target} shards are not mapped"
        warnings.warn(f"mmap=True: embeddings are read into memory because {why} (pass dtype=None to keep the "
                      "stored type)", stacklevel=3)
    out = np.empty((sum(rows), dims.pop()), dtype=target)
    pos = 0
    for a, r in zip(arrays, rows):
        out[pos:pos + r] = a
        pos += r
    return out, rows


def read_parquet(f: Path, arg: str = "path") -> Any:
    """``pyarrow.parquet.read_table(f)`` with an error that names ``f`` and the fix."""
    pa, _, pq = _pyarrow()
    try:
        names = pq.read_schema(f).names
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if not duplicates:
            return pq.read_table(f)
    except pa.ArrowInvalid as exc:
        raise ValueError(
            f"{arg}: cannot read {str(f)!r} as parquet ({exc}); it may be empty, truncated or not "
            "a parquet file: restore it or recompute it"
        ) from exc
    raise ValueError(
        f"{arg}: {str(f)!r} has duplicate column names {duplicates}; each column needs its own name: "
        "rename the duplicates and write the file again"
    )


def _list_column_to_array(table: Any, column: str, source: str) -> np.ndarray:
    pa, pc, _ = _pyarrow()
    chunked = table.column(column)
    arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
    t = arr.type
    where = f"path: column {column!r} of {source!r}"
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)):
        raise ValueError(f"{where} has type {t}; it must hold one list/array of numbers per row")
    if arr.null_count:
        raise ValueError(f"{where} has {arr.null_count} missing rows")
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
        raise ValueError(f"{where} holds missing values inside embeddings")
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise ValueError(f"{where} holds {values.type}, not numbers")
    return values.to_numpy(zero_copy_only=False).reshape(n, d)


def _load_parquet_files(
    files: Sequence[Path], column: str, dtype: np.dtype | None
) -> tuple[np.ndarray, "pd.DataFrame | None"]:
    embs, metas = [], []
    for f in files:
        table = read_parquet(f)
        if column not in table.column_names:
            raise ValueError(
                f"path: {str(f)!r} has no {column!r} column (columns: {table.column_names}); "
                "pass embedding_column= with the name of the column holding the embeddings"
            )
        embs.append(_list_column_to_array(table, column, str(f)))
        rest = table.drop([column])
        metas.append(rest.to_pandas() if rest.num_columns else None)
    if len({e.shape[1] for e in embs}) > 1:
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
    if len(frames) == 1:
        return frames[0].reset_index(drop=True)
    return _pandas().concat([f for f in frames if len(f)] or frames[:1], ignore_index=True)
