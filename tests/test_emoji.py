"""Emoji pictures (``anchordiv.apps.emoji``), the committed emoji CLIP and the image demo.

The data tests and the demo run on a small generated folder in the npm packages' layout
(``<vendor>/emoji.json``, ``<vendor>/img/<vendor>/64/*.png``): coloured shapes, filled for
one vendor and outlined for the other. The encoder tests load the committed checkpoint
through ``anchordiv.encoders.load`` and compare its text and image paths with independent
float64 computations from the weights (and with OpenCLIP where it is installed). The quality test reads the real emoji from
the npm cache (``python -m anchordiv.apps.emoji``), never the network.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from anchordiv.apps import emoji

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageDraw  # noqa: E402

COLOURS = [(220, 40, 40), (40, 160, 60), (40, 80, 220), (230, 180, 20), (150, 60, 200), (20, 180, 190)]


def held_out_names(n: int) -> list[str]:
    names, i = [], 0
    while len(names) < n:
        name = f"test shape {i}"
        if emoji.is_held_out(name):
            names.append(name)
        i += 1
    return names


def draw(i: int, vendor: str) -> Image.Image:
    """Shape ``i % 3`` in colour ``i // 3``; Google fills it, Twitter outlines it."""
    im = Image.new("RGBA", (64, 64), (0, 0, 0, 0))
    d = ImageDraw.Draw(im)
    colour = COLOURS[(i // 3) % len(COLOURS)] + (255,)
    box = (8, 8, 56, 56)
    kw = {"fill": colour} if vendor == "google" else {"outline": colour, "width": 5}
    [d.ellipse, d.rectangle, lambda b, **k: d.polygon([(32, 6), (58, 58), (6, 58)], **k)][i % 3](box, **kw)
    return im


def make_tree(root, names, skip=()):
    """The npm packages' layout under ``root`` for ``names``; ``(vendor, name)`` in ``skip`` have no file."""
    for vendor in emoji.VENDORS:
        folder = root / vendor / "img" / vendor / "64"
        folder.mkdir(parents=True)
        entries = []
        for i, name in enumerate(names):
            entries.append({"name": name.upper(), "short_name": name.replace(" ", "_"), "category": "Shapes",
                            "subcategory": "shape", "image": f"{i:04x}.png"})
            if (vendor, name) not in skip:
                draw(i, vendor).save(folder / f"{i:04x}.png")
        (root / vendor / "emoji.json").write_text(json.dumps(entries), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("emoji"), held_out_names(12))


# ----------------------------------------------------------------------------- data


def test_load_keeps_emoji_every_vendor_draws(tmp_path):
    names = ["cat face", "dog face", "red apple"]
    make_tree(tmp_path, names, skip={("twitter", "dog face")})
    pics = emoji.load(tmp_path)
    assert [(e.name, e.vendor) for e in pics] == [("cat face", "google"), ("cat face", "twitter"),
                                                  ("red apple", "google"), ("red apple", "twitter")]
    cat = pics[0]
    assert (cat.short_name, cat.category, cat.subcategory) == ("cat_face", "Shapes", "shape")
    assert cat.path == tmp_path / "google" / "img" / "google" / "64" / "0000.png"
    assert [e.vendor for e in emoji.load(tmp_path, vendors=["twitter"])] == ["twitter", "twitter"]
    with pytest.raises(ValueError, match="vendors"):
        emoji.load(tmp_path, vendors=["apple"])


def test_load_without_files_names_the_fetch_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m anchordiv.apps.emoji"):
        emoji.load(tmp_path)


def test_held_out_split_is_by_name_and_matches_sha256():
    names = [f"emoji {i}" for i in range(4000)]
    held = [emoji.is_held_out(n) for n in names]
    expect = [int(hashlib.sha256(n.encode()).hexdigest()[:16], 16) / 2**64 < 0.2 for n in names]
    assert held == expect
    assert 0.18 < np.mean(held) < 0.22
    assert not any(emoji.is_held_out(n, 0.0) for n in names[:50])
    assert all(emoji.is_held_out(n, 1.0) for n in names[:50])
    with pytest.raises(ValueError, match="fraction"):
        emoji.is_held_out("x", 1.5)


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_fetch_unpacks_only_the_64px_images_of_a_pinned_tarball(tmp_path, monkeypatch):
    png = io.BytesIO()
    draw(0, "google").save(png, format="PNG")
    tarball = tmp_path / "emoji-datasource-google-16.0.0.tgz"
    with tarfile.open(tarball, "w:gz") as tar:
        _add(tar, "package/emoji.json", json.dumps([{"name": "RED CIRCLE", "image": "a.png"}]).encode())
        _add(tar, "package/img/google/64/a.png", png.getvalue())
        _add(tar, "package/img/google/64/deeper/b.png", png.getvalue())
        _add(tar, "package/img/google/sheets/c.png", png.getvalue())
        _add(tar, "package/../../evil.png", b"x")
        _add(tar, "package/index.js", b"require('child_process')")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    package, version, _, licence = emoji.PACKAGES["google"]
    monkeypatch.setitem(emoji.PACKAGES, "google", (package, version, digest, licence))
    assert emoji.fetch(tmp_path, vendors=["google"]) == tmp_path  # the pinned tarball is there: no npm
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["emoji-datasource-google-16.0.0.tgz", "google/emoji.json", "google/img/google/64/a.png"]
    assert not (tmp_path.parent / "evil.png").exists()
    assert [(e.name, e.vendor) for e in emoji.load(tmp_path, vendors=["google"])] == [("red circle", "google")]


def test_open_rgb_puts_transparent_pixels_on_white(tmp_path):
    from anchordiv.encoders import open_rgb

    Image.new("RGB", (3, 2), (10, 20, 30)).save(tmp_path / "rgb.png")
    assert np.asarray(open_rgb(tmp_path / "rgb.png")).tolist() == [[[10, 20, 30]] * 3] * 2  # read after close

    im = Image.new("RGBA", (4, 1), (0, 0, 0, 0))
    im.putpixel((1, 0), (255, 0, 0, 255))
    im.putpixel((2, 0), (255, 0, 0, 128))
    rgb = np.asarray(open_rgb(im), dtype=int)
    assert rgb[0, 0].tolist() == [255, 255, 255] and rgb[0, 1].tolist() == [255, 0, 0]
    assert np.abs(rgb[0, 2] - [255, 127, 127]).max() <= 1
    pal = Image.new("P", (2, 1), 0)
    pal.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)
    pal.putpixel((1, 0), 1)
    pal.info["transparency"] = 0
    assert np.asarray(open_rgb(pal)).tolist() == [[[255, 255, 255], [0, 0, 255]]]


# ----------------------------------------------------------------------------- the committed model


@pytest.fixture(scope="module")
def clip():
    from anchordiv.encoders import load

    return load(emoji.CLIP_SPEC, device="cpu")


@pytest.fixture(scope="module")
def state():
    return torch.load(emoji.CLIP_DIR / f"{emoji.CLIP_ARCH}.pt", map_location="cpu", weights_only=True)


def test_committed_model_is_small_and_loads_offline(clip, state):
    size = sum(f.stat().st_size for f in emoji.CLIP_DIR.iterdir())
    assert size <= 10 * 2**20
    assert not any(k.startswith("text.transformer.") for k in state)  # the frozen MiniLM is not committed
    assert clip.name == "emoji-clip"
    assert clip.tau == pytest.approx(float(np.exp(-state["logit_scale"].double().item())), rel=1e-12)
    assert clip.dim == 128 and clip.has_images
    assert torch.equal(clip.model.proj.weight, state["text.proj.weight"].float())
    assert torch.equal(clip.model.visual.visual_projection.weight, state["visual.proj"].T.float())


def test_text_tower_equals_minilm_mean_pool_and_projection_in_float64(clip, state):
    from transformers import AutoModel, AutoTokenizer

    from anchordiv.encoders import minilm_path

    texts = ["a grinning face emoji", "an emoji in twitter style", "google's drawing of a red apple"]
    tok = AutoTokenizer.from_pretrained(str(minilm_path()))
    bert = AutoModel.from_pretrained(str(minilm_path())).double().eval()
    batch = tok(texts, padding="max_length", max_length=24, truncation=True, return_tensors="pt")
    with torch.no_grad():
        h = bert(**batch).last_hidden_state
    mask = batch["attention_mask"].double().unsqueeze(-1)
    pooled = (h * mask).sum(1) / mask.sum(1)
    ref = torch.nn.functional.normalize(pooled @ state["text.proj.weight"].double().T, dim=-1).numpy()
    assert np.allclose(clip.encode_text(texts), ref, atol=2e-5)
    # OpenCLIP's cleaning: HTML entities and runs of white space
    assert np.allclose(clip.encode_text(["  a grinning&nbsp;face \n emoji "]), clip.encode_text(texts[:1]), atol=1e-6)


def vit_float64(state: dict, pixels: np.ndarray) -> np.ndarray:
    """OpenCLIP's ViT written out in float64 from the state dict: patches, class token, ln_pre,
    pre-norm blocks (multi-head attention, exact-GELU MLP), ln_post on the class token, proj."""
    from scipy.special import erf

    w = {k: v.double().numpy() for k, v in state.items() if k.startswith("visual.")}
    heads, patch = 2, 8

    def ln(x, name):
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w[name + ".weight"] + w[name + ".bias"]

    n, _, size, _ = pixels.shape
    g = size // patch
    cols = pixels.reshape(n, 3, g, patch, g, patch).transpose(0, 2, 4, 1, 3, 5).reshape(n, g * g, -1)
    x = cols @ w["visual.conv1.weight"].reshape(len(w["visual.conv1.weight"]), -1).T
    x = np.concatenate([np.broadcast_to(w["visual.class_embedding"], (n, 1, x.shape[2])), x], axis=1)
    x = ln(x + w["visual.positional_embedding"], "visual.ln_pre")
    width = x.shape[2]
    for i in range(4):
        b = f"visual.transformer.resblocks.{i}."
        q, k, v = np.split(ln(x, b + "ln_1") @ w[b + "attn.in_proj_weight"].T + w[b + "attn.in_proj_bias"], 3, -1)
        split = lambda t: t.reshape(n, -1, heads, width // heads).transpose(0, 2, 1, 3)  # noqa: E731
        logits = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(width // heads)
        att = np.exp(logits - logits.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        out = (att @ split(v)).transpose(0, 2, 1, 3).reshape(n, -1, width)
        x = x + out @ w[b + "attn.out_proj.weight"].T + w[b + "attn.out_proj.bias"]
        h = ln(x, b + "ln_2") @ w[b + "mlp.c_fc.weight"].T + w[b + "mlp.c_fc.bias"]
        h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
        x = x + h @ w[b + "mlp.c_proj.weight"].T + w[b + "mlp.c_proj.bias"]
    y = ln(x[:, 0], "visual.ln_post") @ w["visual.proj"]
    return y / np.linalg.norm(y, axis=1, keepdims=True)


def test_image_tower_equals_the_vit_in_float64(clip, state, tree):
    from anchordiv.encoders import open_rgb

    pics = emoji.load(tree)[:4]
    rgb = np.stack([np.asarray(open_rgb(e.path), dtype=np.float64) / 255 for e in pics])
    mean = np.array([0.48145466, 0.4578275, 0.40821073])
    std = np.array([0.26862954, 0.26130258, 0.27577711])
    pixels = ((rgb - mean) / std).transpose(0, 3, 1, 2)
    assert np.allclose(clip.encode_images([e.path for e in pics]), vit_float64(state, pixels), atol=2e-5)


def test_images_of_other_sizes_are_resized_and_centre_cropped(clip):
    from anchordiv.encoders._emoji_clip import preprocess

    wide = Image.new("RGB", (128, 64), (255, 255, 255))
    ImageDraw.Draw(wide).rectangle((48, 16, 79, 47), fill=(200, 30, 30))
    x = preprocess([wide], 64)
    assert x.shape == (1, 3, 64, 64)
    crop = wide.resize((128, 64)).crop((32, 0, 96, 64))  # already 64 high: only the centre crop
    assert np.allclose(x[0].numpy(), preprocess([crop], 64)[0].numpy())
    assert np.allclose(clip.encode_images([wide]), clip.encode_images([crop]), atol=1e-6)


def test_image_tower_reads_files_and_pil_images_alike(clip, tree):
    pics = emoji.load(tree)[:4]
    from_files = clip.encode_images([e.path for e in pics])
    with Image.open(pics[0].path) as im:
        from_pil = clip.encode_images([im.copy()])
    assert from_files.shape == (4, 128)
    assert np.allclose(np.linalg.norm(from_files, axis=1), 1, atol=1e-5)
    assert np.allclose(from_pil[0], from_files[0], atol=1e-6)


def test_equals_open_clip_where_it_is_installed(clip, state, tree):
    try:
        import open_clip
    except Exception as exc:  # open_clip or a torchvision that matches torch is missing
        pytest.skip(f"open_clip is not importable here ({type(exc).__name__}); the [open_clip] extra runs this")
    from anchordiv.encoders import minilm_path

    config = json.loads((emoji.CLIP_DIR / f"{emoji.CLIP_ARCH}.json").read_text())
    path = Path(str(tree)).parent / f"{emoji.CLIP_ARCH}.json"
    path.write_text(json.dumps(emoji.with_text_tower(config, str(minilm_path()))))
    open_clip.add_model_config(path)
    model, _, transform = open_clip.create_model_and_transforms(emoji.CLIP_ARCH, pretrained_text=True)
    model.load_state_dict(state, strict=False)
    model.eval()
    texts = ["a red apple emoji", "an emoji in google style"]
    pics = [e.path for e in emoji.load(tree)[:3]]
    from anchordiv.encoders import open_rgb

    with torch.no_grad():
        ref_t = model.encode_text(open_clip.get_tokenizer(emoji.CLIP_ARCH)(texts), normalize=True).numpy()
        ref_i = model.encode_image(torch.stack([transform(open_rgb(p)) for p in pics]), normalize=True).numpy()
    assert np.allclose(clip.encode_text(texts), ref_t, atol=1e-5)
    assert np.allclose(clip.encode_images(pics), ref_i, atol=1e-5)


def test_a_folder_of_the_same_layout_loads_and_a_bad_one_is_named(clip, tmp_path):
    from anchordiv.encoders import load

    for f in (f"{emoji.CLIP_ARCH}.json", f"{emoji.CLIP_ARCH}.pt"):
        (tmp_path / f).symlink_to(emoji.CLIP_DIR / f)
    enc = load(f"emoji-clip:{tmp_path}", device="cpu")
    assert enc.tau == clip.tau
    assert np.allclose(enc.encode_text(["a cat face emoji"]), clip.encode_text(["a cat face emoji"]), atol=1e-6)
    (tmp_path / f"{emoji.CLIP_ARCH}.pt").unlink()
    with pytest.raises(FileNotFoundError, match="NAME.json"):
        load(f"emoji-clip:{tmp_path}", device="cpu")


# ----------------------------------------------------------------------------- the demo


def _average_precision(scores: np.ndarray, relevant: np.ndarray) -> float:
    from sklearn.metrics import average_precision_score

    return float(average_precision_score(relevant, scores))


def test_image_demo_table_report_and_thumbnails(clip, tree, tmp_path):
    from anchordiv.apps.image_demo import run_image_demo

    res = run_image_demo(tmp_path / "out", encoder=clip, cache=tree, k=3, n_queries=2, echo=None)
    table = res["auprc"]
    assert list(table.index) == ["cosine", "softmax · objects", "softmax · styles"]
    assert list(table.columns) == ["object", "style"]
    X, labels = res["X"], res["labels"]
    assert len(X) == 24 and sorted(labels["style"].unique()) == ["google", "twitter"]
    # cosine row against an independent AP: every picture a query against all others
    S = X.astype(np.float64) @ X.T.astype(np.float64)
    for factor in ("object", "style"):
        lab = labels[factor].to_numpy()
        aps = [_average_precision(np.delete(S[i], i), np.delete(lab == lab[i], i)) for i in range(len(X))]
        assert table.loc["cosine", factor] == pytest.approx(np.mean(aps), abs=1e-6)
    assert res["anchor_sets"]["objects"].texts == [emoji.object_anchor(n) for n in sorted(labels["object"].unique())]
    html = res["report"].read_text(encoding="utf-8")
    thumbs = html.count("data:image/jpeg;base64,")
    assert thumbs == 2 * 3 * (1 + 3)  # 2 queries x 3 geometries x (query + 3 neighbours)
    src = html.split("data:image/jpeg;base64,", 1)[1].split('"', 1)[0]
    with Image.open(io.BytesIO(base64.b64decode(src))) as im:
        assert im.size[0] <= 160
        assert min(im.convert("RGB").getpixel((0, 0))) >= 245  # transparent corners shown white
    assert "softmax · objects (12 anchors)" in html and "softmax · styles (6 anchors)" in html
    csv = (tmp_path / "out" / "auprc.csv").read_text().splitlines()
    assert csv[0] == "geometry,object,style" and csv[1].startswith("cosine,")
    assert float(csv[1].split(",")[1]) == pytest.approx(table.loc["cosine", "object"], abs=1e-6)


def test_demo_images_command(tree, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from anchordiv.cli import cli

    monkeypatch.setenv("ANCHORDIV_EMOJI", str(tree))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "report"
    res = CliRunner().invoke(cli, ["demo", "--images", "--out", str(out), "-k", "2", "--queries", "1"])
    assert res.exit_code == 0, res.output
    assert "softmax · objects" in res.output and (out / "index.html").is_file()
    monkeypatch.setenv("ANCHORDIV_EMOJI", str(tmp_path / "nothing"))
    res = CliRunner().invoke(cli, ["demo", "--images", "--out", str(out)])
    assert res.exit_code != 0 and "python -m anchordiv.apps.emoji" in res.output


def test_image_demo_service_serves_thumbnails_and_both_contexts(clip, tree):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from anchordiv.apps.image_demo import build_image_demo_service
    from anchordiv.serve import ServerThread, create_app

    svc = build_image_demo_service(encoder=clip, cache=tree)
    with ServerThread(create_app(svc)) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        assert server.host == "127.0.0.1"
        thumb = client.get("/api/thumb/0")
        assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
        with Image.open(io.BytesIO(thumb.content)) as im:
            assert im.size[0] <= 160
        contexts = client.get("/api/contexts").json()
        assert {"objects", "styles"} <= set(json.dumps(contexts).replace('"', " ").split())
        X = svc.collection.embeddings
        for context in ("objects", "styles"):
            data = client.post("/api/search", json={"row": 0, "model": "softmax", "context": context, "k": 5}).json()
            geom = __import__("anchordiv").make_model("softmax", tau=svc.tau).fit(svc.anchors.sets[context])
            _, idx = geom.search(X[:1], X, k=5, exclude=np.array([[0]]))
            assert [h["id"] for h in data["results"]] == [int(i) for i in idx[0]]
            assert all(h["thumbnail"] == f"{server.url}/api/thumb/{h['id']}" for h in data["results"])


# ----------------------------------------------------------------------------- the real emoji


def test_committed_model_on_real_held_out_emoji(clip):
    """The held-out zero-shot accuracies of metrics.json, recomputed through the loading path."""
    try:
        pics = [e for e in emoji.load() if emoji.is_held_out(e.name)]
    except FileNotFoundError as exc:
        pytest.skip(f"no emoji in the npm cache: {exc}")
    reported = json.loads((emoji.CLIP_DIR / "metrics.json").read_text())["held_out"]
    X = clip.encode_images([e.path for e in pics])
    names = sorted({e.name for e in pics})

    def prompts(templates, key, values):
        E = clip.encode_text([t.format(**{key: v}) for v in values for t in templates])
        return E.reshape(len(values), len(templates), -1).mean(1)

    obj = prompts(emoji.OBJECT_TEMPLATES, "name", names)
    sty = prompts(emoji.STYLE_TEMPLATES, "style", emoji.VENDORS)
    object_top1 = (np.argmax(X @ obj.T, 1) == [names.index(e.name) for e in pics]).mean()
    style_top1 = (np.argmax(X @ sty.T, 1) == [emoji.VENDORS.index(e.vendor) for e in pics]).mean()
    assert len(names) == reported["emoji"] == 402 and len(pics) == reported["pictures"] == 804
    assert object_top1 == pytest.approx(reported["object_top1"], abs=0.01)
    assert style_top1 == pytest.approx(reported["style_top1"], abs=0.01)
    assert object_top1 >= 10 / len(names) and style_top1 >= 0.7  # ten times chance; chance is 0.5


def test_image_demo_page_shows_thumbnails_in_a_browser(clip, tree):
    import shutil

    pytest.importorskip("fastapi")
    sync_api = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (make setup installs it)")
    from anchordiv.apps.image_demo import build_image_demo_service
    from anchordiv.serve import ServerThread, create_app

    svc = build_image_demo_service(encoder=clip, cache=tree)
    with ServerThread(create_app(svc)) as server, sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        requests, errors = [], []
        page.on("request", lambda r: requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url + "/")
        page.wait_for_selector("body[data-ready=true]")
        page.fill("#q", emoji.object_anchor(held_out_names(1)[0]))
        page.keyboard.press("Enter")
        page.wait_for_function("() => document.getElementById('results').dataset.state === 'ready'")
        page.wait_for_function("() => { const im = [...document.querySelectorAll('.card img')];"
                               " return im.length > 0 && im.every(i => i.complete && i.naturalWidth > 0); }")
        sizes = page.eval_on_selector_all(".card img", "im => im.map(i => [i.naturalWidth, i.naturalHeight])")
        browser.close()
    assert errors == [] and len(sizes) >= 5
    assert all(0 < w <= 160 and 0 < h <= 160 for w, h in sizes)
    assert all(u.startswith(server.url + "/") for u in requests)
    assert sum("/api/thumb/" in u for u in requests) >= 5
