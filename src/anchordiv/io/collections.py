"""Collections: the :class:`Collection` type, the clip-retrieval layout and its manifest."""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from .._util import EmbeddingRows
from .readers import (_concat_frames, _first_nonfinite_row, _load_npy_shards, _load_parquet_files, _natural_key,
                      read_parquet)

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

#: Name of the manifest file inside a collection folder.
MANIFEST_NAME = "collection.json"

_FORMAT = "anchordiv.collection"
_FORMAT_VERSION = 1
_KINDS = ("text", "image")
_EMB_PREFIX = {"image": "img_emb", "text": "text_emb"}
_ITEM_COLUMN = {"image": "image_path", "text": "caption"}
_METADATA_DIR = "metadata"
_METADATA_PREFIX = "metadata"
#: Rows (evenly spaced, first and last included) whose embeddings a :meth:`Collection.fingerprint` digests.
FINGERPRINT_ROWS = 4096


@dataclass(repr=False, eq=False)
class Collection(EmbeddingRows):
    """Embeddings of a set of texts or images, with optional per-row metadata.

    Parameters
    ----------
    embeddings : numpy.ndarray of shape (n, d)
        One embedding per row (float32 unless loaded with another ``dtype``; with ``mmap=True``,
        a read-only ``numpy.memmap`` of a single file, or a :class:`~anchordiv.io.MappedRows` of
        several shards).
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
    manifest: dict | None = None

    def __post_init__(self) -> None:
        from .mapped import MappedRows

        if not isinstance(self.embeddings, (np.ndarray, MappedRows)):
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


    @property
    def item_column(self) -> str | None:
        """The metadata column holding the embedded items: the one ``collection.json`` names
        (``embed --column``), else ``caption``, ``text`` or ``image_path``; None without one."""
        cols = self.columns
        named = (self.manifest or {}).get("item_column")
        return next((c for c in [named, "caption", "text", "image_path"] if c and c in cols), None)

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

    @property
    def folder(self) -> Path | None:
        """The collection's folder: :attr:`path` when it is a folder, else the folder of the file
        it was read from; None for a collection made in memory."""
        if not self.path:
            return None
        p = Path(self.path)
        return p if p.is_dir() else p.parent

    def item_file(self, row: int, *, root: str | os.PathLike | None = None,
                  column: str = "image_path") -> Path | None:
        """The file named in ``column`` (default ``image_path``) of row ``row``; None when it names none.

        A relative path is resolved against ``root`` (default: :attr:`folder`) only, never
        against the working directory; an absolute path is returned as it is.
        """
        if self.metadata is None or column not in self.metadata.columns:
            return None
        raw = self.metadata[column].iloc[row]
        if not isinstance(raw, str) or not raw:
            return None
        p = Path(raw)
        if p.is_absolute():
            return p
        base = Path(root) if root is not None else self.folder
        return None if base is None else base / p

    def fingerprint(self) -> dict:
        """What identifies this collection, cheaply: rows, dimension, a SHA-256 of the ``id``
        column (None without one) and of :data:`FINGERPRINT_ROWS` evenly spaced embeddings
        (read as float32). A changed collection gives another fingerprint unless its changes
        avoid every sampled row and keep the ids; see :func:`fingerprint_mismatch`."""
        n, d = (int(x) for x in self.embeddings.shape)
        rows = np.unique(np.linspace(0, n - 1, min(n, FINGERPRINT_ROWS)).round().astype(np.int64))
        h = hashlib.sha256(f"{n},{d};".encode())
        h.update(rows.astype("<i8").tobytes())
        h.update(np.ascontiguousarray(self.embeddings[rows], dtype="<f4").tobytes())
        ids = None
        if self.metadata is not None and "id" in self.metadata.columns:
            column = self.metadata["id"]
            if column.dtype.kind in "biuf":
                values = np.ascontiguousarray(column.to_numpy())
                hi = hashlib.sha256(f"{values.dtype.str};".encode())
                hi.update(values.tobytes())
            else:  # ids as the command line reads them: their text
                hi = hashlib.sha256(b"text;")
                hi.update("\x00".join(map(str, column.tolist())).encode("utf-8", "surrogatepass"))
            ids = hi.hexdigest()
        return {"n": n, "dim": d, "ids_sha256": ids, "sample_sha256": h.hexdigest(), "sample_rows": int(rows.size)}

    def __repr__(self) -> str:
        n, d = self.embeddings.shape
        parts = [f"n={n}", f"dim={d}", f"dtype={self.embeddings.dtype}"]
        for name in ("kind", "encoder", "tau"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)!r}")
        if self.metadata is not None:
            parts.append(f"columns={self.columns}")
        return f"Collection({', '.join(parts)})"


def fingerprint_mismatch(recorded: Any, current: Mapping) -> str | None:
    """How a collection with fingerprint ``current`` differs from the one ``recorded``, or None
    when they agree (both from :meth:`Collection.fingerprint`)."""
    if not isinstance(recorded, Mapping):
        return "no fingerprint of the collection was recorded"
    if recorded.get("n") != current["n"]:
        return f"it has {current['n']} rows where the recorded collection has {recorded.get('n')!r}"
    if recorded.get("dim") != current["dim"]:
        return f"it has dimension {current['dim']} where the recorded collection has {recorded.get('dim')!r}"
    if recorded.get("ids_sha256") != current["ids_sha256"]:
        return "its 'id' column differs from the recorded collection's"
    if recorded.get("sample_sha256") != current["sample_sha256"]:
        return f"its embeddings differ from the recorded collection's (in a sample of {current['sample_rows']} rows)"
    return None


def _check_choice(value: Any, name: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}; got {value!r}")
    return value


# ---------------------------------------------------------------------------
# the manifest


def _read_manifest(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"cannot read manifest {str(path)!r} ({exc}); repair it or delete the collection folder"
        ) from exc
    except RecursionError:
        raise ValueError(
            f"cannot read manifest {str(path)!r}: its JSON is nested too deeply to be a manifest; repair it "
            "or delete the collection folder"
        ) from None
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


# ---------------------------------------------------------------------------
# shards without a manifest


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


def manifest_files(root: Path, manifest: dict, allow_partial: bool) -> tuple[list[Path], list[Path]]:
    """The embedding and metadata shard files a manifest lists, checked to exist."""
    records = _manifest_shards(root / MANIFEST_NAME, manifest)
    if not manifest.get("complete", False) and not allow_partial:
        raise ValueError(
            f"path: the collection in {str(root)!r} is incomplete ({len(records)} of "
            f"{manifest.get('n_shards')} shards); run embed_collection again with the same "
            "arguments to finish it, or pass allow_partial=True"
        )
    emb_files, meta_files = [], []
    listed: dict[Path, str] = {}
    for i, rec in enumerate(records):
        for key, dest in (("embeddings", emb_files), ("metadata", meta_files)):
            f = root / rec[key]
            where = f"shards[{i}].{key}"
            first = listed.setdefault(f.resolve(), where)
            if first != where:
                raise ValueError(
                    f"manifest {str(root / MANIFEST_NAME)!r}: {where} = {rec[key]!r} is the file {first} "
                    "already lists; each shard file is listed once. Repair the manifest or recompute the collection"
                )
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
    return emb_files, meta_files


def numbered_files(root: Path, kind: str) -> tuple[list[Path], list[Path]]:
    """The embedding shards of ``kind`` and the matching metadata shards, found by number."""
    prefix = _EMB_PREFIX[kind]
    shards = _numbered(root / prefix, prefix, ".npy")
    if not shards:
        raise FileNotFoundError(f"path: no {prefix}_<i>.npy files in {str(root / prefix)!r}")
    _check_numbering(shards, root / prefix, prefix, ".npy")
    order = sorted(shards)
    metas = _numbered(root / _METADATA_DIR, _METADATA_PREFIX, ".parquet")
    if not metas:
        return [shards[i] for i in order], []
    missing = [f"{_METADATA_PREFIX}_{i}.parquet" for i in order if i not in metas]
    extra = [metas[i].name for i in sorted(set(metas) - set(order))]
    if missing or extra:
        raise ValueError(
            f"path: embedding shards and metadata shards in {str(root)!r} do not match "
            f"(missing metadata files: {missing[:10]}; metadata files without an embedding "
            f"shard: {extra[:10]}); restore the missing files, or remove the metadata folder "
            "or the unmatched files"
        )
    return [shards[i] for i in order], [metas[i] for i in order]


def _load_layout(
    root: Path, kind: str, manifest: dict | None, dtype: np.dtype | None, mmap: bool,
    allow_partial: bool,
) -> tuple[np.ndarray, "pd.DataFrame | None"]:
    if manifest is not None:
        emb_files, meta_files = manifest_files(root, manifest, allow_partial)
    else:
        emb_files, meta_files = numbered_files(root, kind)
    emb, rows = _load_npy_shards(emb_files, dtype, mmap)
    if manifest is not None:
        _check_manifest_counts(root / MANIFEST_NAME, manifest, rows, int(emb.shape[1]))
    if not meta_files:
        return emb, None
    frames = []
    for ef, mf, r in zip(emb_files, meta_files, rows):
        frame = read_parquet(mf).to_pandas()
        if len(frame) != r:
            raise ValueError(
                f"path: {str(mf)!r} has {len(frame)} rows but {str(ef)!r} has {r}; a metadata shard "
                "must have one row per embedding. Recompute that shard or remove the metadata folder"
            )
        frames.append(frame)
    return emb, _concat_frames(frames)


def _count(path: Path, value: Any, field: str) -> int | None:
    """A manifest count, None when absent, or a ``ValueError`` naming ``field``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"manifest {str(path)!r}: {field} = {value!r} must be a non-negative integer; repair the manifest "
            "or recompute the collection"
        )
    return value


def _check_manifest_counts(path: Path, manifest: dict, rows: Sequence[int], dim: int) -> None:
    """Compare the counts a manifest records (per shard ``n_rows``, ``start``, ``stop``; ``dim``,
    ``n_embedded``, ``n_items``, ``n_shards``) with the shards' ``rows`` and ``dim``."""
    fix = "repair the manifest or recompute the collection"
    stop_before: int | None = 0
    for i, (rec, r) in enumerate(zip(manifest["shards"], rows)):
        name = rec["embeddings"]
        n_rows = _count(path, rec.get("n_rows"), f"shards[{i}].n_rows")
        if n_rows is not None and n_rows != r:
            raise ValueError(f"manifest {str(path)!r}: shards[{i}].n_rows = {n_rows} but {name!r} holds {r} rows; {fix}")
        start = _count(path, rec.get("start"), f"shards[{i}].start")
        stop = _count(path, rec.get("stop"), f"shards[{i}].stop")
        if start is not None and stop_before is not None and start != stop_before:
            raise ValueError(
                f"manifest {str(path)!r}: shards[{i}].start = {start} but the previous shard stops at {stop_before}; "
                f"shards cover the items in order, without gaps or overlaps. {fix[0].upper()}{fix[1:]}"
            )
        if start is not None and stop is not None and stop - start < r:
            raise ValueError(
                f"manifest {str(path)!r}: shards[{i}].stop = {stop} leaves {max(stop - start, 0)} items after its "
                f"start {start}, but {name!r} holds {r} rows; {fix}"
            )
        stop_before = stop
    recorded_dim = _count(path, manifest.get("dim"), "'dim'")
    if recorded_dim is not None and recorded_dim != dim:
        raise ValueError(f"manifest {str(path)!r}: 'dim' = {recorded_dim} but its shards hold {dim}-dimensional "
                         f"embeddings; {fix}")
    embedded = _count(path, manifest.get("n_embedded"), "'n_embedded'")
    if embedded is not None and embedded != sum(rows):
        raise ValueError(f"manifest {str(path)!r}: 'n_embedded' = {embedded} but its shards hold {sum(rows)} rows; {fix}")
    if not manifest.get("complete", False):
        return
    n_shards = _count(path, manifest.get("n_shards"), "'n_shards'")
    if n_shards is not None and n_shards != len(rows):
        raise ValueError(f"manifest {str(path)!r}: 'n_shards' = {n_shards} but it lists {len(rows)} shards; {fix}")
    items = _count(path, manifest.get("n_items"), "'n_items'")
    if items is not None and stop_before is not None and items != stop_before:
        raise ValueError(f"manifest {str(path)!r}: 'n_items' = {items} but its shards cover {stop_before} items "
                         f"(the last one stops at {stop_before}); {fix}")


# ---------------------------------------------------------------------------
# loading


def _load_file(p: Path, target: np.dtype | None, mmap: bool, embedding_column: str):
    suffix = p.suffix.lower()
    if suffix == ".npy":
        return _load_npy_shards([p], target, mmap)[0], None
    if suffix == ".parquet":
        if mmap:
            warnings.warn("mmap=True has no effect for parquet files", stacklevel=3)
        return _load_parquet_files([p], embedding_column, target)
    raise ValueError(
        f"path {str(p)!r} has an unsupported type {suffix or '(none)'!r}; pass a .npy file, "
        "a .parquet file with an embedding column, or a collection folder"
    )


def manifest_of(p: Path, kind: str | None) -> dict:
    """The manifest of the collection folder ``p``, checked (its kind against ``kind``, its tau)."""
    manifest = _read_manifest(p / MANIFEST_NAME)
    if kind is not None and manifest.get("kind") not in (None, kind):
        raise ValueError(
            f"kind={kind!r} but the collection in {str(p)!r} holds {manifest.get('kind')!r} embeddings"
        )
    if manifest.get("kind") not in _KINDS:
        raise ValueError(f"manifest {str(p / MANIFEST_NAME)!r} has an invalid kind {manifest.get('kind')!r}")
    tau = manifest.get("tau")
    if tau is not None and (isinstance(tau, bool) or not isinstance(tau, (int, float))):
        raise ValueError(
            f"manifest {str(p / MANIFEST_NAME)!r} has a non-numeric tau {tau!r}; repair or remove it"
        )
    return manifest


def layout_kind(p: Path, kind: str | None) -> str | None:
    """The kind of the clip-retrieval layout in folder ``p``; None when ``p`` has none."""
    present = [k for k in _KINDS if (p / _EMB_PREFIX[k]).is_dir()]
    if not present:
        return None
    if kind is None:
        if len(present) > 1:
            raise ValueError(
                f"path {str(p)!r} holds both img_emb/ and text_emb/; pass kind='image' or kind='text'"
            )
        return present[0]
    if kind not in present:
        raise FileNotFoundError(f"path {str(p)!r} has no {_EMB_PREFIX[kind]}/ folder for kind={kind!r}")
    return kind


def _load_plain_folder(p: Path, target: np.dtype | None, mmap: bool, embedding_column: str):
    """A folder of ``.npy`` shards, else of parquet files, in natural order of their names."""
    for suffix in (".npy", ".parquet"):
        files = sorted((f for f in p.iterdir() if f.suffix.lower() == suffix and f.is_file()),
                       key=lambda f: _natural_key(f.name))
        if files and suffix == ".npy":
            return _load_npy_shards(files, target, mmap)[0], None
        if files:
            return _load_parquet_files(files, embedding_column, target)
    raise FileNotFoundError(
        f"path {str(p)!r} holds no embeddings: expected img_emb/ or text_emb/ "
        "shards, .npy files, or .parquet files with an embedding column"
    )


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
        Memory-map the ``.npy`` shards read-only instead of reading them: one file gives a
        ``numpy.memmap``, several a :class:`~anchordiv.io.MappedRows` (rows read on use).
        Ignored, with a warning, when the shards must be converted to ``dtype`` (pass
        ``dtype=None`` to keep float16 shards as they are).
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
    if p.is_file():
        emb, metadata = _load_file(p, target, mmap, embedding_column)
    elif (p / MANIFEST_NAME).is_file():
        manifest = manifest_of(p, kind)
        kind = manifest["kind"]
        emb, metadata = _load_layout(p, kind, manifest, target, mmap, allow_partial)
    elif (layout := layout_kind(p, kind)) is not None:
        kind = layout
        emb, metadata = _load_layout(p, kind, None, target, mmap, allow_partial)
    else:
        emb, metadata = _load_plain_folder(p, target, mmap, embedding_column)

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
