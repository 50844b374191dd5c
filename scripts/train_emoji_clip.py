"""Train a small CLIP on emoji (Google and Twitter drawings) with the InfoNCE loss, on CPU.

The model is an OpenCLIP ``CLIP`` built from the config ``anchordiv-emoji`` (a 4-layer
ViT on 64 px images with 8 px patches, a 4-layer text transformer, 128-d embeddings),
registered with ``open_clip.add_model_config``. Each image is paired with a caption
drawn from ``anchordiv.apps.emoji``'s templates: object and style (60 %), object only (20 %)
or style only (20 %). A caption is a positive for every image in the batch whose object
and style it names, so the loss is InfoNCE with several positives per row (the target
of each row of the similarity matrix is uniform over its positives). The held-out split
is by emoji name (``anchordiv.apps.emoji.is_held_out``, 20 %): the test objects are never
seen, in any style, during training.

Writes ``OUT/anchordiv-emoji.json`` (the OpenCLIP config) and ``OUT/anchordiv-emoji.pt``
(an OpenCLIP state dict, float16 except ``logit_scale``), then loads them back through
``anchordiv.encoders.load("open_clip:anchordiv-emoji/OUT/anchordiv-emoji.pt")`` and writes
held-out zero-shot accuracies to ``OUT/metrics.json``. ``--install`` copies both files to
``src/anchordiv/data/emoji_clip/``, where ``anchordiv demo --images`` finds them.

    nice -n 5 .venv/bin/python scripts/train_emoji_clip.py --minutes 15 --install
"""

from __future__ import annotations

import argparse
import json
import math
import random
import resource
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from anchordiv.apps import emoji  # noqa: E402

VISION = {"image_size": 64, "layers": 4, "width": 64, "head_width": 32, "patch_size": 8}
#: text tower -> (architecture name, OpenCLIP config). ``minilm`` is all-MiniLM-L6-v2 (frozen,
#: mean-pooled) with a learned linear projection; its path is filled in where it is installed.
CONFIGS = {
    "scratch": ("anchordiv-emoji", {
        "embed_dim": 128, "vision_cfg": VISION,
        "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 3}}),
    "minilm": (emoji.CLIP_ARCH, {
        "embed_dim": 128, "vision_cfg": VISION,
        "text_cfg": {"context_length": 24, "hf_model_name": "minilm", "hf_tokenizer_name": "minilm",
                     "hf_pooler_type": "mean_pooler", "hf_proj_type": "linear"}}),
}
INSTALL_DIR = ROOT / "src" / "anchordiv" / "data" / "emoji_clip"


def caption(rng: random.Random, name: str, vendor: str) -> tuple[str, str | None, str | None]:
    """A random caption of ``name`` drawn by ``vendor`` and the factors it names."""
    u = rng.random()
    if u < 0.6:
        return rng.choice(emoji.BOTH_TEMPLATES).format(name=name, style=vendor), name, vendor
    if u < 0.8:
        return rng.choice(emoji.OBJECT_TEMPLATES).format(name=name), name, None
    return rng.choice(emoji.STYLE_TEMPLATES).format(style=vendor), None, vendor


def positives(names: list[str], vendors: list[str], factors: list[tuple[str | None, str | None]]) -> torch.Tensor:
    """``M[i, j]`` = 1 when caption ``i`` names image ``j``'s object and style (those it names)."""
    m = torch.ones(len(factors), len(names))
    for i, (n, v) in enumerate(factors):
        for j in range(len(names)):
            if (n is not None and n != names[j]) or (v is not None and v != vendors[j]):
                m[i, j] = 0.0
    return m


def multi_positive_infonce(img: torch.Tensor, txt: torch.Tensor, scale: torch.Tensor,
                           m: torch.Tensor) -> torch.Tensor:
    """½ [CE(softmax_j(s·t_iᵀx_j), M_i/|M_i|) + CE(softmax_i(s·x_jᵀt_i), M_·j/|M_·j|)]."""
    logits = scale * txt @ img.T
    t2i = -(m / m.sum(1, keepdim=True) * logits.log_softmax(1)).sum(1).mean()
    i2t = -(m.T / m.T.sum(1, keepdim=True) * logits.T.log_softmax(1)).sum(1).mean()
    return 0.5 * (t2i + i2t)


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random scale (0.8-1.05) and shift (±6 %) of each image; no flips (arrows have a side)."""
    n = x.shape[0]
    s = 0.8 + 0.25 * torch.rand(n, generator=gen)
    t = 0.12 * (torch.rand(n, 2, generator=gen) - 0.5)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = 1 / s
    theta[:, 1, 1] = 1 / s
    theta[:, :, 2] = t
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    fill = x[:, :, :1, :1]  # the background colour of each image (a corner pixel)
    out = F.grid_sample(x - fill, grid, align_corners=False, padding_mode="zeros")
    return out + fill


def caption_pool(rng: random.Random, names: list[str]) -> tuple[list[str], dict]:
    """Captions of the frozen text tower, embedded once: per emoji its object-only captions
    and 3 of the object-and-style captions per vendor; per vendor its style-only captions.
    Returns the texts and, per factor pair (name or None, vendor or None), their rows."""
    texts: list[str] = []
    rows: dict[tuple[str | None, str | None], list[int]] = {}

    def add(key: tuple[str | None, str | None], items: list[str]) -> None:
        rows.setdefault(key, []).extend(range(len(texts), len(texts) + len(items)))
        texts.extend(items)

    for n in names:
        add((n, None), [t.format(name=n) for t in emoji.OBJECT_TEMPLATES])
        for v in emoji.VENDORS:
            add((n, v), [t.format(name=n, style=v) for t in rng.sample(emoji.BOTH_TEMPLATES, 3)])
    for v in emoji.VENDORS:
        add((None, v), [t.format(style=v) for t in emoji.STYLE_TEMPLATES])
    return texts, rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text-tower", choices=sorted(CONFIGS), default="minilm",
                   help="'minilm': frozen all-MiniLM-L6-v2 and a learned projection (default); "
                        "'scratch': a text transformer trained from scratch")
    p.add_argument("--cache", type=Path, default=None, help="emoji cache (default: anchordiv.apps.emoji.default_cache())")
    p.add_argument("--out", type=Path, default=Path.home() / ".cache" / "anchordiv" / "emoji-clip-train")
    p.add_argument("--minutes", type=float, default=9.0, help="training time budget (default: 9)")
    p.add_argument("--batch-names", type=int, default=64, help="emoji per batch, each in every style (default: 64)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--install", action="store_true",
                   help=f"copy the trained weights (without a frozen text tower) to {INSTALL_DIR.relative_to(ROOT)}")
    args = p.parse_args()

    import open_clip

    from anchordiv.encoders import minilm_path
    from anchordiv.encoders import open_rgb

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    wall0, cpu0 = time.time(), time.process_time()
    cache = emoji.fetch(args.cache)
    pictures = emoji.load(cache)

    arch, config = CONFIGS[args.text_tower]
    frozen = "hf_model_name" in config["text_cfg"]
    args.out.mkdir(parents=True, exist_ok=True)
    config_path = args.out / f"{arch}.json"
    config_path.write_text(json.dumps(emoji.with_text_tower(config, str(minilm_path())), indent=2) + "\n")
    open_clip.add_model_config(config_path)
    model, _, preprocess = open_clip.create_model_and_transforms(arch)
    tokenizer = open_clip.get_tokenizer(arch)

    train = [e for e in pictures if not emoji.is_held_out(e.name)]
    x_all = torch.stack([preprocess(open_rgb(e.path)) for e in train])
    by_name: dict[str, list[int]] = {}
    for i, e in enumerate(train):
        by_name.setdefault(e.name, []).append(i)
    train_names = sorted(by_name)
    if frozen:  # the text tower never changes: embed every caption once, train only text.proj
        texts, pool = caption_pool(rng, train_names)
        model.text.transformer.requires_grad_(False)
        with torch.no_grad():
            pooled = torch.cat([
                model.text.pooler(model.text.transformer(input_ids=tok, attention_mask=(tok != 0).long()),
                                  (tok != 0).long())
                for tok in tokenizer(texts).split(256)])
        print(f"embedded {len(texts)} captions with the frozen text tower in "
              f"{time.time() - wall0:.0f} s", flush=True)
    trained = [q for q in model.parameters() if q.requires_grad]
    print(f"{len(pictures)} pictures, {len(train)} for training ({len(train_names)} emoji); "
          f"{sum(q.numel() for q in trained) / 1e6:.2f} M trained parameters", flush=True)

    opt = torch.optim.AdamW([{"params": [q for q in trained if q.ndim >= 2], "weight_decay": 0.1},
                             {"params": [q for q in trained if q.ndim < 2], "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    budget = 60.0 * args.minutes
    warmup = 50
    step, t_start, losses = 0, time.time(), []
    model.train()
    while (elapsed := time.time() - t_start) < budget:
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * elapsed / budget))
        for g in opt.param_groups:
            g["lr"] = lr
        rows = [i for n in rng.sample(train_names, args.batch_names) for i in by_name[n]]
        names = [train[i].name for i in rows]
        vendors = [train[i].vendor for i in rows]
        caps = [caption(rng, n, v) for n, v in zip(names, vendors)]
        m = positives(names, vendors, [(c[1], c[2]) for c in caps])
        img = model.encode_image(augment(x_all[rows], gen), normalize=True)
        if frozen:
            idx = [rng.choice(pool[(c[1], c[2])]) for c in caps]
            txt = F.normalize(model.text.proj(pooled[idx]), dim=-1)
        else:
            txt = model.encode_text(tokenizer([c[0] for c in caps]), normalize=True)
        loss = multi_positive_infonce(img, txt, model.logit_scale.exp(), m)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.logit_scale.clamp_(0, math.log(100))
        losses.append(loss.item())
        step += 1
        if step % 25 == 0:
            print(f"step {step}  {elapsed / 60:.1f} min  loss {np.mean(losses[-25:]):.3f}  "
                  f"1/tau {model.logit_scale.exp().item():.1f}  lr {lr:.2e}", flush=True)

    state = {k: (v if k == "logit_scale" else v.half()) for k, v in model.state_dict().items()}
    ckpt = args.out / f"{arch}.pt"
    torch.save(state, ckpt)
    train_wall, train_cpu = time.time() - wall0, time.process_time() - cpu0
    metrics = {"text_tower": args.text_tower, "arch": arch}
    metrics.update(evaluate(f"open_clip:{arch}/{ckpt}", pictures))
    metrics.update(steps=step, final_loss=float(np.mean(losses[-25:])), train_pictures=len(train),
                   train_emoji=len(train_names), trained_parameters=sum(q.numel() for q in trained),
                   wall_s_train=round(train_wall, 1), cpu_s_train=round(train_cpu, 1),
                   wall_s_total=round(time.time() - wall0, 1), cpu_s_total=round(time.process_time() - cpu0, 1),
                   peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                   config=config, args={k: str(v) for k, v in vars(args).items()})
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(json.dumps({k: v for k, v in metrics.items() if k not in ("config", "args")}, indent=2))
    if args.install:
        install(arch, config, state, metrics)
        print(f"installed into {INSTALL_DIR}")


def install(arch: str, config: dict, state: dict, metrics: dict) -> None:
    """Write the weights (without a frozen Hugging Face text tower), config and metrics to ``INSTALL_DIR``."""
    frozen = "hf_model_name" in config["text_cfg"]
    INSTALL_DIR.mkdir(parents=True, exist_ok=True)
    torch.save({k: v for k, v in state.items() if not (frozen and k.startswith("text.transformer."))},
               INSTALL_DIR / f"{arch}.pt")
    (INSTALL_DIR / f"{arch}.json").write_text(json.dumps(config, indent=2) + "\n")
    (INSTALL_DIR / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


def evaluate(spec: str, pictures: list) -> dict:
    """Zero-shot accuracies of a saved checkpoint, loaded through ``anchordiv.encoders.load``."""
    from anchordiv.encoders import load

    enc = load(spec, device="cpu")
    out: dict = {"tau": enc.tau}
    train_names = sorted({e.name for e in pictures if not emoji.is_held_out(e.name)})
    seen = set(random.Random(0).sample(train_names, min(400, len(train_names))))
    for split, keep in (("held_out", lambda e: emoji.is_held_out(e.name)), ("train_400", lambda e: e.name in seen)):
        pics = [e for e in pictures if keep(e)]
        x = enc.encode_images([e.path for e in pics], progress=False)
        names = sorted({e.name for e in pics})
        obj = np.stack([enc.encode_text([t.format(name=n) for t in emoji.OBJECT_TEMPLATES], progress=False)
                        .mean(0) for n in names])
        sty = np.stack([enc.encode_text([t.format(style=v) for t in emoji.STYLE_TEMPLATES], progress=False)
                        .mean(0) for v in emoji.VENDORS])
        name_idx = np.array([names.index(e.name) for e in pics])
        vendor_idx = np.array([emoji.VENDORS.index(e.vendor) for e in pics])
        s = x @ x.T
        np.fill_diagonal(s, -np.inf)
        other_style = vendor_idx[:, None] != vendor_idx[None, :]
        nearest_other = np.where(other_style, s, -np.inf).argmax(1)
        out[split] = {
            "emoji": len(names), "pictures": len(pics),
            "object_top1": float((np.argmax(x @ obj.T, 1) == name_idx).mean()),
            "object_top5": float((np.argsort(-(x @ obj.T), 1)[:, :5] == name_idx[:, None]).any(1).mean()),
            "object_chance": 1.0 / len(names),
            "style_top1": float((np.argmax(x @ sty.T, 1) == vendor_idx).mean()),
            "style_chance": 1.0 / len(emoji.VENDORS),
            "cross_style_image_top1": float((name_idx[nearest_other] == name_idx).mean()),
        }
    return out


if __name__ == "__main__":
    main()
