"""Anchors written by hand on the command line (``--anchor TEXT``, ``--anchor-file FILE``).

Every command's neighbours under the written anchors are checked against ``model.search`` run
here on ``AnchorSet.from_texts(texts, encoder)`` with the same minilm encoder.
"""

import json
import re

import click
import numpy as np
import pytest
from test_cli import run

import anchordiv as ad
from anchordiv.encoders import LazyEncoder
from anchordiv.io import load_collection
from anchordiv.testing import assert_topk_up_to_rounding

ITEMS = ["a husky running on a snowy beach", "a beagle asleep on a sofa", "a husky pup playing in a park",
         "a beagle sniffing the grass in a park", "a poodle on a sandy beach", "a poodle with a red bow indoors",
         "a watercolor painting of a harbour", "a pencil sketch of a vintage car"]

#: --anchor texts, then the --anchor-file lines: one set, in this order.
TEXTS = ["a photo of a poodle", "a photo of a dog indoors"]
FILE = "# breeds, one per line\n\na photo of a husky\n   a photo of a beagle  \n  # a comment after spaces\n"
LINES = ["a photo of a husky", "a photo of a beagle"]
QUERIES = ["a dog on the beach", "a small dog in a park"]

STYLE = "style:\n  - a watercolor painting\n  - a pencil sketch\n"


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A collection of ITEMS embedded with minilm, an anchor file of LINES and an anchors file."""
    root = tmp_path_factory.mktemp("written")
    (root / "items.txt").write_text("\n".join(ITEMS) + "\n")
    run("embed", root / "items.txt", "--out", root / "coll", "--device", "cpu")
    (root / "breeds.txt").write_text(FILE, encoding="utf-8")
    (root / "style.yaml").write_text(STYLE)
    return {"root": root, "coll": root / "coll", "file": root / "breeds.txt", "style": root / "style.yaml"}


@pytest.fixture(scope="module")
def enc():
    return LazyEncoder("minilm", "cpu")


def truth(ws, enc, model, k, **params):
    """The fitted geometry, float32 queries and gallery, and ``model.search``'s rows, in Python."""
    anchors = ad.AnchorSet.from_texts(TEXTS + LINES, enc)
    geom = ad.make_model(model, tau=enc.tau, **params).fit(anchors)
    Q = np.asarray(enc.encode_text(QUERIES), dtype=np.float32)
    G = np.asarray(load_collection(ws["coll"]).embeddings, dtype=np.float32)
    _, rows = geom.search(Q, G, k=k)
    return geom, Q, G, np.asarray(rows)


def written_args(ws):
    return [a for t in TEXTS for a in ("--anchor", t)] + ["--anchor-file", ws["file"]]


def query_args():
    return [a for q in QUERIES for a in ("--query-text", q)]


def check_json(found, geom, Q, G, rows):
    """The rows of a JSON answer are ``rows``, its distances the float64 ones up to float32 rounding."""
    got = np.array([[h["row"] for h in q["results"]] for q in found["queries"]])
    dist = np.array([[h["distance"] for h in q["results"]] for q in found["queries"]])
    np.testing.assert_array_equal(got, rows)
    assert_topk_up_to_rounding(geom, Q, G, got, dist)


@pytest.mark.parametrize("model", ["softmax", "gaussian"])
def test_search_with_written_anchors_matches_model_search(ws, enc, model):
    found = json.loads(run("search", ws["coll"], *written_args(ws), "--model", model, *query_args(), "-k", 4,
                           "--device", "cpu", "--format", "json").stdout)
    assert found["anchors"] == "written (4 anchors)" and found["model"] == model
    check_json(found, *truth(ws, enc, model, 4))
    top = {a["anchor"] for q in found["queries"] for a in q["top_anchors"]}
    assert top <= set(TEXTS + LINES)
    one = run("search", ws["coll"], "--anchor", "a photo of a husky", "--query-row", 0, "-k", 2).stdout
    assert "anchors=written (1 anchor)," in one


def test_compare_adds_a_written_context(ws, enc, tmp_path):
    out = tmp_path / "report"
    run("compare", ws["coll"], "--anchors", f"{ws['style']}:style", *written_args(ws), "--model", "softmax,cosine",
        "--query-text", QUERIES[0], "-k", 3, "--no-png", "--out", out, "--device", "cpu")
    html = (out / "index.html").read_text()
    assert f"softmax · {ws['style']}:style (2 anchors)" in html and "cosine (no anchors)" in html
    row = html.split('data-geometry="softmax · written (4 anchors)"', 1)[1].split('class="row"', 1)[0]
    cards = re.findall(r'data-row="(\d+)" data-id="\d+" data-distance="([^"]+)"', row)
    geom, Q, G, rows = truth(ws, enc, "softmax", 3)
    got = np.array([[int(r) for r, _ in cards]])
    np.testing.assert_array_equal(got, rows[:1])
    assert_topk_up_to_rounding(geom, Q[:1], G, got)
    d64 = np.asarray(geom.pairwise(Q[:1].astype(np.float64), G.astype(np.float64)))[0, got[0]]
    np.testing.assert_allclose([float(d) for _, d in cards], d64, rtol=1e-5)  # shown to 6 digits


def test_index_build_records_written_anchors_and_searches_like_python(ws, enc, tmp_path):
    path = tmp_path / "written.index"
    run("index", "build", ws["coll"], *written_args(ws), "--model", "softmax", "--out", path, "--device", "cpu")
    meta = json.loads(path.with_name(path.name + ".anchordiv.json").read_text())
    assert meta["anchors"] == "written: " + " | ".join(TEXTS + LINES) and meta["anchor_texts"] == TEXTS + LINES
    expected = truth(ws, enc, "softmax", 3)
    for args in (["index", "search", path], ["search", ws["coll"], "--index", path]):
        found = json.loads(run(*args, *query_args(), "-k", 3, "--format", "json").stdout)
        assert found["anchors"] == meta["anchors"]
        check_json(found, *expected)


def test_serve_anchors_hold_a_written_set(ws, enc):
    from anchordiv.serve.cli import service_anchors
    from anchordiv.serve.service import Service

    alone = service_anchors(None, TEXTS, str(ws["file"]), enc)
    assert list(alone.sets) == ["written"] and alone.mix == {"written": 1.0} and alone.encoder == "minilm"
    assert alone.sets["written"].texts == TEXTS + LINES and alone.tau == enc.tau
    both = service_anchors(str(ws["style"]), TEXTS, str(ws["file"]), enc)
    assert list(both.sets) == ["style", "written"] and both.path == ws["style"]
    assert service_anchors(str(ws["style"]), (), None, enc).sets.keys() == {"style"}
    assert service_anchors(None, (), None, enc) is None
    geom, Q, G, rows = truth(ws, enc, "softmax", 3)
    for anchors, context in ((alone, None), (both, "softmax:written")):
        svc = Service(load_collection(ws["coll"]), anchors, enc, default_context="written")
        for qi, text in enumerate(QUERIES):
            hits = svc.search({"text": text, "context": context, "k": 3})["results"] if context else \
                svc.search({"text": text, "k": 3})["results"]
            got = np.array([[h["row"] for h in hits]])
            np.testing.assert_array_equal(got, rows[qi:qi + 1])
            assert_topk_up_to_rounding(geom, Q[qi:qi + 1], G, got, np.array([[h["distance"] for h in hits]]))


def test_serve_refuses_a_file_with_a_written_set_and_no_encoder(ws, enc, tmp_path):
    from anchordiv.serve.cli import service_anchors

    clash = tmp_path / "clash.yaml"
    clash.write_text("written:\n  - a photo of a cat\n")
    with pytest.raises(click.BadParameter, match="already has a set named 'written'"):
        service_anchors(str(clash), ["a photo of a dog"], None, enc)
    assert list(service_anchors(str(clash), (), None, enc).sets) == ["written"]  # nothing written: the file's set
    with pytest.raises(click.UsageError, match="--anchor needs an encoder: pass --encoder SPEC"):
        service_anchors(None, ["a photo of a dog"], None, None)


@pytest.mark.parametrize("args, code, message", [
    (["search", "{coll}", "--anchors", "{style}", "--anchor", "a dog", "--query-row", "0"], 2,
     "give the anchors one way: --anchors PATH[:SETS], or --anchor/--anchor-file, not both"),
    (["index", "build", "{coll}", "--anchors", "{style}", "--anchor-file", "{file}", "--out", "{root}/x.index"], 2,
     "give the anchors one way"),
    (["search", "{coll}", "--anchor-file", "{root}/empty.txt", "--query-row", "0"], 2,
     ("Invalid value for --anchor-file: '{root}/empty.txt' holds no anchors (only blank lines and # comments); "
      "write one anchor phrase per line")),
    (["search", "{coll}", "--anchor-file", "{root}/missing.txt", "--query-row", "0"], 2,
     "'{root}/missing.txt' does not exist; write the anchors one per line"),
    (["search", "{coll}", "--anchor-file", "{root}/latin1.txt", "--query-row", "0"], 2,
     "'{root}/latin1.txt' is not UTF-8 text"),
    (["search", "{coll}", "--anchor", "a dog", "--anchor", "a cat", "--anchor", "a dog", "--query-row", "0"], 2,
     "Invalid value for --anchor: --anchor #3 repeats --anchor #1 ('a dog'); give each anchor once"),
    (["compare", "{coll}", "--anchor", "a photo of a husky", "--anchor-file", "{file}", "--query-row", "0"], 2,
     "Invalid value for --anchor-file: line 3 of '{file}' repeats --anchor #1 ('a photo of a husky')"),
    (["search", "{coll}", "--anchor", "a dog", "--anchor", " ", "--query-row", "0"], 2,
     "--anchor #2 is ' '; every anchor must be a non-blank string"),
    (["search", "{root}/plain.npy", "--anchor", "a dog", "--query-row", "0"], 2,
     "--anchor needs an encoder: pass --encoder SPEC (the collection records none)"),
    (["index", "build", "{root}/plain.npy", "--anchor-file", "{file}", "--out", "{root}/x.index"], 2,
     "--anchor-file needs an encoder: pass --encoder SPEC"),
    (["search", "{coll}", "--index", "{root}/plain.npy", "--anchor", "a dog", "--query-row", "0"], 2,
     "--anchor cannot be combined with --index"),
    (["search", "{coll}", "--model", "gaussian", "--query-row", "0"], 2,
     "--model gaussian needs --anchors, --anchor or --anchor-file"),
    (["compare", "{coll}", "--model", "softmax", "--query-row", "0"], 2,
     "--model softmax needs --anchors, --anchor or --anchor-file"),
])
def test_bad_written_anchors_are_one_line_errors(ws, args, code, message):
    root = ws["root"]
    (root / "empty.txt").write_text("# nothing yet\n\n   \n")
    (root / "latin1.txt").write_bytes("un caf\xe9\n".encode("latin-1"))
    np.save(root / "plain.npy", np.eye(4, 384, dtype=np.float32))
    fill = {"coll": ws["coll"], "style": ws["style"], "file": ws["file"], "root": root}
    result = run(*[a.format(**fill) for a in args], ok=False)
    assert result.exit_code == code and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert message.format(**fill) in lines[0]


def test_every_help_shows_the_written_options():
    for command in (["search"], ["compare"], ["index", "build"], ["serve"]):
        out = run(*command, "--help").output
        assert "--anchor TEXT" in out and "--anchor-file FILE" in out
        assert re.search(r"--anchor(-file)? ", out.split("Example", 1)[1])


def test_eval_takes_written_anchors_like_the_python_protocol(ws, enc, tmp_path):
    """``eval budget --anchor ... --anchor-file ...`` scores the same AUPRC as ``budget`` in Python on
    ``AnchorSet.from_texts`` of the same phrases."""
    import pandas as pd

    from anchordiv.experiments import EvalData, budget

    coll = load_collection(ws["coll"])
    X = np.asarray(coll.embeddings, dtype=np.float32)
    breed = [next((b for b in ("husky", "beagle", "poodle") if b in t), "other") for t in ITEMS]
    path = tmp_path / "labelled.parquet"
    pd.DataFrame({"embedding": list(X), "breed": breed}).to_parquet(path)
    out = tmp_path / "eval"
    run("eval", "budget", path, *written_args(ws), "--factor", "breed", "--encoder", "minilm", "--tau", "0.05",
        "--budgets", "4", "--draws", "1", "--model", "softmax", "--n-boot", "20", "--out", out, "--no-progress")
    cli = pd.read_csv(out / "budget_summary.csv")
    data = EvalData.create(X, {"breed": np.array(breed)}, tau=0.05)
    py = budget(data, ad.AnchorSet.from_texts(TEXTS + LINES, enc), "breed", budgets=[4], n_draws=1,
                models=["softmax"], n_boot=20, progress=False).summary
    for model in ("softmax", "cosine"):
        got = cli.loc[cli["model"] == model, "auprc"].to_numpy()
        want = py.loc[py["model"] == model, "auprc"].to_numpy()
        assert got.size == want.size == 1 and got[0] == pytest.approx(want[0], abs=1e-6)
    bad = run("eval", "coordinate", path, "--anchor", "a dog", "--factor", "breed", "--factor", "breed",
              "--encoder", "minilm", "--out", out, ok=False)
    assert bad.exit_code == 2 and "coordinate takes exactly 2 --anchors, got 1" in bad.output
