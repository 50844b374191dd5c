"""Tests for anchordiv.apps.demo: the scene collection, the anchor sets and an end-to-end run.

The end-to-end run uses the real ``minilm`` encoder (offline, from its PyPI package) on a
small collection; it is skipped when the encoder's packages are not installed.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import csv  # noqa: E402
import re  # noqa: E402
from html.parser import HTMLParser  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from anchordiv.apps.demo import (  # noqa: E402
    ANCHOR_DESIGNS,
    ANCHOR_FACTORS,
    BREEDS,
    CLOTHING,
    FACTORS,
    PLACES,
    TEMPLATES,
    make_scene_collection,
    pick_queries,
    run_demo,
    scene_anchor_sets,
)

pd = pytest.importorskip("pandas")

VALUES = {"breed": BREEDS, "place": PLACES, "clothing": CLOTHING}


def test_collection_is_deterministic():
    a_texts, a_labels = make_scene_collection(120, seed=3)
    b_texts, b_labels = make_scene_collection(120, seed=3)
    assert a_texts == b_texts
    pd.testing.assert_frame_equal(a_labels, b_labels)
    c_texts, _ = make_scene_collection(120, seed=4)
    assert c_texts != a_texts
    assert list(a_labels.columns) == ["breed", "place", "clothing", "template"]
    assert len(a_texts) == len(a_labels) == 120


@pytest.mark.parametrize("n", [360, 100, 7])
def test_collection_is_balanced(n):
    _, labels = make_scene_collection(n, seed=0)
    for f in FACTORS:
        counts = labels[f].value_counts()
        assert set(counts.index) <= set(VALUES[f])
        assert counts.max() - counts.min() <= 1
        if n >= len(VALUES[f]):
            assert set(counts.index) == set(VALUES[f])
    t = labels["template"].value_counts()
    assert t.max() - t.min() <= 1
    if n == 360:
        for f in FACTORS:
            assert (labels[f].value_counts() == 60).all()
        # the factors vary independently: every breed meets every place
        assert labels.groupby(["breed", "place"]).size().shape[0] == 36


def test_collection_varies_templates_and_matches_labels():
    texts, labels = make_scene_collection(360, seed=0)
    assert len(TEMPLATES) >= 6
    assert set(labels["template"]) == set(range(len(TEMPLATES)))
    assert len({t.split()[0] for t in texts}) >= 6  # not one fixed word order
    assert len(set(texts)) >= 0.95 * len(texts)
    for text, (_, row) in zip(texts, labels.iterrows()):
        low = text.lower()
        for f in FACTORS:
            assert any(form.lower() in low for form in VALUES[f][row[f]]), (f, row[f], text)
        # the breed position differs across templates: check the template is recognisable
        pattern = re.escape(TEMPLATES[row["template"]]).replace(r"\{", "{").replace(r"\}", "}")
        pattern = re.sub(r"\{\w+\}", ".+", pattern)
        assert re.fullmatch(pattern, text), (row["template"], text)


def test_collection_rejects_bad_n():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError):
            make_scene_collection(bad)


def test_anchor_sets():
    sets = scene_anchor_sets()
    assert set(sets) == set(ANCHOR_FACTORS) == {"breeds", "places", "clothing"}
    assert {ANCHOR_FACTORS[k] for k in sets} == set(FACTORS)
    for name, phrases in sets.items():
        assert len(phrases) == 6 and len(set(phrases)) == 6
    assert "a photo of a husky." in sets["breeds"]
    for design in ANCHOR_DESIGNS:
        d = scene_anchor_sets(design)
        assert all(len(v) % 6 == 0 and v for v in d.values())
    assert len(scene_anchor_sets("prompts3")["places"]) == 18
    with pytest.raises(ValueError, match="design"):
        scene_anchor_sets("nope")


def test_pick_queries_differ_on_every_factor():
    _, labels = make_scene_collection(120, seed=0)
    q = pick_queries(labels, 3, seed=0)
    assert len(set(q)) == 3
    for f in (*FACTORS, "template"):
        assert labels.loc[q, f].nunique() == 3
    assert pick_queries(labels, 3, seed=0) == q


@pytest.fixture(scope="module")
def minilm():
    from anchordiv.encoders import MissingDependencyError, load

    try:
        return load("minilm", device="cpu")
    except (MissingDependencyError, FileNotFoundError) as exc:
        pytest.skip(f"the minilm encoder is not available: {exc}")


class _Rows(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.sections, self.cards = [], 0, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "section":
            self.sections += 1
        if "row" in classes:
            self.rows.append(a.get("data-geometry"))
        if "nbr" in classes:
            self.cards += 1


def test_run_demo_end_to_end(minilm, tmp_path, capsys):
    out = tmp_path / "demo"

    res = run_demo(out, encoder=minilm, seed=0, n=96, k=5, n_queries=2, progress=False)

    printed = capsys.readouterr().out

    # files
    for name in ("index.html", "grid.png", "auprc.md", "auprc.csv"):
        assert (out / name).is_file(), name
    assert res.report_path == out / "index.html"
    assert str(res.report_path) in printed

    # the table: cosine, then iti / softmax / gaussian per anchor set
    table = res.auprc
    assert list(table.columns) == list(FACTORS)
    assert list(table.index) == ["cosine"] + [f"{m} · {s}" for s in ("breeds", "places", "clothing")
                                             for m in ("iti", "softmax", "gaussian")]
    assert np.isfinite(table.to_numpy()).all() and (table.to_numpy() <= 1).all()
    for set_name, factor in ANCHOR_FACTORS.items():
        own = table.loc[f"softmax · {set_name}", factor]
        assert own > table.loc["cosine", factor], (set_name, own, table.loc["cosine", factor])
        # the anchor set makes its own factor matter more than the others
        others = [table.loc[f"softmax · {set_name}", f] for f in FACTORS if f != factor]
        assert own > max(others)
    for line in ("cosine", "softmax · breeds", "gaussian · clothing"):
        assert line in printed

    with open(out / "auprc.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 10 and rows[0]["geometry"] == "cosine"
    assert float(rows[0]["breed"]) == pytest.approx(table.loc["cosine", "breed"], abs=1e-6)
    md = (out / "auprc.md").read_text(encoding="utf-8")
    assert "| softmax · breeds |" in md and "a photo of a husky." in md

    # the report: 2 queries × (cosine + softmax and gaussian per anchor set)
    p = _Rows()
    p.feed(res.report_path.read_text(encoding="utf-8"))
    assert p.sections == 2
    assert len(p.rows) == 2 * 7
    assert p.rows[:7] == ["cosine"] + [f"{m} · {s}" for s in ("breeds", "places", "clothing")
                                      for m in ("softmax", "gaussian")]
    assert p.cards == 2 * 7 * 5
    assert res.comparison.row("softmax · breeds").factor == "breed"
