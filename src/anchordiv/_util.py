"""Helpers shared by the whole package: the positive-integer check, optional imports and
atomic file writes. Only the standard library is imported here.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import importlib
import importlib.util
import math
import numbers
import os
import stat
import uuid
from typing import Any, Callable


#: The temperatures accepted from every source (models, command-line options, manifests, the
#: service): τ ∈ [1e-4, 100]. Below 1e-4, η = λ/τ and the divergences (∝ 1/τ or 1/τ²) leave the
#: range where float32 features resolve unit-norm embeddings; CLIP's learned τ is ≈ 0.01.
TAU_RANGE = (1e-4, 100.0)



def sha256_file(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()

def check_tau(value: Any, name: str = "tau") -> float:
    """``value`` as a float τ ∈ :data:`TAU_RANGE`, else a ``ValueError`` naming ``name``."""
    lo, hi = TAU_RANGE
    try:
        tau = float(value)
    except (TypeError, ValueError):
        tau = math.nan
    if isinstance(value, bool) or not lo <= tau <= hi:
        raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], got {value!r}; "
                         "pass the contrastive model's temperature (CLIP: about 0.01).")
    return tau


def positive_int(value: Any, name: str, allow_none: bool = False) -> int | None:
    """``value`` as an int ≥ 1, or a ``ValueError`` naming ``name``: the one check of every
    count, size and budget argument. Python and numpy integers are accepted; bools, floats
    and strings are not (``None`` too, unless ``allow_none``)."""
    if type(value) is int and value >= 1:
        return value
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if allow_none else ''}, got {value!r}.")
    return int(value)


# ---------------------------------------------------------------------------
# optional imports


class MissingDependencyError(ImportError, RuntimeError):
    """An optional package cannot be imported.

    It is both an ``ImportError`` and a ``RuntimeError``; the message names the
    ``pip install`` command that provides the package.
    """


def is_installed(module: str) -> bool:
    """Whether the top-level package of ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, pip_name: str, needed_by: str, hint: str = "") -> Any:
    """Import an optional dependency or raise a :class:`MissingDependencyError`.

    Parameters
    ----------
    module : str
        Module to import, e.g. ``"open_clip"`` or ``"pyarrow.parquet"``.
    pip_name : str
        What to ``pip install`` to provide it, e.g. ``"open_clip_torch"``.
    needed_by : str
        What needs it, for the message, e.g. ``"encoder spec 'minilm'"``.
    hint : str, optional
        Advice appended to the message when the module is installed but fails to import.

    Returns
    -------
    module
        The imported module.

    Raises
    ------
    MissingDependencyError
        If the import fails for any reason. The message says whether the package is
        missing (with the ``pip install`` command) or present but failing to import
        (with the error). The original exception is chained.
    """
    try:
        return importlib.import_module(module)
    except Exception as exc:
        if not is_installed(module):
            raise MissingDependencyError(
                f"{needed_by} needs the optional package {module!r}, which is not "
                f"installed. Install it with: pip install {pip_name}"
            ) from exc
        raise MissingDependencyError(
            f"{needed_by} needs the package {module!r}, which is installed but failed to "
            f"import: {type(exc).__name__}: {str(exc).rstrip('.')}. {hint}".rstrip()
        ) from exc


# ---------------------------------------------------------------------------
# atomic writes

#: Errors of a full disk or quota.
_NO_SPACE = {errno.ENOSPC} | ({errno.EDQUOT} if hasattr(errno, "EDQUOT") else set())


def _temp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}."


def _remove_stale_temporaries(path: str) -> None:
    """Remove the temporaries of earlier writes of ``path`` whose writing process has ended.

    A temporary is named ``.NAME.PID.RANDOM.tmp`` beside ``NAME``; one whose PID no longer
    runs is left over from a write that was killed and is safe to delete.
    """
    prefix = _temp_prefix(path)
    folder = os.path.dirname(os.path.abspath(path))
    for tmp in glob.glob(os.path.join(glob.escape(folder), glob.escape(prefix) + "*.tmp")):
        pid = os.path.basename(tmp)[len(prefix):].split(".", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # a live process (possibly another write in progress)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def _no_space_errno(exc: BaseException | None) -> int | None:
    """The errno when ``exc`` (or what caused it) is a full disk, else None; torch reports
    one as a RuntimeError."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            return exc.errno
        if isinstance(exc, RuntimeError) and ("No space left" in str(exc) or "file write failed" in str(exc)):
            return errno.ENOSPC
        exc = exc.__cause__ or exc.__context__
    return None


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], *, advice: str) -> None:
    """Write ``path`` with ``write(file)`` through a temporary file in the same folder.

    The temporary is ``.NAME.PID.RANDOM.tmp``; it is synced and then moved over ``path``
    with ``os.replace`` (keeping the permissions of a file it replaces; a symbolic link at
    ``path`` is replaced itself, its target is never written), and the folder is synced,
    so a failure at any point leaves the previous file, if any, as it was and no temporary
    behind. Temporaries of killed writes of the same path (their PID has ended) are
    removed first.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write.
    write : callable
        Called with a binary file object open for writing.
    advice : str
        What the user can do besides freeing space, ending the message of a full disk,
        e.g. ``"save to another disk"``.

    Raises
    ------
    OSError
        With the errno of a full disk or quota (ENOSPC, EDQUOT) and a message that names
        ``path`` and ``advice``; any other error of ``write`` passes through unchanged.
    """
    path = os.fspath(path)
    _remove_stale_temporaries(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f"{_temp_prefix(path)}{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666), "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileNotFoundError):
            previous = os.lstat(path)
            if stat.S_ISREG(previous.st_mode):  # a symlink at path is replaced, its target never touched
                os.chmod(tmp, previous.st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        code = _no_space_errno(exc)
        if code is not None:
            raise OSError(
                code,
                f"no space left on the device while writing {path!r}: the disk is full or over "
                "quota. Nothing half-written was kept (a previous file, if any, is unchanged); "
                f"free some space and try again, or {advice}",
            ) from None
        raise
    try:  # make the rename itself durable where the platform allows it
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def json_scalar(value: Any) -> Any:
    """A JSON-friendly form of a metadata value: numpy scalars unwrapped, NaN/inf as None,
    anything else that is not a str/int/float/bool as its str."""
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (ValueError, TypeError):
            pass
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class EmbeddingRows:
    """Mixin for a set of rows held as ``self.embeddings`` (n, d): ``len()`` and ``dim``."""

    def __len__(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def dim(self) -> int:
        """Embedding dimension d."""
        return int(self.embeddings.shape[1])
