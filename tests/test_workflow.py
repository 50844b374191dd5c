"""The research workflow through the CLI on a generated multi-label collection, checked
against a direct float64 computation: embed, anchors (with --diagnose), eval table
--multilabel with a τ list, compare, search."""

import csv
import json
import traceback

import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.metrics import average_precision_score

import anchordiv as ad
from anchordiv.anchorsfile import embed_anchors
from anchordiv.cli import cli

FINDINGS = {
    "Pleural Effusion": ["small left pleural effusion", "fluid layering in the pleural space"],
    "Cardiomegaly": ["the heart is enlarged", "cardiac silhouette is increased in size"],
    "Pneumothorax": ["a right apical pneumothorax", "air in the pleural space with lung collapse"],
}
FILLER = ["the bones are intact", "lines and tubes are unchanged", "no acute osseous abnormality",
          "trachea is midline"]

# set names: spaces (quoted in YAML), underscores, a name that matches no label (mapped by FILE:SET=LABEL)
ANCHORS = """\
"pleural effusion": [pleural effusion, fluid in the pleural space, blunted costophrenic angle]
pneumo_thorax: [pneumothorax, collapsed lung, air in the pleural space]
big heart: [cardiomegaly, enlarged heart, increased cardiac silhouette]
"""
TAUS = (0.02, 0.05)


def run(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    assert result.exit_code == 0, (result.output, "".join(traceback.format_exception(*result.exc_info)))
    return result.output


def _reports(n=36, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        labels = [f for f in FINDINGS if rng.random() < 0.4]
        parts = [FINDINGS[f][rng.integers(2)] for f in labels] + list(rng.choice(FILLER, 2, replace=False))
        rng.shuffle(parts)
        rows.append((f"r{i:03d}", ". ".join(parts).capitalize() + ".", "|".join(labels)))
    return rows


def _softmax_dsym(X, A, tau):
    """½ (η_q − η_g)ᵀ(∇κ_q − ∇κ_g), η = λ/τ, ∇κ = Σ_i P(i|λ) γ_i (uniform weights), float64."""
    L = X @ A.T / tau
    P = np.exp(L - L.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    eta, grad = X / tau, P @ A
    return 0.5 * ((eta[:, None, :] - eta[None, :, :]) * (grad[:, None, :] - grad[None, :, :])).sum(-1), P


def _per_label_auprc(D, has):
    """Mean AP over the items carrying the label; relevant = the other items carrying it (sklearn)."""
    aps = []
    for q in np.flatnonzero(has):
        keep = np.arange(len(has)) != q
        if has[keep].any():
            aps.append(average_precision_score(has[keep], -D[q, keep]))
    return float(np.mean(aps))


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("workflow")
    rows = _reports()
    table = root / "reports.csv"
    with open(table, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "report", "findings"])
        w.writerows(rows)
    anchors = root / "findings.yaml"
    anchors.write_text(ANCHORS)
    coll = root / "coll"
    run("embed", table, "--column", "report", "--out", coll, "--device", "cpu", "--no-progress")
    collection = ad.io.load_collection(coll)
    emb = embed_anchors(anchors, "minilm")
    labels = {f: np.array([f in r[2].split("|") for r in rows]) for f in FINDINGS}
    return {"root": root, "rows": rows, "anchors": anchors, "coll": coll, "X": collection.embeddings.astype(np.float64),
            "tau": collection.tau, "sets": {n: s.embeddings.numpy().astype(np.float64) for n, s in emb.sets.items()},
            "set_objs": emb.sets, "labels": labels}


def test_embed_keeps_the_column_name(ws):
    c = ad.io.load_collection(ws["coll"])
    assert c.columns == ["report", "id", "findings"] and c.item_column == "report"
    assert c.metadata["report"].tolist() == [r[1] for r in ws["rows"]]
    # rerunning the same command resumes (nothing to do) with the same column
    assert "Nothing to do" in run("embed", ws["root"] / "reports.csv", "--column", "report", "--out", ws["coll"],
                                  "--device", "cpu", "--no-progress")


def test_eval_table_multilabel_tau_sweep_matches_direct_computation(ws):
    out = ws["root"] / "table"
    text = run("eval", "table", ws["coll"], "--factor", "findings", "--multilabel",
               "--anchors", f"{ws['anchors']}:pleural effusion,pneumo_thorax",
               "--anchors", f"{ws['anchors']}:big heart=Cardiomegaly",
               "--tau", ",".join(map(str, TAUS)), "--model", "softmax", "--baseline", "cosine",
               "--n-boot", "50", "--out", out, "--no-progress")
    assert "setting: per-label on multi-label findings: queries = the items carrying the label" in text
    match = {"pleural effusion": "Pleural Effusion", "pneumo_thorax": "Pneumothorax", "big heart": "Cardiomegaly"}
    with open(out / "table_summary.csv", newline="") as fh:
        summary = list(csv.DictReader(fh))
    assert {(float(r["tau"]), r["label"], r["model"]) for r in summary} == {
        (t, s, m) for t in TAUS for s in match for m in ("softmax", "cosine")}
    X = ws["X"]
    cos = 1 - X @ X.T
    for r in summary:
        has = ws["labels"][match[r["label"]]]
        D = _softmax_dsym(X, ws["sets"][r["label"]], float(r["tau"]))[0] if r["model"] == "softmax" else cos
        assert float(r["auprc"]) == pytest.approx(_per_label_auprc(D, has), abs=2e-6), r
        assert int(r["n_queries"]) == int(has.sum())
    # table.csv agrees with table_summary.csv (one anchor draw: the same means)
    with open(out / "table.csv", newline="") as fh:
        rows = {(r["tau"], r["label"], r["model"]): float(r["auprc"]) for r in csv.DictReader(fh)}
    for r in summary:
        assert rows[(r["tau"], r["label"], r["model"])] == pytest.approx(float(r["auprc"]), abs=1e-6)
    md = (out / "table.md").read_text()
    assert "| τ | label | value | n queries | softmax − cosine | AUPRC softmax | AUPRC cosine |" in md
    # another metric in the same protocol: recall@5 of the per-label setting
    text = run("eval", "table", ws["coll"], "--factor", "findings", "--multilabel", "--anchors", ws["anchors"],
        "--no-progress", "--model", "softmax", "--baseline", "cosine",
        "--tau", "0.05", "--metric", "recall@5", "--n-boot", "20", "--out", ws["root"] / "recall")
    with open(ws["root"] / "recall" / "table_summary.csv", newline="") as fh:
        got = {(r["label"], r["model"]): float(r["recall@5"]) for r in csv.DictReader(fh)}
    # bare FILE: every set, matched to the labels by name (big heart matches none: it is skipped, and said)
    assert "matching no label of findings" in text and "big heart" in text
    assert "labels without an anchor set (not in the table): Cardiomegaly" in text
    assert set(got) == {(s, m) for s in ("pleural effusion", "pneumo_thorax") for m in ("softmax", "cosine")}
    D = _softmax_dsym(X, ws["sets"]["pleural effusion"], 0.05)[0]
    has = ws["labels"]["Pleural Effusion"]
    recalls = []
    for q in np.flatnonzero(has):
        d = D[q].copy()
        d[q] = np.inf
        rel = has.copy()
        rel[q] = False
        if rel.any():
            recalls.append(rel[np.argsort(d, kind="stable")[:5]].sum() / rel.sum())
    assert got[("pleural effusion", "softmax")] == pytest.approx(np.mean(recalls), abs=2e-6)


def test_unmatched_set_is_a_clear_error(ws):
    result = CliRunner().invoke(cli, ["eval", "table", str(ws["coll"]), "--factor", "findings", "--multilabel",
                                      "--anchors", f"{ws['anchors']}:big heart", "--tau", "0.05",
                                      "--out", str(ws["root"] / "x")])
    assert result.exit_code == 1
    assert "no label of 'findings' matches 'big heart'" in result.output and "FILE:SET=LABEL" in result.output


def test_search_diagnose_and_compare(ws):
    X, A, tau = ws["X"], ws["sets"]["pleural effusion"], ws["tau"]
    D, P = _softmax_dsym(X, A, tau)
    res = json.loads(run("search", ws["coll"], "--anchors", f"{ws['anchors']}:pleural effusion", "--query-row", 0,
                         "-k", 4, "--format", "json"))
    q = res["queries"][0]
    D0 = D[0].copy()
    D0[0] = np.inf
    assert [h["row"] for h in q["results"]] == np.argsort(D0, kind="stable")[:4].tolist()
    np.testing.assert_allclose([h["distance"] for h in q["results"]], np.sort(D0)[:4], rtol=1e-4, atol=1e-5)
    assert q["results"][0]["id"] == ws["rows"][q["results"][0]["row"]][0]
    assert q["results"][0]["report"] == ws["rows"][q["results"][0]["row"]][1] and "caption" not in q["results"][0]
    texts = ws["set_objs"]["pleural effusion"].texts
    order = np.argsort(-P[0])[:3]
    assert [a["anchor"] for a in q["top_anchors"]] == [texts[i] for i in order]
    np.testing.assert_allclose([a["probability"] for a in q["top_anchors"]], P[0, order], rtol=1e-5)
    H = -(P[0] * np.log(P[0])).sum()
    assert q["effective_anchors"] == pytest.approx(np.exp(H), rel=1e-5)

    text = run("anchors", ws["anchors"], "--encoder", "minilm", "--diagnose", ws["coll"], "--top", 1)
    line = text.split("coverage of")[1].splitlines()
    cells = next(ln for ln in line if ln.startswith("pleural effusion")).split("  ")
    cells = [c.strip() for c in cells if c.strip()]
    assert cells[2] == f"{int((P.max(1) >= 0.5).sum())}/{len(X)}"
    assert cells[3] == f"{np.median(np.exp(-(P * np.log(P)).sum(1))):.3g}"
    assert cells[4] == str(int((np.bincount(P.argmax(1), minlength=len(A)) == 0).sum()))

    out = ws["root"] / "report"
    run("compare", ws["coll"], "--anchors", f"{ws['anchors']}:pleural effusion", "--model", "softmax,cosine",
        "--query-row", 0, "-k", 3, "--label", "findings", "--out", out, "--no-png")
    html = (out / "index.html").read_text()
    assert ws["rows"][0][0] in html  # the query's id
    # --label gives each row its primary factor: the legend's green border marks the neighbours sharing it
    assert 'class="rowlabel primary"' in html and 'data-factor="findings"' in html
    shares = [ws["rows"][int(r)][2] == ws["rows"][0][2] for r in np.argsort(D0, kind="stable")[:3]]
    assert html.count('class="card nbr hit"') >= sum(shares)
    # the softmax row names the query's top anchors
    assert f"top anchors: {texts[order[0]]} {P[0, order[0]]:.2f}" in html


def test_readme_walkthrough_runs(ws, monkeypatch):
    """The Python block of the README's "Your own data" section, on this collection."""
    from pathlib import Path

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Your own data")[1]
    code = section.split("The same in Python:")[1].split("```python")[1].split("```")[0]
    monkeypatch.chdir(ws["root"])
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    res, why = scope["res"], scope["why"]
    assert set(res.summary["tau"]) == {0.02, 0.05} and set(res.summary["label"]) == {"pleural effusion", "big heart"}
    assert why.entropy.shape == (len(ws["rows"]),)


def test_several_anchor_files_for_one_label(ws):
    """Two anchor files with a set for the same finding: one row each, named SET · FILE."""
    other = ws["root"] / "terse.yaml"
    other.write_text('"pleural effusion": [effusion]\n')
    out = ws["root"] / "two"
    text = run("eval", "table", ws["coll"], "--factor", "findings", "--multilabel",
               "--anchors", f"{ws['anchors']}:pleural effusion", "--anchors", other, "--model", "softmax",
               "--baseline", "cosine", "--tau", "0.05", "--n-boot", "20", "--out", out, "--no-progress")
    assert "setting: per-label" in text
    with open(out / "table_summary.csv", newline="") as fh:
        summary = [r for r in csv.DictReader(fh) if r["model"] == "softmax"]
    assert sorted(r["label"] for r in summary) == ["pleural effusion · findings", "pleural effusion · terse"]
    X, has = ws["X"], ws["labels"]["Pleural Effusion"]
    emb = embed_anchors(other, "minilm").sets["pleural effusion"].embeddings.numpy().astype(np.float64)
    got = next(float(r["auprc"]) for r in summary if r["label"].endswith("terse"))
    assert got == pytest.approx(_per_label_auprc(_softmax_dsym(X, emb, 0.05)[0], has), abs=2e-6)
