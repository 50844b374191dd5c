"""Hostile inputs to anchordiv.report: markup in names, ``$`` in texts, image bombs, FIFOs and devices,
numpy integers as arguments, and silenced progress bars.

Everything is real: the HTML is parsed with the standard library's ``html.parser``, images are
written and read with Pillow, the PNG is drawn by matplotlib.
"""

import html
import importlib
import os
import re
import struct
import threading
import zlib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

import anchordiv as ad
from anchordiv import report
from anchordiv.report import ReportGeometry, compare, write_report

Image = pytest.importorskip("PIL.Image")
search_module = importlib.import_module("anchordiv.exact")

PAYLOADS = ["x><script>alert(1)</script><b", '"><img src=x onerror=alert(1)>']

#: Every element the report may contain.
REPORT_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "section", "div", "span", "b",
               "details", "summary", "ol", "li", "img"}

#: Every attribute name the report may write, besides ``data-*`` names of the safe form.
REPORT_ATTRS = {"lang", "charset", "class", "title", "alt", "src", "style"}


class Collect(HTMLParser):
    """All start tags with their attributes, and all text (each piece after the tag it follows)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.data, self.cur = [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        self.cur = len(self.tags) - 1

    handle_startendtag = handle_starttag

    def handle_endtag(self, tag):
        self.cur = None

    def handle_data(self, data):
        self.data.append((self.cur, data))

    @property
    def text(self):
        return "".join(d for _, d in self.data)

    def _matches(self, i, tag, cls):
        t, a = self.tags[i]
        return t == tag and (cls is None or cls in (dict(a).get("class") or "").split())

    def find(self, tag, cls=None):
        """Attributes of the matching start tags."""
        return [dict(self.tags[i][1]) for i in range(len(self.tags)) if self._matches(i, tag, cls)]

    def own_text(self, tag, cls=None):
        """Text right after each matching start tag (up to the next tag)."""
        out = {i: "" for i in range(len(self.tags)) if self._matches(i, tag, cls)}
        for i, d in self.data:
            if i in out:
                out[i] += d
        return list(out.values())


def collect(path):
    p = Collect()
    p.feed(Path(path).read_text(encoding="utf-8"))
    p.close()
    return p


def assert_no_injection(p):
    """No script, no event handler, no element or attribute the report does not write itself."""
    assert not [t for t, _ in p.tags if t == "script"]  # the report has no script of its own
    assert not [a for t, a in p.tags if t == "img" and "onerror" in dict(a)]
    assert p.tags and p.tags[0][0] == "html"
    for tag, attrs in p.tags:
        assert tag in REPORT_TAGS, tag
        for name, _ in attrs:
            assert not any(bad in name for bad in ("script", "onerror", "<", ">", '"', "'", "=", "/")), name
            assert not name.startswith("on"), name
            assert name in REPORT_ATTRS or re.fullmatch(r"data-[a-z0-9-]+", name), (tag, name)
            if name.startswith("data-relevant-"):
                assert re.fullmatch(r"data-relevant-f\d+", name), name


def assert_shown(p, raw, text):
    """``text`` is shown as text, and is escaped in the raw HTML (quotes as named or numeric entities)."""
    assert text in p.text, text
    assert html.escape(text, quote=True) in raw.replace("&#34;", "&quot;").replace("&#39;", "&#x27;")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_payloads_in_every_field_are_escaped(payload, tmp_path):
    rng = np.random.default_rng(0)
    n, k = 8, 4
    X = rng.normal(size=(n, 6)).astype(np.float32)
    # names and values exactly the payload; texts prefixed, to tell the fields apart
    factor = set_name = value = title = payload
    labels = {factor: [value if i % 2 else "plain" for i in range(n)], "shape": list("abababab")}
    captions = [f"caption {i} {payload}" for i in range(n)]
    anchors = ad.AnchorSet(rng.normal(size=(2, 6)).astype(np.float32),
                           texts=[f"anchor {payload}", f"anchor two {payload}"])
    geoms = {
        "cosine": ad.Cosine(),
        set_name: ReportGeometry(ad.Softmax(tau=0.2).fit(anchors), label=f"label {payload}", anchors=anchors,
                                 factor=factor, mark=[factor, "shape"]),
    }
    titles = [f"query title {i} {payload}" for i in range(n)]
    info = {f"info key {payload}": f"info value {payload}"}
    res = compare(X, X, geoms, k=k, query_indices=[1, 2], labels=labels, items=captions, query_titles=titles,
                  info=info)
    out = write_report(res, tmp_path / "rep", title=title)
    raw = out.html.read_text(encoding="utf-8")
    p = collect(out.html)
    assert_no_injection(p)

    for shown in [payload, captions[1], captions[2], titles[1], titles[2], f"label {payload}", f"anchor {payload}",
                  f"anchor two {payload}", f"info key {payload}: info value {payload}"]:
        assert_shown(p, raw, shown)
    assert p.own_text("title") == [title] and p.own_text("h1") == [title]
    assert p.own_text("h2") == [titles[1], titles[2]]
    assert p.own_text("div", "glabel") == ["cosine", f"label {payload}"] * 2
    assert p.own_text("li") == [f"anchor {payload}", f"anchor two {payload}"] * 2
    # the human names stay in attribute values and text; attribute names use tokens
    assert [a["data-factor"] for a in p.find("span", "factor")] == [factor, "shape"]
    assert [a["data-token"] for a in p.find("span", "factor")] == ["f0", "f1"]
    assert p.own_text("span", "factor") == [factor, "shape"]
    assert [a["data-geometry"] for a in p.find("div", "row")] == ["cosine", set_name] * 2
    assert [a["data-factor"] for a in p.find("div", "row")] == ["", factor] * 2
    assert {a["data-factor"] for a in p.find("span", "chip")} == {factor, "shape"}
    chips = [t for a, t in zip(p.find("span", "chip"), p.own_text("span", "chip")) if a["data-factor"] == factor]
    assert chips and all(t[2:] in (value, "plain") for t in chips) and any(t[2:] == value for t in chips)
    assert {a["title"] for a in p.find("div", "text")} >= {captions[1], captions[2]}
    # the relevance of each neighbour is readable through the tokens
    cards, q = [], None
    for t, a in p.tags:
        a = dict(a)
        if t == "section":
            q = int(a["data-query-row"])
        if t == "div" and "nbr" in a["class"].split():
            g = int(a["data-row"])
            cards.append(g)
            for tok, f in (("f0", factor), ("f1", "shape")):
                assert a[f"data-relevant-{tok}"] == ("1" if labels[f][g] == labels[f][q] else "0")
    assert len(cards) == 2 * 2 * k
    with Image.open(out.png) as im:
        assert im.format == "PNG" and im.size[0] > 500


@pytest.mark.parametrize("payload", PAYLOADS)
def test_payloads_in_image_paths_are_escaped(payload, tmp_path):
    X = np.eye(5, dtype=np.float32) + 0.05
    folder = tmp_path / "imgs"
    folder.mkdir()
    real = folder / "ok.png"
    Image.new("RGB", (20, 10), (200, 0, 0)).save(real)
    items = [str(real), str(real), f"missing {payload}.png", str(real), str(real)]
    if "/" not in payload:  # a file name may hold this payload: it reaches alt= and title=
        named = folder / f"{payload}.png"
        Image.new("RGB", (10, 20), (0, 200, 0)).save(named)
        items[3] = str(named)
    res = compare(X, X, {f"set {payload}": ad.Cosine()}, k=4, query_indices=[0], items=items, kind="image")
    out = write_report(res, tmp_path / "rep", title=payload)
    raw = out.html.read_text(encoding="utf-8")
    p = collect(out.html)
    assert_no_injection(p)
    assert_shown(p, raw, f"image unavailable: missing {payload}.png")
    assert out.skipped == {"missing": 1}
    if "/" not in payload:
        assert f"{payload}.png" in {a["alt"] for a in p.find("img")}


def test_dollar_signs_are_literal_in_png(tmp_path):
    X = np.eye(5, dtype=np.float32) + 0.05
    items = ["costs $5 and $10", r"broken $\frac{x}{$ math", "$x^$ here", "plain", "a $ b"]
    labels = {"price $": ["$1", "$2$", "$3", r"$\sqrt{$", "$5"]}
    geoms = {"g": ReportGeometry(ad.Cosine(), label=r"label $\alpha_$", anchors=[r"$\frac{1}{$"],
                                 factor="price $")}
    res = compare(X, X, geoms, k=3, query_indices=[0, 1], labels=labels, items=items,
                  query_titles=[r"q $\frac{$", "q2 $x^$", "a", "b", "c"])
    out = write_report(res, tmp_path / "rep", title=r"a $\frac{x}{")
    assert out.png.is_file()
    with Image.open(out.png) as im:
        assert im.format == "PNG" and im.size[0] > 500 and im.size[1] > 300
    raw = out.html.read_text(encoding="utf-8")
    assert "costs $5 and $10" in raw and r"a $\frac{x}{" in raw
    # the same title alone, and a title that is valid mathtext-looking but must stay literal
    out2 = write_report(res, tmp_path / "rep2", title="costs $5 and $10 $\\frac{x}{$")
    assert out2.png.is_file()


# ---------------------------------------------------------------------------
# images that must not be decoded


def _png_chunk(tag, data):
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def _bomb_png(path, side=20000):
    """A valid 1-bit ``side`` x ``side`` PNG, all black: tiny on disk, huge when decoded."""
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + (side + 7) // 8)
    block = row * 1000
    idat = b"".join(comp.compress(block) for _ in range(side // 1000)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)
                     + _png_chunk(b"IEND", b""))
    return path


def _image_report(tmp_path, items, **kwargs):
    """A report whose query (row 0) has every other item as a neighbour."""
    n = len(items)
    X = np.eye(n, dtype=np.float32) + 0.05
    res = compare(X, X, {"cosine": ad.Cosine()}, k=n - 1, query_indices=[0], items=[str(i) for i in items],
                  kind="image")
    return write_report(res, tmp_path / "rep", **kwargs)


def _reasons(out):
    return [a["data-reason"] for a in collect(out.html).find("div", "missing")]


def _ok_image(tmp_path, name="ok.png", size=(24, 16)):
    p = tmp_path / name
    Image.new("RGB", size, (10, 120, 200)).save(p)
    return p


def test_decompression_bomb_png_is_skipped(tmp_path, monkeypatch):
    bomb = _bomb_png(tmp_path / "bomb.png")
    assert bomb.stat().st_size < 1_000_000
    with pytest.raises(Image.DecompressionBombError):  # Pillow refuses it...
        Image.open(bomb)
    with monkeypatch.context() as m:  # ...and without the limit reads it as a real PNG (lazily)
        m.setattr(Image, "MAX_IMAGE_PIXELS", None)
        with Image.open(bomb) as im:
            assert im.format == "PNG" and im.size == (20000, 20000) and im.mode == "1"
    ok = _ok_image(tmp_path)
    out = _image_report(tmp_path, [ok, bomb, ok, ok])
    assert out.skipped == {"decompression_bomb": 1}
    assert _reasons(out) == ["decompression_bomb"]
    p = collect(out.html)
    assert len(p.find("img")) == 1 + 2  # the query and the two readable neighbours
    assert any("1 decompression bomb" in d for d in p.data)
    assert out.png.is_file()


def test_decompression_bomb_limits_of_pillow_are_honoured(tmp_path, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    small = _ok_image(tmp_path, "small.png", (10, 10))  # 100 pixels: fine
    warn = _ok_image(tmp_path, "warn.png", (40, 30))  # 1200 pixels: Pillow warns
    error = _ok_image(tmp_path, "error.png", (60, 60))  # 3600 pixels: Pillow raises
    out = _image_report(tmp_path, [small, warn, small, error])
    assert out.skipped == {"decompression_bomb": 2}
    assert _reasons(out) == ["decompression_bomb", "decompression_bomb"]
    assert len(collect(out.html).find("img")) == 2
    assert out.png.is_file()


def _finishes(fn, timeout=20.0, release=None):
    """Run ``fn`` in a thread; its result, or fail when it is still running after ``timeout`` s."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # re-raised below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        if release is not None:
            release()
        pytest.fail(f"still running after {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_fifo_image_is_skipped_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    ok = _ok_image(tmp_path)

    def release():  # unblock a reader stuck in open()
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass

    out = _finishes(lambda: _image_report(tmp_path, [ok, fifo, ok]), release=release)
    assert out.skipped == {"not_a_file": 1}
    assert _reasons(out) == ["not_a_file"]
    assert len(collect(out.html).find("img")) == 2
    assert out.png.is_file()


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_device_image_is_skipped(tmp_path):
    ok = _ok_image(tmp_path)
    out = _finishes(lambda: _image_report(tmp_path, [ok, "/dev/zero", ok, tmp_path]))
    assert out.skipped == {"not_a_file": 2}  # the device and the folder
    assert _reasons(out) == ["not_a_file", "not_a_file"]
    assert len(collect(out.html).find("img")) == 2


def test_oversize_image_file_is_skipped(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    big = tmp_path / "big.png"
    Image.fromarray(rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)).save(big)
    small = _ok_image(tmp_path, "small.png", (4, 4))
    monkeypatch.setattr(report, "MAX_IMAGE_BYTES", 2000)
    assert big.stat().st_size > 2000 >= small.stat().st_size
    out = _finishes(lambda: _image_report(tmp_path, [small, big, small]))
    assert out.skipped == {"too_large": 1}
    assert _reasons(out) == ["too_large"]
    assert len(collect(out.html).find("img")) == 2
    monkeypatch.setattr(report, "MAX_IMAGE_BYTES", 64 * 2**20)
    out = _image_report(tmp_path, [small, big, small])
    assert out.skipped == {} and len(collect(out.html).find("img")) == 3


def test_max_image_bytes_default():
    assert report.MAX_IMAGE_BYTES == 64 * 2**20


# ---------------------------------------------------------------------------
# int arguments and progress


def _setup():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(12, 6)).astype(np.float32)
    anchors = ad.AnchorSet(rng.normal(size=(3, 6)).astype(np.float32), texts=["a", "b", "c"])
    geoms = {"cosine": ad.Cosine(), "softmax": ReportGeometry(ad.Softmax(tau=0.3).fit(anchors), anchors=anchors)}
    return X, geoms


def test_numpy_integers_are_accepted(tmp_path):
    X, geoms = _setup()
    a = compare(X, X, geoms, k=3, query_indices=[1, 4])
    b = compare(X, X, geoms, k=np.int64(3), query_indices=np.array([1, 4], dtype=np.int32))
    assert type(b.k) is int and b.k == 3
    for name in geoms:
        np.testing.assert_array_equal(a.indices[name], b.indices[name])
        np.testing.assert_array_equal(a.distances[name], b.distances[name])
    np.testing.assert_array_equal(b.query_indices, [1, 4])

    paths = [tmp_path / f"im{i}.png" for i in range(12)]
    for i, p in enumerate(paths):
        Image.new("RGB", (30 + i, 20), (20 * i, 100, 50)).save(p)
    res = compare(X, X, geoms, k=3, query_indices=[1], items=[str(p) for p in paths], kind="image")
    o1 = write_report(res, tmp_path / "a", thumbnail_px=24)
    o2 = write_report(res, tmp_path / "b", thumbnail_px=np.int64(24))
    assert o1.html.read_text(encoding="utf-8") == o2.html.read_text(encoding="utf-8")
    with Image.open(o1.png) as i1, Image.open(o2.png) as i2:
        assert np.array_equal(np.asarray(i1), np.asarray(i2))


@pytest.mark.parametrize("kwargs, name", [
    (dict(k=True), "k"), (dict(k=3.0), "k"), (dict(k=np.float64(3)), "k"), (dict(k="3"), "k"), (dict(k=0), "k"),
    (dict(query_indices=[1.5]), "query_indices"), (dict(query_indices=[True, False]), "query_indices"),
    (dict(query_indices=np.array([1.0, 2.0])), "query_indices"),
])
def test_bad_int_arguments_of_compare(kwargs, name):
    X, geoms = _setup()
    kwargs = {"k": 3, **kwargs}
    with pytest.raises(ValueError, match=rf"^{name}\b"):
        compare(X, X, geoms, **kwargs)


@pytest.mark.parametrize("px", [True, 24.5, np.float32(24), "24", 0, None])
def test_bad_thumbnail_px(px, tmp_path):
    X, geoms = _setup()
    res = compare(X, X, geoms, k=3, query_indices=[1])
    with pytest.raises(ValueError, match="thumbnail_px"):
        write_report(res, tmp_path, thumbnail_px=px, png=False)
    assert not (tmp_path / "index.html").exists()


def test_progress_false_silences_every_bar(tmp_path, capfd, monkeypatch):
    X, geoms = _setup()
    capfd.readouterr()
    compare(X, X, geoms, k=3, progress=True)  # control: the bars do reach stderr
    err = capfd.readouterr().err
    assert "search (Cosine)" in err and "search (Softmax)" in err

    monkeypatch.setattr(search_module, "PROGRESS_WORK", 0)  # every search counts as long
    compare(X, X, geoms, k=3)
    assert "search (" in capfd.readouterr().err

    res = compare(X, X, geoms, k=3, query_indices=[0, 5], progress=False)
    write_report(res, tmp_path / "rep")
    cap = capfd.readouterr()
    assert cap.err == "" and cap.out == ""
    loud = compare(X, X, geoms, k=3, query_indices=[0, 5], progress=True)
    for name in geoms:  # the bars change nothing else
        np.testing.assert_array_equal(res.indices[name], loud.indices[name])
