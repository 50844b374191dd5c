"""``open_clip:`` encoders: OpenCLIP models by architecture and pretrained tag, by Hugging
Face Hub name, or from a local checkpoint file."""

from __future__ import annotations

import os
from typing import Any

import torch

from ._base import Encoder, require, tau_from_logit_scale

PIP_NAME = "open_clip_torch"

#: File suffixes that mark the part after ``ARCH/`` as a checkpoint path.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".npz")

_IMPORT_HINT = (
    "open_clip imports torchvision, whose compiled operators must match the installed "
    f"torch ({torch.__version__}); install a torchvision build made for it."
)


def parse_spec(rest: str, spec: str) -> tuple[str, str | None]:
    """Split the part of an ``open_clip:`` spec after the prefix.

    Parameters
    ----------
    rest : str
        ``"ARCH/PRETRAINED"``, ``"ARCH/PATH_TO_CHECKPOINT"`` or ``"hf-hub:ORG/NAME"``.
    spec : str
        The whole spec (named in error messages).

    Returns
    -------
    model_name : str
        Architecture name, or ``"hf-hub:ORG/NAME"``.
    pretrained : str or None
        Pretrained tag or checkpoint path; ``None`` for ``hf-hub:`` names, which carry
        their own weights.

    Raises
    ------
    ValueError
        If the architecture or the pretrained part is missing.
    """
    if rest.startswith("hf-hub:"):
        if not rest[len("hf-hub:"):].strip("/"):
            raise ValueError(
                f"encoder spec {spec!r} names no Hub repository; use 'open_clip:hf-hub:ORG/NAME'."
            )
        return rest, None
    arch, _, pretrained = rest.partition("/")
    if not arch or not pretrained:
        raise ValueError(
            f"encoder spec {spec!r} must be 'open_clip:ARCH/PRETRAINED' (e.g. "
            "'open_clip:ViT-B-32/laion2b_s34b_b79k'), 'open_clip:ARCH/PATH_TO_CHECKPOINT.pt' "
            "or 'open_clip:hf-hub:ORG/NAME'; without pretrained weights the model would be "
            "random."
        )
    return arch, pretrained


def is_checkpoint_path(pretrained: str) -> bool:
    """Whether the part after ``ARCH/`` is a file path rather than a pretrained tag."""
    return (
        os.sep in pretrained
        or "/" in pretrained
        or pretrained.startswith("~")
        or pretrained.lower().endswith(CHECKPOINT_SUFFIXES)
    )


def register_config_beside(open_clip: Any, model_name: str, checkpoint: str) -> None:
    """Register ``<model_name>.json`` in the checkpoint's folder, when there is one, as an
    OpenCLIP model config (``open_clip.add_model_config``), so ``ARCH/FOLDER/weights.pt``
    loads a custom architecture saved beside its weights."""
    config = os.path.join(os.path.dirname(os.path.abspath(checkpoint)), model_name + ".json")
    if os.path.isfile(config):
        open_clip.add_model_config(config)


class OpenCLIPEncoder(Encoder):
    """An OpenCLIP image-text model.

    Texts go through the model's tokenizer and ``encode_text(tokens, normalize=True)``;
    images through its evaluation transform and ``encode_image(x, normalize=True)``.
    ``tau`` defaults to ``1 / exp(logit_scale)``. For SigLIP-type models the
    ``logit_bias`` adds the same constant to every image-text logit and so cancels in a
    softmax over anchors; only ``logit_scale`` enters ``tau``.

    Parameters
    ----------
    spec : str
        The whole ``open_clip:`` spec.
    rest : str
        The part after ``open_clip:``; see :func:`parse_spec`.
    device : torch.device
        Where the model runs.
    batch_size : int
        Default items per forward pass.
    tau : float, optional
        Overrides the model's temperature.

    Notes
    -----
    A checkpoint file is loaded with OpenCLIP's ``load_checkpoint``: a plain state dict
    (OpenAI-CLIP key names are the same as OpenCLIP's), a dict with a ``state_dict`` entry,
    keys prefixed ``module.``, or a TorchScript archive. Weights trained by OpenAI's CLIP
    code and fine-tunes of them use QuickGELU activations: name the architecture with its
    ``-quickgelu`` suffix (e.g. ``open_clip:ViT-B-32-quickgelu/model.pt``) to reproduce
    them exactly; plain ``ViT-B-32`` loads the same weights with GELU.
    """

    has_images = True

    def __init__(self, spec: str, rest: str, *, device: torch.device, batch_size: int,
                 tau: float | None = None) -> None:
        model_name, pretrained = parse_spec(rest, spec)
        if pretrained is not None and is_checkpoint_path(pretrained):
            pretrained = os.path.expanduser(pretrained)
            if not os.path.isfile(pretrained):
                raise FileNotFoundError(
                    f"encoder spec {spec!r}: checkpoint file {pretrained!r} does not exist."
                )
            is_file = True
        else:
            is_file = False
        open_clip = require("open_clip", PIP_NAME, f"encoder spec {spec!r}", _IMPORT_HINT)
        if is_file:
            register_config_beside(open_clip, model_name, pretrained)
        if not model_name.startswith("hf-hub:"):
            known = open_clip.list_models()
            if model_name not in known:
                raise ValueError(
                    f"encoder spec {spec!r}: unknown OpenCLIP architecture {model_name!r}; "
                    "see open_clip.list_models() for the names, e.g. 'ViT-B-32'."
                )
            if not is_file:
                tags = open_clip.list_pretrained_tags_by_model(model_name)
                if pretrained not in tags:
                    raise ValueError(
                        f"encoder spec {spec!r}: {pretrained!r} is neither a pretrained tag of "
                        f"{model_name!r} nor an existing checkpoint file; tags: "
                        f"{', '.join(sorted(tags)) or 'none'}."
                    )
        model, _, preprocess = open_clip.create_model_and_transforms(
            model_name, pretrained=pretrained, device=device
        )
        model.eval()
        self._preprocess = preprocess
        self._tokenizer = open_clip.get_tokenizer(model_name)
        super().__init__(
            spec, model,
            tau=tau_from_logit_scale(model, spec) if tau is None else tau,
            device=device, batch_size=batch_size,
        )

    def _encode_text_batch(self, texts: list[str]) -> Any:
        tokens = self._tokenizer(texts).to(self.device)
        return self.model.encode_text(tokens, normalize=True)

    def _encode_image_batch(self, images: list[Any]) -> Any:
        x = torch.stack([self._preprocess(im) for im in images]).to(self.device)
        return self.model.encode_image(x, normalize=True)
