"""The encoder interface shared by every backend: input checks, batching, progress, output.

A backend subclass of :class:`Encoder` implements ``_encode_text_batch`` (and, when it
has an image tower, ``_encode_image_batch``) on one batch; this module turns those into
``encode_text`` / ``encode_images`` that return unit-norm ``(n, d)`` float32 arrays.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .. import _util
from .._util import check_tau  # the one τ range of every source
from .._util import MissingDependencyError, positive_int  # noqa: F401  (the encoders raise the error)

#: Default number of items per forward pass.
DEFAULT_BATCH_SIZE = 64

#: With ``progress=None`` a progress bar is shown when the input spans more than this
#: many batches.
PROGRESS_MIN_BATCHES = 4


def require(module: str, pip_name: str, needed_by: str, hint: str | None = None) -> Any:
    """:func:`anchordiv._util.require` for a backend: by default the hint of a failing
    import is how to check for a torchvision that does not match torch."""
    if hint is None:
        hint = (
            "A common cause is a torchvision build that does not match torch "
            f"{torch.__version__}: if `python -c 'import torchvision'` fails, install a "
            "torchvision made for this torch or uninstall torchvision."
        )
    return _util.require(module, pip_name, needed_by, hint)


def resolve_device(device: Any) -> torch.device:
    """Turn a ``device`` argument into a ``torch.device``.

    Parameters
    ----------
    device : str, torch.device or None
        ``None`` picks ``"cuda"`` when available and ``"cpu"`` otherwise.

    Returns
    -------
    torch.device

    Raises
    ------
    ValueError
        If ``device`` does not name a torch device.
    RuntimeError
        If a CUDA device is requested but CUDA is not available.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ValueError(
            f"device={device!r} is not a torch device; pass e.g. 'cpu', 'cuda' or 'cuda:0'."
        ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            f"device={device!r} was requested but CUDA is not available in this torch "
            f"build ({torch.__version__}); pass device='cpu' or device=None."
        )
    return dev


def check_batch_size(batch_size: Any, name: str = "batch_size") -> int:
    """Validate a positive integer batch size and return it as ``int``."""
    return positive_int(batch_size, name)


def tau_from_logit_scale(model: Any, spec: str) -> float:
    """Temperature ``1 / exp(logit_scale)`` of a contrastive model.

    Parameters
    ----------
    model : torch.nn.Module
        A model with a ``logit_scale`` parameter (log of the inverse temperature).
    spec : str
        The encoder spec (named in the error message).

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If the model has no ``logit_scale``; the message asks for an explicit ``tau=``.
    """
    scale = getattr(model, "logit_scale", None)
    if scale is None:
        raise ValueError(
            f"encoder spec {spec!r}: the model has no logit_scale, so its temperature is "
            f"unknown; pass it explicitly, e.g. load({spec!r}, tau=0.01)."
        )
    with torch.no_grad():
        log_scale = torch.as_tensor(scale).detach().float().reshape(-1)[0].item()
    return check_tau(math.exp(-log_scale), name=f"1/exp(logit_scale) of {spec!r}")


def _check_texts(texts: Any) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise ValueError(
            "texts must be a list of strings, got a single string; wrap it as [text]."
        )
    try:
        items = list(texts)
    except TypeError as exc:
        raise ValueError(f"texts must be a list of strings, got {type(texts).__name__}.") from exc
    if not items:
        raise ValueError("texts is empty; pass at least one string.")
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise ValueError(f"texts[{i}] must be a str, got {type(t).__name__}.")
    return [str(t) for t in items]


def _check_images(images: Any) -> list[Any]:
    Image = require("PIL.Image", "pillow", "encode_images()")
    if isinstance(images, (str, bytes, os.PathLike)) or isinstance(images, Image.Image):
        raise ValueError(
            "images must be a list of file paths or PIL images, got a single item; "
            "wrap it as [image]."
        )
    try:
        items = list(images)
    except TypeError as exc:
        raise ValueError(
            f"images must be a list of file paths or PIL images, got {type(images).__name__}."
        ) from exc
    if not items:
        raise ValueError("images is empty; pass at least one file path or PIL image.")
    for i, im in enumerate(items):
        if isinstance(im, Image.Image):
            continue
        if not isinstance(im, (str, os.PathLike)):
            raise ValueError(
                f"images[{i}] must be a file path or a PIL.Image.Image, got {type(im).__name__}."
            )
        if not os.path.isfile(im):
            raise FileNotFoundError(f"images[{i}]: no such image file: {os.fspath(im)!r}")
    return items


def open_rgb(item: Any) -> Any:
    """``item`` (a file path or a PIL image) as an RGB PIL image, the way the encoders load
    images; transparent pixels (an alpha channel or a transparent palette entry) become white."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return _flatten(item)
    with Image.open(item) as im:
        im.load()  # read the pixels before the file closes
        return _flatten(im)


def _flatten(im: Any) -> Any:
    from PIL import Image

    if im.mode == "RGB":
        return im
    if im.mode in ("RGBA", "LA", "PA") or "transparency" in im.info:
        rgba = im.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return im.convert("RGB")


def _to_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float32).numpy()
    return np.asarray(x, dtype=np.float32)


class Encoder:
    """An embedding model that maps texts (and images) to unit vectors.

    Build one with :func:`anchordiv.encoders.load`. Subclasses implement
    ``_encode_text_batch`` and, for image-text models, ``_encode_image_batch``.

    Attributes
    ----------
    name : str
        The spec the encoder was loaded from.
    dim : int
        Embedding dimension ``d``.
    tau : float
        Temperature of the model's contrastive softmax (``1 / exp(logit_scale)`` for
        CLIP-like models).
    has_images : bool
        Whether :meth:`encode_images` is available.
    device : torch.device
        Where the model runs.
    batch_size : int
        Default number of items per forward pass.
    model : object
        The underlying backend model. Text-only sentence-transformers encoders load
        it (and its weights) on first use, so an encoder that embeds nothing (all
        anchors cached, row queries) costs no loading; see ``is_loaded``.
    """

    has_images: bool = False

    def __init__(self, name: str, model: Any, *, tau: float, device: torch.device,
                 batch_size: int) -> None:
        self.name = name
        self._model = model
        self._load_lock = threading.Lock()
        self.device = device
        self.batch_size = check_batch_size(batch_size)
        self._tau = check_tau(tau)
        self._dim: int | None = None

    # ------------------------------------------------------------ subclass API
    def _load_model(self) -> Any:
        """Build the backend model; called on first use when ``model`` was None. Encoders
        that need no loaded model (or were given one) keep this default, which loads nothing."""
        return None

    def _encode_text_batch(self, texts: list[str]) -> Any:
        raise NotImplementedError

    def _encode_image_batch(self, images: list[Any]) -> Any:
        raise NotImplementedError

    # ----------------------------------------------------------------- public
    @property
    def model(self) -> Any:
        """The backend model, loaded on first access by encoders that load lazily."""
        if self._model is None:
            from .._progress import quiet_loading

            with self._load_lock, quiet_loading():
                if self._model is None:
                    self._model = self._load_model()
        return self._model

    @model.setter
    def model(self, value: Any) -> None:
        self._model = value

    @property
    def is_loaded(self) -> bool:
        """Whether the backend model (its weights) is loaded."""
        return self._model is not None

    @property
    def tau(self) -> float:
        """Temperature of the model's contrastive softmax."""
        return self._tau

    @property
    def dim(self) -> int:
        """Embedding dimension (known once the model is loaded, else found by encoding one
        short text on first access)."""
        if self._dim is None:
            _ = self.model  # a lazily loading encoder learns its dimension as it loads
        if self._dim is None:
            self._dim = int(self.encode_text(["a"], progress=False).shape[1])
        return self._dim

    def encode_text(self, texts: Sequence[str], *, batch_size: int | None = None,
                    progress: bool | None = None) -> np.ndarray:
        """Embed texts.

        Parameters
        ----------
        texts : list of str
            The texts; at least one.
        batch_size : int, optional
            Items per forward pass; defaults to the encoder's ``batch_size``.
        progress : bool, optional
            Show a tqdm progress bar. ``None`` shows one when the input spans more than
            ``PROGRESS_MIN_BATCHES`` batches; inside a silenced
            :func:`anchordiv._progress.progress_scope` none is shown.

        Returns
        -------
        numpy.ndarray
            ``(len(texts), dim)`` float32 array of unit-norm rows.

        Raises
        ------
        ValueError
            If ``texts`` is empty, a single string, or holds a non-string.
        """
        items = _check_texts(texts)
        return self._run(items, self._encode_text_batch, batch_size, progress, "text")

    def encode_images(self, images: Sequence[Any], *, batch_size: int | None = None,
                      progress: bool | None = None) -> np.ndarray:
        """Embed images.

        Parameters
        ----------
        images : list of str, os.PathLike or PIL.Image.Image
            Image file paths or PIL images (converted to RGB); at least one. Files are
            opened one batch at a time.
        batch_size : int, optional
            Items per forward pass; defaults to the encoder's ``batch_size``.
        progress : bool, optional
            Show a tqdm progress bar. ``None`` shows one when the input spans more than
            ``PROGRESS_MIN_BATCHES`` batches.

        Returns
        -------
        numpy.ndarray
            ``(len(images), dim)`` float32 array of unit-norm rows.

        Raises
        ------
        NotImplementedError
            If the encoder is text-only (``has_images`` is False); this is a
            ``RuntimeError``.
        ValueError
            If ``images`` is empty, a single item, or holds something that is neither a
            path nor a PIL image.
        FileNotFoundError
            If a path does not point to a file.
        """
        if not self.has_images:
            raise NotImplementedError(
                f"encoder {self.name!r} is text-only and cannot encode images; load an "
                "image-text model instead, e.g. 'open_clip:ViT-B-32/laion2b_s34b_b79k' or "
                "'hf_clip:openai/clip-vit-base-patch32'."
            )
        items = _check_images(images)

        def batch_fn(batch: list[Any]) -> Any:
            return self._encode_image_batch([open_rgb(x) for x in batch])

        return self._run(items, batch_fn, batch_size, progress, "image")

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, tau={self._tau:.6g}, "
            f"device={str(self.device)!r}, has_images={self.has_images})"
        )

    # ----------------------------------------------------------------- plumbing
    def _run(self, items: list[Any], batch_fn: Callable[[list[Any]], Any],
             batch_size: int | None, progress: bool | None, kind: str) -> np.ndarray:
        """Embed ``items`` in batches and return unit-norm float32 rows in input order.

        Texts are processed longest first (by character count, as sentence-transformers'
        ``encode`` does), so each batch holds texts of similar length and is padded
        little; every text is tokenised once, in its batch. The rows are written into one
        preallocated array at their input positions (no concatenation, no reordering copy).
        """
        from .._progress import progress_bar

        bs = self.batch_size if batch_size is None else check_batch_size(batch_size)
        n = len(items)
        show = (n > PROGRESS_MIN_BATCHES * bs) if progress is None else bool(progress)
        if kind == "text" and n > bs:
            order = np.argsort([-len(t) for t in items], kind="stable")
        else:
            order = np.arange(n)
        out: np.ndarray | None = None
        bar = progress_bar(total=n, unit=kind, desc=f"{self.name} {kind}s", show=show)
        with torch.inference_mode(), contextlib.closing(bar):
            for start in range(0, n, bs):
                rows = order[start:start + bs]
                batch = [items[i] for i in rows]
                emb = _to_numpy(batch_fn(batch))
                if emb.ndim != 2 or emb.shape[0] != len(batch):
                    raise RuntimeError(
                        f"encoder {self.name!r} returned shape {emb.shape} for a batch of "
                        f"{len(batch)} {kind}s; expected ({len(batch)}, d)."
                    )
                if out is None:
                    out = np.empty((n, emb.shape[1]), dtype=np.float32)
                out[rows] = emb
                bar.update(len(batch))
        assert out is not None
        if not np.isfinite(out).all():
            raise RuntimeError(f"encoder {self.name!r} produced NaN or inf embeddings.")
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        if (norms == 0).any():
            raise RuntimeError(f"encoder {self.name!r} produced a zero embedding.")
        out /= norms
        if self._dim is None:
            self._dim = int(out.shape[1])
        return out
