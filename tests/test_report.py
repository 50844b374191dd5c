"""Tests for anchordiv.report: neighbours, relevance marking, the HTML page and the PNG grid.

The HTML is parsed with the standard library's ``html.parser``.
"""

import base64
import io
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import re

import numpy as np
import pytest
import torch

import anchordiv as ad
from anchordiv.report import ComparisonResult, ReportGeometry, ReportPaths, compare, write_report

Image = pytest.importorskip("PIL.Image")

VOID = {"meta", "img", "br", "hr", "input", "link", "source", "wbr", "area", "base", "col", "embed", "track"}


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children, self.parts = [], []

    @property
    def classes(self):
        return set((self.attrs.get("class") or "").split())

    def text(self):
        return "".join(p if isinstance(p, str) else p.text() for p in self.parts)

    def iter(self):
        for c in self.children:
            yield c
            yield from c.iter()

    def find_all(self, tag=None, cls=None, **attrs):
        out = []
        for n in self.iter():
            if tag and n.tag != tag:
                continue
            if cls and cls not in n.classes:
                continue
            if any(n.attrs.get(k.replace("_", "-")) != v for k, v in attrs.items()):
                continue
            out.append(n)
        return out


class TreeParser(HTMLParser):
    """A minimal DOM: nodes with attributes, children and text (stdlib only)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("root", {}, None)
        self.cur = self.root
        self.all_attrs = []

    def handle_starttag(self, tag, attrs):
        self.all_attrs.extend(attrs)
        node = Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        self.cur.parts.append(node)
        if tag not in VOID:
            self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.all_attrs.extend(attrs)
        node = Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        self.cur.parts.append(node)

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.parts.append(data)


def parse(path):
    p = TreeParser()
    p.feed(Path(path).read_text(encoding="utf-8"))
    p.close()
    return p


def unit(rng, n, d):
    X = rng.normal(size=(n, d))
    return (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)


def brute_topk(geometry, X, rows, k):
    """Top-k by pairwise distances, own row excluded, ties by lower index."""
    D = np.asarray(geometry.pairwise(X[rows], X), dtype=np.float64)
    D[np.arange(len(rows)), rows] = np.inf
    return np.argsort(D, axis=1, kind="stable")[:, :k]


@pytest.fixture
def text_setup():
    rng = np.random.default_rng(0)
    n, d = 40, 16
    color = np.array(["red", "green", "blue", "gold"])[np.arange(n) % 4]
    shape = np.array(["cube", "ball"])[(np.arange(n) // 4) % 2]
    # embeddings that cluster by colour, so neighbours are partly relevant
    centers = unit(rng, 4, d)
    X = centers[np.arange(n) % 4] * 2 + rng.normal(size=(n, d)).astype(np.float32)
    X = (X / np.linalg.norm(X, axis=1, keepdims=True)).astype(np.float32)
    texts = [f"item {i}: a {color[i]} {shape[i]} on a table" for i in range(n)]
    phrases = ["a red thing", "a green thing", "a blue thing", "a gold thing"]
    anchors = ad.AnchorSet(unit(rng, 4, d), texts=phrases)
    geoms = {
        "cosine": ad.Cosine(),
        "softmax": ReportGeometry(ad.Softmax(tau=0.1).fit(anchors), label="softmax · colours (4 anchors)",
                                  anchors=anchors, factor="color"),
        "gaussian": ReportGeometry(ad.Gaussian(tau=0.1).fit(anchors), anchors=anchors, factor="shape",
                                   mark=["shape"]),
    }
    return dict(X=X, texts=texts, labels={"color": color, "shape": shape}, geoms=geoms, anchors=anchors)


def test_compare_neighbours_match_brute_force(text_setup):
    s = text_setup
    qi = [3, 17, 30]
    res = compare(s["X"], s["X"], s["geoms"], k=5, query_indices=qi, labels=s["labels"], items=s["texts"])
    assert isinstance(res, ComparisonResult)
    assert [r.name for r in res.rows] == ["cosine", "softmax", "gaussian"]
    for name, spec in s["geoms"].items():
        geom = spec.geometry if isinstance(spec, ReportGeometry) else spec
        np.testing.assert_array_equal(res.indices[name], brute_topk(geom, s["X"], np.array(qi), 5))
        assert res.distances[name].shape == (3, 5)
        assert np.all(np.diff(res.distances[name], axis=1) >= -1e-9)
    for name in res.indices:
        for f, lab in s["labels"].items():
            expect = lab[res.indices[name]] == lab[np.array(qi)][:, None]
            np.testing.assert_array_equal(res.relevant[name][f], expect)
            np.testing.assert_allclose(res.precision_at_k(name, f), expect.mean(1))


def test_exclude_self_false_keeps_own_row(text_setup):
    s = text_setup
    res = compare(s["X"], s["X"], {"cosine": ad.Cosine()}, k=3, query_indices=[5, 9], exclude_self=False)
    np.testing.assert_array_equal(res.indices["cosine"][:, 0], [5, 9])


def test_html_structure_and_markers(text_setup, tmp_path):
    s = text_setup
    qi = [3, 17]
    k = 4
    res = compare(s["X"], s["X"], s["geoms"], k=k, query_indices=qi, labels=s["labels"], items=s["texts"],
                  info={"collection": "toy"})
    paths = write_report(res, tmp_path / "rep", title="Toy report")
    assert isinstance(paths, ReportPaths)
    assert Path(paths) == tmp_path / "rep" / "index.html" == paths.html
    p = parse(paths.html)
    root = p.root
    assert root.find_all("title")[0].text() == "Toy report"

    # factor names reach attribute names only as tokens, listed in the header
    tokens = {sp.attrs["data-factor"]: sp.attrs["data-token"] for sp in root.find_all("span", cls="factor")}
    assert tokens == {"color": "f0", "shape": "f1"}
    assert [sp.text() for sp in root.find_all("span", cls="factor")] == ["color", "shape"]

    sections = root.find_all("section", cls="query")
    assert len(sections) == len(qi)
    for sec, q in zip(sections, qi):
        assert int(sec.attrs["data-query-row"]) == q
        assert s["texts"][q] in sec.find_all("p", cls="qtext")[0].text()
        qvalues = sec.find_all("p", cls="qvalues")[0].text()
        assert f"color: {s['labels']['color'][q]}" in qvalues
        rows = sec.find_all("div", cls="row")
        assert [r.attrs["data-geometry"] for r in rows] == ["cosine", "softmax", "gaussian"]
        for row in rows:
            name = row.attrs["data-geometry"]
            grow = res.row(name)
            label = row.find_all("div", cls="rowlabel")[0]
            assert grow.label in label.text()
            if name != "cosine":
                assert "a red thing" in label.find_all("summary")[0].text()
                assert len(label.find_all("li")) == 4
            # the query card, shown in every row
            qcards = row.find_all("div", cls="query")
            assert len(qcards) == 1 and s["texts"][q] in qcards[0].text()
            cards = row.find_all("div", cls="nbr")
            assert len(cards) == k
            j = qi.index(q)
            assert [int(c.attrs["data-row"]) for c in cards] == res.indices[name][j].tolist()
            for rank, c in enumerate(cards):
                g = int(c.attrs["data-row"])
                assert int(c.attrs["data-rank"]) == rank + 1
                assert g != q
                assert s["texts"][g] in c.text()
                for f, lab in s["labels"].items():
                    assert c.attrs[f"data-relevant-{tokens[f]}"] == ("1" if lab[g] == lab[q] else "0")
                # green border exactly where the row's primary factor matches
                primary = grow.factor
                assert ("hit" in c.classes) == (primary is not None and s["labels"][primary][g] == s["labels"][primary][q])
                chips = {ch.attrs["data-factor"]: ch for ch in c.find_all("span", cls="chip")}
                assert set(chips) == set(grow.mark)
                for f, ch in chips.items():
                    same = s["labels"][f][g] == s["labels"][f][q]
                    assert ("yes" in ch.classes) == same and ("no" in ch.classes) == (not same)
                    assert ch.text().startswith("✓" if same else "✗")
                    assert str(s["labels"][f][g]) in ch.text()
            precs = {sp.attrs["data-factor"]: float(sp.attrs["data-precision"])
                     for sp in label.find_all("span") if "data-precision" in sp.attrs}
            assert set(precs) == set(grow.mark) | ({grow.factor} if grow.factor else set())
            for f, v in precs.items():
                assert v == pytest.approx(round(float(res.precision_at_k(name, f)[j]), 2))

    # self-contained: no external resources, no scripts, CSS inline
    for name, value in p.all_attrs:
        if value and name in ("src", "href", "srcset", "data", "action"):
            assert value.startswith(("data:", "#")), (name, value)
        assert "http:" not in (value or "") and "https:" not in (value or "")
    html_text = paths.html.read_text(encoding="utf-8")
    assert "<script" not in html_text and "<link" not in html_text and "@import" not in html_text
    assert "url(" not in html_text
    assert root.find_all("style")

    # the PNG grid
    assert paths.png == tmp_path / "rep" / "grid.png"
    with Image.open(paths.png) as im:
        w, h = im.size
        assert im.format == "PNG"
    assert 600 <= w <= 12000 and 300 <= h <= 12000
    assert h > w / 3  # 2 queries × 3 rows


def test_text_is_escaped(tmp_path):
    X = np.eye(3, dtype=np.float32)
    items = ["<script>alert(1)</script>", "a & b", 'quote " here']
    res = compare(X, X, {"cosine": ad.Cosine()}, k=2, items=items)
    paths = write_report(res, tmp_path, png=False)
    text = paths.html.read_text(encoding="utf-8")
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert paths.png is None and not (tmp_path / "grid.png").exists()
    cards = parse(paths.html).root.find_all("div", cls="nbr")
    assert any(items[0] in c.text() for c in cards)


def _make_images(folder, n):
    folder.mkdir()
    paths = []
    for i in range(n):
        im = Image.new("RGB", (40 + 7 * i, 30 + 3 * i), color=(20 * i % 256, 120, 255 - 20 * i % 256))
        p = folder / f"img_{i}.png"
        im.save(p)
        paths.append(p)
    return paths


def test_image_collection_embeds_thumbnails(tmp_path):
    rng = np.random.default_rng(1)
    n, k = 10, 3
    paths = _make_images(tmp_path / "imgs", n)
    paths[7] = tmp_path / "imgs" / "missing.png"  # unreadable: shown as unavailable
    X = unit(rng, n, 8)
    anchors = ad.AnchorSet(unit(rng, 3, 8), texts=["x", "y", "z"])
    geoms = {"cosine": ad.Cosine(), "softmax": ReportGeometry(ad.Softmax(tau=0.2).fit(anchors), anchors=anchors)}
    kind = np.array(["a", "b"])[np.arange(n) % 2]
    res = compare(X, X, geoms, k=k, query_indices=[0, 1], items=[str(p) for p in paths], kind="image",
                  labels={"kind": kind})
    assert res.row("softmax").label == "softmax (3 anchors)"
    out = write_report(res, tmp_path / "rep")
    root = parse(out.html).root
    imgs = root.find_all("img")
    n_missing = sum(int(c.attrs["data-row"]) == 7 for c in root.find_all("div", cls="nbr"))
    assert len(imgs) == 2 * len(geoms) * (k + 1) - n_missing
    for img in imgs:
        src = img.attrs["src"]
        assert src.startswith("data:image/jpeg;base64,")
        with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as thumb:
            assert max(thumb.size) <= 160
    assert len(root.find_all("div", cls="missing")) == n_missing
    for name, value in parse(out.html).all_attrs:
        assert "http" not in (value or "")
    with Image.open(out.png) as im:
        assert im.size[0] > 500 and im.size[1] > 300


def test_pil_images_as_items(tmp_path):
    X = np.eye(4, dtype=np.float32)
    items = [Image.new("RGB", (20, 20), color=(60 * i, 0, 0)) for i in range(4)]
    res = compare(X, X, {"cosine": ad.Cosine()}, k=2, items=items, kind="image")
    out = write_report(res, tmp_path, png=False)
    assert len(parse(out.html).root.find_all("img")) == 4 * 3


def test_relevance_function_and_external_queries(text_setup, tmp_path):
    s = text_setup
    X, labels = s["X"], s["labels"]
    Q = X[[2, 11]] + 0.01
    calls = []

    def even(q, idx):
        calls.append(q)
        return idx % 2 == 0

    res = compare(
        Q, X, {"cosine": ad.Cosine()}, k=4, query_rows=[None, 11], query_items=["my query", "other"],
        query_titles=["first", "second"], labels={"parity": even, "color": labels["color"]},
        query_labels={"color": ["red", labels["color"][11]]},
    )
    assert sorted(set(calls)) == [0, 1]
    idx = res.indices["cosine"]
    assert 11 not in idx[1]  # its own gallery row is excluded
    np.testing.assert_array_equal(res.relevant["cosine"]["parity"], idx % 2 == 0)
    np.testing.assert_array_equal(res.relevant["cosine"]["color"][0], labels["color"][idx[0]] == "red")
    assert res.query_titles == ["first", "second"]
    out = write_report(res, tmp_path, png=False)
    root = out.html.read_text(encoding="utf-8")
    assert "my query" in root and "second" in root
    frame = res.to_frame()
    assert len(frame) == 2 * 4 and {"relevant_parity", "relevant_color"} <= set(frame.columns)
    assert frame["row"].tolist() == idx.reshape(-1).tolist() == frame["id"].tolist()  # no ids: the rows
    assert res.query_titles == ["first", "second"] and res.item_label(11) == "row 11"


def test_items_are_named_by_id_and_row(text_setup, tmp_path):
    """With ids, the report and the table name each neighbour by its id and its row."""
    s = text_setup
    X = s["X"]
    ids = [f"x{100 + i}" for i in range(len(X))]
    res = compare(X[[3]], X, {"cosine": ad.Cosine()}, k=3, query_rows=[3], item_ids=ids)
    idx = res.indices["cosine"][0]
    frame = res.to_frame()
    assert frame["row"].tolist() == idx.tolist() and frame["id"].tolist() == [ids[g] for g in idx]
    assert res.query_titles == ["Query 1 · id x103 (row 3)"] and res.item_id(5) == "x105"
    root = parse(write_report(res, tmp_path, png=False).html).root
    cards = root.find_all("div", cls="nbr")
    assert [c.attrs["data-id"] for c in cards] == [ids[g] for g in idx]
    assert [int(c.attrs["data-row"]) for c in cards] == idx.tolist()
    assert "query · id x103 (row 3)" in root.find_all("div", cls="query")[0].text()


def test_unknown_query_labels_show_no_markers(text_setup, tmp_path):
    s = text_setup
    res = compare(s["X"][:2], s["X"], {"cosine": ad.Cosine()}, k=3, labels={"color": s["labels"]["color"]})
    assert not res.known["color"].any()
    assert np.isnan(res.precision_at_k("cosine", "color")).all()
    root = parse(write_report(res, tmp_path, png=False).html).root
    assert not root.find_all("span", cls="chip")


def test_torch_inputs(text_setup):
    s = text_setup
    Xt = torch.from_numpy(s["X"])
    res_t = compare(Xt, Xt, {"cosine": ad.Cosine()}, k=3, query_indices=[1, 2])
    res_n = compare(s["X"], s["X"], {"cosine": ad.Cosine()}, k=3, query_indices=[1, 2])
    np.testing.assert_array_equal(res_t.indices["cosine"], res_n.indices["cosine"])


def test_collection_gallery(tmp_path):
    pd = pytest.importorskip("pandas")
    from anchordiv.io import Collection

    X = np.eye(6, dtype=np.float32) + 0.1
    meta = pd.DataFrame({"caption": [f"text {i}" for i in range(6)], "label": list("aabbcc")})
    coll = Collection(X, metadata=meta, kind="text")
    res = compare(coll, coll, {"cosine": ad.Cosine()}, k=2, query_indices=[0], labels="label")
    assert res.factors == ["label"]
    assert res.query_items == ["text 0"]
    assert res.items[3] == "text 3"
    with pytest.raises(KeyError):
        compare(coll, coll, {"cosine": ad.Cosine()}, k=2, labels=["nope"])


def test_errors(text_setup):
    s = text_setup
    X = s["X"]
    with pytest.raises(ValueError, match="geometries"):
        compare(X, X, {})
    with pytest.raises(ValueError, match="k="):
        compare(X, X, {"cosine": ad.Cosine()}, k=len(X))
    with pytest.raises(ValueError, match="kind"):
        compare(X, X, {"cosine": ad.Cosine()}, kind="video")
    with pytest.raises(ValueError, match="factor"):
        compare(X, X, {"c": ReportGeometry(ad.Cosine(), factor="nope")}, labels=s["labels"])
    with pytest.raises(ValueError, match="factor"):
        compare(X, X, {"cosine": ad.Cosine()}, labels=s["labels"], mark=["nope"])
    with pytest.raises(ValueError, match="one label per row"):
        compare(X, X, {"cosine": ad.Cosine()}, labels={"color": ["a", "b"]})
    with pytest.raises(ValueError, match="query_indices"):
        compare(X, X, {"cosine": ad.Cosine()}, query_indices=[len(X)])
    with pytest.raises(ValueError, match="items"):
        compare(X, X, {"cosine": ad.Cosine()}, items=["a"])
    with pytest.raises(ValueError, match="ComparisonResult"):
        write_report({"not": "a result"}, os.devnull)


def test_text_query_on_image_gallery(tmp_path):
    rng = np.random.default_rng(2)
    paths = _make_images(tmp_path / "imgs", 6)
    X = unit(rng, 6, 8)
    coll_items = [str(p) for p in paths]
    res = compare(unit(rng, 1, 8), X, {"cosine": ad.Cosine()}, k=3, items=coll_items, kind="image",
                  query_items=["a red car"])
    out = write_report(res, tmp_path / "rep")
    root = parse(out.html).root
    qcard = root.find_all("div", cls="query")[0]
    assert "a red car" in qcard.text() and not qcard.find_all("img")
    assert len(root.find_all("img")) == 3
    assert out.png.is_file()


def test_cards_inline_html_top_anchors_and_long_texts(tmp_path):
    import anchordiv as ad
    from anchordiv.diagnostics import explain
    from anchordiv.report import CARD_CHARS, ReportGeometry, cards, write_report

    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 8))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    A = ad.AnchorSet(X[:3], texts=["no pleural effusion", "effusion <b>", "heart & lungs"])
    long = "start of a long report " * 20 + "<script>alert(1)</script> the end"
    items = [long if i == 1 else f"item {i}" for i in range(12)]
    g = ad.Softmax(tau=0.1).fit(A)
    res = cards(X[:2], X, ReportGeometry(g, anchors=A, factor="lab"), k=3, items=items,
                labels={"lab": [i % 2 for i in range(12)]}, query_rows=[0, 1], name="softmax")
    # the same neighbours as the geometry's own search, which still returns (distances, indices)
    d, i = g.search(X[:2], X, k=3, exclude=np.array([0, 1]))
    np.testing.assert_array_equal(res.indices["softmax"], np.asarray(i))
    ex = explain(A, X[:2], 0.1, top=3)
    assert res.top_anchors["softmax"][1] == [(a, pytest.approx(p)) for a, p in ex.top_anchors(1)]
    html = res._repr_html_()
    assert html.startswith('<div class="anchordiv-report">') and "<html" not in html and "<body" not in html
    # its styles apply inside the fragment only: no rule restyles the rest of a notebook page
    style = html.split("<style>", 1)[1].split("</style>", 1)[0]
    rules = re.findall(r"(?m)^([^\s{}][^{}]*?)\s*\{", style)
    assert len(rules) > 20 and all(sel.strip().startswith(".anchordiv-report") for r in rules for sel in r.split(","))
    assert '"Segoe UI"' in style  # the stylesheet is not HTML-escaped
    assert "top anchors: " in html and "effusion &lt;b&gt;" in html and "heart &amp; lungs" in html
    # a long text: its start on the card, the full text (escaped) behind <details>
    assert len(long) > CARD_CHARS
    assert '<details class="text long"><summary>start of a long report' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt; the end" in html and "<script>alert" not in html
    page = write_report(res, tmp_path)
    text = page.html.read_text()
    assert text.startswith("<!DOCTYPE html>") and '<details class="text long">' in text
    assert page.png.stat().st_size > 0
