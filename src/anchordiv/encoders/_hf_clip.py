"""``hf_clip:`` encoders: Hugging Face transformers image-text models (CLIP, SigLIP, ...)
loaded with ``AutoModel`` and ``AutoProcessor`` from a Hub name or a local folder."""

from __future__ import annotations

import inspect
from typing import Any, Mapping

import torch

from ._base import Encoder, require, tau_from_logit_scale

PIP_NAME = "transformers"

#: Model types whose text tower pools a fixed position and so needs max-length padding.
MAX_LENGTH_PADDING_TYPES = ("siglip", "siglip2")


def features(output: Any) -> torch.Tensor:
    """The embedding tensor of a ``get_text_features`` / ``get_image_features`` result.

    Older transformers return the projected embeddings as a tensor; newer ones return a
    model output whose ``pooler_output`` holds them (a plain tuple has it second).
    """
    if isinstance(output, torch.Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if pooled is not None:
        return pooled
    if isinstance(output, (tuple, list)) and len(output) > 1:
        return output[1]
    raise RuntimeError(
        f"cannot find embeddings in a {type(output).__name__} returned by the model; "
        "expected a tensor or an output with pooler_output."
    )


def _named_params(fn: Any) -> set[str]:
    params = inspect.signature(fn).parameters.values()
    return {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _select(inputs: Mapping[str, Any], allowed: set[str], device: torch.device,
            float_dtype: torch.dtype) -> dict[str, Any]:
    out = {}
    for key, value in inputs.items():
        if key not in allowed:
            continue
        if isinstance(value, torch.Tensor):
            value = value.to(device, float_dtype) if value.is_floating_point() else value.to(device)
        out[key] = value
    return out


class HFCLIPEncoder(Encoder):
    """A transformers image-text model with ``get_text_features`` / ``get_image_features``.

    Texts are tokenized with truncation to the text tower's length (padded to that
    length for SigLIP-type models); images go through the model's image processor.
    ``tau`` defaults to ``1 / exp(logit_scale)``. SigLIP models also have a
    ``logit_bias``: it adds the same constant to every image-text logit and so cancels
    in a softmax over anchors; only ``logit_scale`` enters ``tau``.

    Parameters
    ----------
    spec : str
        The whole ``hf_clip:`` spec.
    name_or_path : str
        Hub name (``ORG/NAME``) or local folder saved with ``save_pretrained`` (model and
        processor).
    device : torch.device
        Where the model runs.
    batch_size : int
        Default items per forward pass.
    tau : float, optional
        Overrides the model's temperature.
    """

    def __init__(self, spec: str, name_or_path: str, *, device: torch.device,
                 batch_size: int, tau: float | None = None) -> None:
        if not name_or_path:
            raise ValueError(
                f"encoder spec {spec!r} names no model; use 'hf_clip:ORG/NAME' or "
                "'hf_clip:/path/to/folder'."
            )
        from .._progress import quiet_loading

        transformers = require("transformers", PIP_NAME, f"encoder spec {spec!r}")
        with quiet_loading():
            model = transformers.AutoModel.from_pretrained(name_or_path)
        if not callable(getattr(model, "get_text_features", None)):
            raise ValueError(
                f"encoder spec {spec!r}: {type(model).__name__} has no get_text_features(); "
                "hf_clip: needs a CLIP-like image-text model. For a text embedding model use "
                "'sentence-transformers:NAME'."
            )
        with quiet_loading():
            tokenizer, image_processor = self._load_processors(transformers, name_or_path, spec)
        model.to(device).eval()
        self._tokenizer = tokenizer
        self._image_processor = image_processor
        self.has_images = image_processor is not None and callable(
            getattr(model, "get_image_features", None)
        )
        self._dtype = next(model.parameters()).dtype
        self._text_args = _named_params(model.get_text_features)
        self._image_args = (
            _named_params(model.get_image_features) if self.has_images else set()
        )
        model_type = str(getattr(model.config, "model_type", ""))
        self._padding: bool | str = "max_length" if model_type in MAX_LENGTH_PADDING_TYPES else True
        self._max_length = self._text_length(model, tokenizer)
        super().__init__(
            spec, model,
            tau=tau_from_logit_scale(model, spec) if tau is None else tau,
            device=device, batch_size=batch_size,
        )

    @staticmethod
    def _load_processors(transformers: Any, name_or_path: str, spec: str) -> tuple[Any, Any]:
        try:
            processor = transformers.AutoProcessor.from_pretrained(name_or_path)
        except Exception:
            processor = None
        if processor is not None and isinstance(processor, transformers.PreTrainedTokenizerBase):
            return processor, None
        if processor is not None and getattr(processor, "tokenizer", None) is not None:
            return processor.tokenizer, getattr(processor, "image_processor", None)
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path)
        except Exception as exc:
            raise ValueError(
                f"encoder spec {spec!r}: found no tokenizer beside the model; save the "
                "processor (or tokenizer) with save_pretrained into the same folder."
            ) from exc
        try:
            image_processor = transformers.AutoImageProcessor.from_pretrained(name_or_path)
        except Exception:
            image_processor = None
        return tokenizer, image_processor

    @staticmethod
    def _text_length(model: Any, tokenizer: Any) -> int | None:
        text_config = getattr(model.config, "text_config", None)
        length = getattr(text_config, "max_position_embeddings", None)
        if length is None:
            length = getattr(tokenizer, "model_max_length", None)
        if length is None or length > 100_000:  # tokenizers use a huge sentinel for "unset"
            return None
        return int(length)

    def _encode_text_batch(self, texts: list[str]) -> Any:
        enc = self._tokenizer(
            texts, padding=self._padding, truncation=self._max_length is not None,
            max_length=self._max_length, return_tensors="pt",
        )
        inputs = _select(enc, self._text_args, self.device, self._dtype)
        return features(self.model.get_text_features(**inputs))

    def _encode_image_batch(self, images: list[Any]) -> Any:
        enc = self._image_processor(images=images, return_tensors="pt")
        inputs = _select(enc, self._image_args, self.device, self._dtype)
        return features(self.model.get_image_features(**inputs))
