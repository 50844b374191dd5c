"""The ``anchordiv`` command line, on a tiny text collection embedded once with minilm."""

import csv
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from anchordiv.cli import cli

ITEMS = [
    ("a photo of a cat sleeping on a sofa", "cat", "photo"),
    ("a watercolor painting of a cat", "cat", "painting"),
    ("a pencil sketch of a dog", "dog", "sketch"),
    ("a photo of a dog running in a park", "dog", "photo"),
    ("a watercolor painting of a harbour with boats", "boat", "painting"),
    ("a photo of a red sports car", "car", "photo"),
    ("a pencil sketch of a vintage car", "car", "sketch"),
    ("a photo of a sailing boat at sea", "boat", "photo"),
]

ANCHORS = """\
object:
  names: [cat, dog, car, boat]
  template: ["a photo of a {}", "a drawing of a {}"]
style:
  phrases: [a watercolor painting, a pencil sketch, a photograph]
  weights: [1, 1, 2]
"""

COMMANDS = [[], ["embed"], ["anchors"], ["search"], ["compare"], ["index"], ["index", "build"],
            ["index", "search"], ["demo"]]


def run(*args, ok=True):
    result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    if ok:
        assert result.exit_code == 0, (result.output, result.exception,
                                       "".join(traceback.format_exception(*result.exc_info)))
    return result


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A collection of ITEMS (with label columns) and an anchors file, embedded once with minilm."""
    root = tmp_path_factory.mktemp("cli")
    table = root / "items.csv"
    with open(table, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label", "style"])
        w.writerows(ITEMS)
    anchors = root / "anchors.yaml"
    anchors.write_text(ANCHORS)
    coll = root / "coll"
    first = run("embed", table, "--column", "text", "--out", coll, "--shard-size", 5, "--device", "cpu")
    second = run("embed", table, "--column", "text", "--out", coll, "--shard-size", 5, "--device", "cpu")
    emb_anchors = run("anchors", anchors, "--model", "minilm", "--device", "cpu")
    # the installed script runs in the background while the in-process tests go on
    script = Path(sys.executable).with_name("anchordiv")
    proc = subprocess.Popen(
        [script, "search", coll, "--anchors", f"{anchors}:style", "--query-row", "1", "-k", "2", "--format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) if script.is_file() else None
    yield {"root": root, "table": table, "anchors": anchors, "coll": coll, "embed": [first, second],
           "anchors_out": emb_anchors, "script": script, "proc": proc}
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.communicate()


def search_json(ws, *args):
    out = run("search", ws["coll"], "--format", "json", *args).stdout
    return json.loads(out)


def test_model_names_match_the_registry():
    from anchordiv.cli import MODEL_NAMES
    from anchordiv.models import registry

    assert set(MODEL_NAMES) == set(registry())


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "anchordiv")
def test_every_help_has_an_example(command):
    result = run(*command, "--help")
    assert "Example" in result.output
    assert "anchordiv" in result.output.split("Example", 1)[1]


def test_embed_is_resumable_and_counts(ws):
    first, second = ws["embed"]
    assert "Embedded 8 of 8 texts with minilm" in first.stdout and "skipped 0" in first.stdout
    assert "2 shard(s) written" in first.stdout
    assert "Nothing to do" in second.stdout and "8 embedded texts" in second.stdout
    manifest = json.loads((ws["coll"] / "collection.json").read_text())
    assert manifest["encoder"] == "minilm" and manifest["complete"] and manifest["n_embedded"] == 8


def test_embed_text_file_and_image_folder(ws, tmp_path):
    txt = tmp_path / "lines.txt"
    txt.write_text("first line\n\nsecond line\n")
    out = run("embed", txt, "--out", tmp_path / "t", "--device", "cpu").stdout
    assert "Embedded 2 of 2 texts" in out
    # a text-only encoder cannot embed images: one clear error line
    from PIL import Image

    (tmp_path / "imgs" / "red").mkdir(parents=True)
    Image.new("RGB", (8, 8), "red").save(tmp_path / "imgs" / "red" / "a.png")
    bad = run("embed", tmp_path / "imgs", "--out", tmp_path / "i", "--device", "cpu", ok=False)
    assert bad.exit_code == 1
    assert bad.stderr.startswith("Error: ") and "text-only" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_anchors_command_prints_sets_and_reuses_cache(ws):
    out = ws["anchors_out"].stdout
    assert "2 set(s), 11 phrase(s); encoder minilm (tau 0.05), dim 384" in out
    assert "object  8" in out and "style   3" in out and "weighted" in out
    assert "(written)" in out and (ws["root"] / "anchors.yaml.anchors.minilm.npz").is_file()
    again = run("anchors", ws["anchors"], "--device", "cpu").stdout
    assert "(reused)" in again


def test_search_table_json_csv(ws):
    table = run("search", ws["coll"], "--anchors", f"{ws['anchors']}:style", "--query-row", 1, "-k", 3).stdout
    assert "query (item): row 1: a watercolor painting of a cat" in table
    assert "rank" in table and "distance" in table and "text" in table and "label" in table
    assert "row" in table and " id " not in table  # without an 'id' column the ids are the rows: one column
    # under the style anchors, the other watercolour is the nearest neighbour
    lines = table.splitlines()
    assert lines[3].startswith("top anchors: a watercolor painting (")
    assert lines[6].split()[:2] == ["1", "4"]

    data = search_json(ws, "--anchors", f"{ws['anchors']}:object:0.7,style:0.3", "--query-text", "a kitten",
                       "--query-row", 0, "-k", 3)
    assert data["model"] == "softmax" and data["tau"] == pytest.approx(0.05)
    q_id, q_text = data["queries"]
    assert q_id["kind"] == "item" and q_id["row"] == 0 == q_id["id"]
    assert 0 not in [h["row"] for h in q_id["results"]]  # the query row is left out
    assert all(h["id"] == h["row"] for h in q_id["results"])
    assert q_text["kind"] == "text" and q_text["results"][0]["label"] == "cat"
    d = [h["distance"] for h in q_text["results"]]
    assert d == sorted(d) and len(d) == 3 and [h["rank"] for h in q_text["results"]] == [1, 2, 3]

    rows = list(csv.DictReader(io.StringIO(run(
        "search", ws["coll"], "--model", "cosine", "--query-row", 2, "--include-self", "-k", 2,
        "--format", "csv").stdout)))
    assert [r["rank"] for r in rows] == ["1", "2"] and rows[0]["row"] == "2" == rows[0]["id"]
    assert float(rows[0]["distance"]) == pytest.approx(0.0, abs=1e-5)
    assert set(rows[0]) >= {"query", "query_kind", "query_id", "query_row", "id", "row", "distance", "text",
                            "label", "style"}


@pytest.mark.parametrize("model, extra", [
    ("softmax", ["--tau", "0.1"]), ("gaussian", ["--param", "summary=mode"]),
    ("gmm", ["--components", "2", "--seed", "1", "--param", "reg_covar=1e-4", "--param", "gmm.max_iter=50"]),
    ("latent_gaussian", ["--rank", "3"]), ("latent_spherical", ["--rank", "0.9"]), ("cosine", []), ("iti", []),
])
def test_search_every_model(ws, model, extra):
    anchors = [] if model == "cosine" else ["--anchors", str(ws["anchors"])]
    data = search_json(ws, "--model", model, *anchors, *extra, "--query-text", "a dog", "-k", 4)
    hits = data["queries"][0]["results"]
    assert len(hits) == 4 and len({h["row"] for h in hits}) == 4
    assert all(np.isfinite(h["distance"]) for h in hits)
    if "--tau" in extra:
        assert data["tau"] == 0.1


def test_index_build_and_search_match_exact_search(ws, tmp_path):
    spec = f"{ws['anchors']}:object:0.5,style:0.5"
    plain = search_json(ws, "--anchors", spec, "--query-text", "a boat on the water", "--query-row", 3, "-k", 3)
    for backend, extra in (("exact", []), ("faiss", ["--index-type", "hnsw", "--param", "ef_search=64"])):
        path = tmp_path / f"{backend}.index"
        out = run("index", "build", ws["coll"], "--anchors", spec, "--model", "softmax", "--backend", backend,
                  *extra, "--out", path).stdout
        assert "Indexed 8 vectors" in out and path.is_file() and Path(f"{path}.anchordiv.json").is_file()
        meta = json.loads(Path(f"{path}.anchordiv.json").read_text())
        if backend == "faiss":  # 8 sampled rows, all of them: ef_search=64 ≥ 8 keys is exhaustive
            assert "recall@10 against exact search on 8 sampled rows: 1.000" in out and meta["recall@10"] == 1.0
        else:
            assert "recall@10" not in out and meta["recall@10"] is None
        got = json.loads(run("index", "search", path, "--query-row", 3, "--query-text", "a boat on the water",
                             "-k", 3, "--format", "json").stdout)
        via_search = json.loads(run("search", ws["coll"], "--index", path, "--query-text", "a boat on the water",
                                    "--query-row", 3, "-k", 3, "--format", "json").stdout)
        for result in (got, via_search):
            assert result["backend"] == backend
            for a, b in zip(plain["queries"], result["queries"]):
                assert [h["row"] for h in a["results"]] == [h["row"] for h in b["results"]]
                np.testing.assert_allclose([h["distance"] for h in a["results"]],
                                           [h["distance"] for h in b["results"]], rtol=1e-4, atol=1e-5)
    bad = run("search", ws["coll"], "--index", tmp_path / "exact.index", "--anchors", spec, "--query-row", 0, ok=False)
    assert bad.exit_code == 2 and "cannot be combined with --index" in bad.stderr


def test_compare_writes_a_report(ws, tmp_path):
    out = tmp_path / "report"
    result = run("compare", ws["coll"], "--query-text", "a cat", "--query-row", 2,
                 "--anchors", f"{ws['anchors']}:object", "--anchors", f"{ws['anchors']}:style",
                 "--model", "softmax,gaussian", "--model", "cosine", "-k", 3, "--no-png", "--out", out)
    path = Path(result.stdout.strip())
    assert path == out / "index.html" and path.is_file() and not (out / "grid.png").exists()
    html = path.read_text()
    assert "softmax" in html and "gaussian" in html and "cosine" in html and "a pencil sketch" in html


def test_demo_prints_auprc_and_report(tmp_path):
    out = tmp_path / "demo"
    result = run("demo", "--n", 24, "-k", 2, "--queries", 1, "--seed", 1, "--out", out)
    assert "breed" in result.stdout and "softmax" in result.stdout and "cosine" in result.stdout
    assert f"report: {out / 'index.html'}" in result.stdout
    assert (out / "index.html").is_file() and (out / "grid.png").is_file()


@pytest.mark.parametrize("args, code, message", [
    (["search", "{coll}", "--anchors", "{anchors}:objects", "--query-row", "0"], 1,
     "Error: --anchors: unknown anchor set 'objects'"),
    (["search", "{coll}", "--anchors", "{anchors}:object:0.7,style:x", "--query-row", "0"], 1,
     "Error: --anchors: bad proportion 'x' for set 'style'"),
    (["search", "{coll}", "--anchors", "{root}/empty.txt", "--query-row", "0"], 1,
     "Error: --anchors: anchors file"),
    (["search", "{coll}", "--anchors", "{root}/missing.yaml", "--query-row", "0"], 1,
     "Error: --anchors: anchors file"),
    (["search", "{coll}", "--query-row", "0"], 2, "Error: --model softmax needs --anchors"),
    (["search", "{coll}", "--model", "cosine", "--query-row", "99"], 2, "row 99 is out of range"),
    (["search", "{coll}", "--model", "cosine", "--query-row", "0", "--rank", "3"], 2, "--rank applies only"),
    (["search", "{coll}", "--model", "gmm", "--query-row", "0", "--param", "rank=3"], 2,
     "no model given (gmm) takes 'rank'"),
    (["search", "{coll}", "--model", "gmm", "--query-row", "0", "--param", "tau=3"], 2, "is set with --tau"),
    (["search", "{coll}", "--model", "latent_gaussian", "--query-row", "0", "--rank", "1.5"], 2,
     "--rank must be an int k >= 1 or a variance fraction in (0, 1], got '1.5'"),
    (["index", "build", "{coll}", "--model", "gmm", "--model-param", "max_iter=0", "--out", "{root}/x.index"], 2,
     "--model-param max_iter must be an int in [1, inf), got '0'"),
    (["search", "{coll}", "--model", "cosine", "--query-row", "0", "-k", "9"], 2, "9 exceeds the 8 items"),
    (["compare", "{coll}", "--model", "softmax,bogus", "--query-row", "0"], 2, "unknown model 'bogus'"),
    (["--bogus"], 2, "No such option"),
    (["serch"], 2, "No such command 'serch'"),
])
def test_errors_are_one_line(ws, args, code, message):
    (ws["root"] / "empty.txt").write_text("# nothing here\n")
    args = [a.format(coll=ws["coll"], anchors=ws["anchors"], root=ws["root"]) for a in args]
    result = run(*args, ok=False)
    assert result.exit_code == code
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), lines
    assert message in lines[0] and "Traceback" not in result.output


def test_debug_shows_the_traceback(ws):
    args = ["search", ws["coll"], "--anchors", f"{ws['anchors']}:objects", "--query-row", 0]
    plain = run(*args, ok=False)
    assert isinstance(plain.exception, SystemExit) and "rerun with --debug" in plain.stderr
    debug = run("--debug", *args, ok=False)
    assert debug.exit_code == 1  # the exception propagates: Python prints its traceback
    assert isinstance(debug.exception, ValueError) and "unknown anchor set" in str(debug.exception)
    assert os.path.join("anchorsfile", "selection.py") in "".join(traceback.format_exception(*debug.exc_info))


def test_installed_script(ws):
    """The console script in a real subprocess (started by the fixture): a search with cached anchors."""
    assert ws["proc"] is not None, f"{ws['script']} is missing; run `pip install -e .` to install the script"
    out, err = ws["proc"].communicate(timeout=300)
    assert ws["proc"].returncode == 0, err
    hits = json.loads(out)["queries"][0]["results"]
    assert len(hits) == 2 and hits[0]["row"] == 4  # the other watercolour


def test_encoder_option_and_deprecated_model_alias(ws):
    assert "--model minilm names the encoder here, which is now --encoder" in ws["anchors_out"].stderr
    again = run("anchors", ws["anchors"], "--encoder", "minilm", "--device", "cpu")
    assert "(reused)" in again.stdout and "deprecated" not in again.stderr and "--encoder" not in again.stderr


def test_query_row_and_query_id_are_separate(ws, tmp_path):
    """--query-row is a row number; --query-id a value of the 'id' column; results name items by that id."""
    table = tmp_path / "ided.csv"
    ids = [42, 7, 3, 100, 5, 6, 1, 2]
    with open(table, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "id", "label"])
        w.writerows((t, i, lab) for (t, lab, _), i in zip(ITEMS, ids))
    coll = tmp_path / "ided"
    run("embed", table, "--column", "text", "--out", coll, "--device", "cpu")
    by_id = json.loads(run("search", coll, "--model", "cosine", "--query-id", 3, "-k", 3, "--format", "json").stdout)
    by_row = json.loads(run("search", coll, "--model", "cosine", "--query-row", 2, "-k", 3, "--format", "json").stdout)
    assert by_id["queries"][0]["row"] == 2 == by_row["queries"][0]["row"]  # id 3 is row 2
    assert by_id["queries"][0]["results"] == by_row["queries"][0]["results"]
    for hit in by_id["queries"][0]["results"]:
        assert hit["id"] == ids[hit["row"]] and hit["row"] != 2
    assert by_id["queries"][0]["query"].startswith("id 3 (row 2): ")
    assert "no item has id '999'" in run("search", coll, "--model", "cosine", "--query-id", 999, ok=False).stderr
    # a collection without an 'id' column: its ids are its row numbers
    plain = [json.loads(run("search", ws["coll"], "--model", "cosine", opt, 1, "-k", 3, "--format", "json").stdout)
             for opt in ("--query-id", "--query-row")]
    assert plain[0]["queries"] == plain[1]["queries"] and plain[0]["queries"][0]["id"] == 1
    bad = run("search", ws["coll"], "--model", "cosine", "--query-id", 8, ok=False)
    assert bad.exit_code == 2 and "no item has id '8'" in bad.stderr and "row numbers 0..7" in bad.stderr
    # the HTML report names the same neighbours by the same ids
    out = tmp_path / "rep"
    run("compare", coll, "--model", "cosine", "--query-id", 3, "-k", 3, "--no-png", "--out", out)
    import re

    shown = [int(v) for v in re.findall(r'data-id="([^"]+)"', (out / "index.html").read_text())]
    assert shown == [h["id"] for h in by_id["queries"][0]["results"]]


def test_index_build_warns_when_recall_is_low(ws, tmp_path):
    path = tmp_path / "low.index"
    out = run("index", "build", ws["coll"], "--anchors", f"{ws['anchors']}:style", "--model", "softmax",
              "--backend", "faiss", "--index-type", "ivf", "--param", "nlist=4", "--param", "nprobe=1",
              "--param", "shortlist=1", "--out", path)
    recall = json.loads(Path(f"{path}.anchordiv.json").read_text())["recall@10"]
    assert recall < 0.95 and f"{recall:.3f}" in out.stdout
    assert "Warning: recall@10 is" in out.stderr and "nprobe" in out.stderr


def test_index_build_on_dask_workers_and_filtered_search(ws, tmp_path):
    spec = f"{ws['anchors']}:object"
    paths = {}
    for name, extra in (("one", []), ("dask", ["--workers", 2])):
        paths[name] = tmp_path / f"{name}.index"
        run("index", "build", ws["coll"], "--anchors", spec, "--backend", "faiss", *extra, "--out", paths[name])
    results = [json.loads(run("index", "search", paths[name], "--query-text", "a red car", "-k", 8,
                              "--format", "json").stdout)["queries"][0]["results"] for name in ("one", "dask")]
    assert [h["row"] for h in results[0]] == [h["row"] for h in results[1]] and len(results[0]) == 8
    (tmp_path / "rows.txt").write_text("1\n4\n6\n")
    for flt in ("1,4,6", f"@{tmp_path / 'rows.txt'}"):
        got = json.loads(run("index", "search", paths["dask"], "--query-text", "a red car", "-k", 3, "--filter-rows",
                             flt, "--format", "json").stdout)["queries"][0]["results"]
        assert [h["row"] for h in got] == [h["row"] for h in results[0] if h["row"] in (1, 4, 6)]
    bad = run("index", "search", paths["one"], "--query-text", "a red car", "-k", 3, "--filter", "id > 3", ok=False)
    assert bad.exit_code == 2 and "not a list of ids" in bad.stderr and "milvus" in bad.stderr
    # this collection has no 'id' column: its ids are its rows
    by_ids = json.loads(run("index", "search", paths["one"], "--query-text", "a red car", "-k", 3, "--filter", "1,4,6",
                            "--format", "json").stdout)["queries"][0]["results"]
    assert [(h["id"], h["row"]) for h in by_ids] == [(h["row"], h["row"]) for h in got]
    both = run("index", "build", ws["coll"], "--anchors", spec, "--workers", 2, "--scheduler", "tcp://127.0.0.1:1",
               "--out", tmp_path / "x.index", ok=False)
    assert both.exit_code == 2 and "either --workers" in both.stderr


#: 30 string ids in no sorted order.
STRING_IDS = [f"item-{c}" for c in "qwertyuiopasdfghjklzxcvbnm1234"]


@pytest.fixture(scope="module")
def ided(ws, tmp_path_factory):
    """Collections of 30 texts whose 'id' column differs from the row: ids 1..30, and strings; an index of each."""
    root = tmp_path_factory.mktemp("ids")
    out = {}
    for name, ids in (("numeric", list(range(1, 31))), ("strings", STRING_IDS)):
        table = root / f"{name}.csv"
        with open(table, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["text", "id", "label"])
            for r, i in enumerate(ids):
                text, label, _ = ITEMS[r % len(ITEMS)]
                w.writerow([f"{text}, picture {r}", i, label])
        coll, index = root / name, root / f"{name}.index"
        run("embed", table, "--column", "text", "--out", coll, "--device", "cpu", "--no-progress")
        run("index", "build", coll, "--anchors", f"{ws['anchors']}:object", "--out", index)
        out[name] = {"coll": coll, "index": index, "ids": ids}
    return out


def _first_query(*args):
    return json.loads(run(*args, "--format", "json").stdout)["queries"][0]


@pytest.mark.parametrize("kind", ["numeric", "strings"])
def test_ids_and_rows_name_the_same_items(ws, ided, kind):
    """--query-id and --filter take ids, --query-row and --filter-rows rows; every result shows both."""
    coll, index, ids = ided[kind]["coll"], ided[kind]["index"], ided[kind]["ids"]
    q = 5
    by_id = _first_query("index", "search", index, "--query-id", ids[q], "-k", 29)
    by_row = _first_query("index", "search", index, "--query-row", q, "-k", 29)
    assert (by_id["id"], by_id["row"]) == (ids[q], q) == (by_row["id"], by_row["row"])
    assert by_id["results"] == by_row["results"] and len(by_id["results"]) == 29
    assert all(h["id"] == ids[h["row"]] for h in by_id["results"]) and q not in [h["row"] for h in by_id["results"]]
    plain = _first_query("search", coll, "--anchors", f"{ws['anchors']}:object", "--query-id", ids[q], "-k", 29)
    assert [(h["id"], h["row"]) for h in plain["results"]] == [(h["id"], h["row"]) for h in by_id["results"]]

    keep_rows = [1, 2, 17]
    keep = [ids[r] for r in keep_rows]
    expected = [h["id"] for h in by_id["results"] if h["row"] in keep_rows]
    id_file = coll.parent / f"{kind}-ids.txt"
    id_file.write_text("".join(f"{i}\n" for i in keep))
    for flt in (",".join(map(str, keep)), f"@{id_file}"):
        got = _first_query("index", "search", index, "--query-id", ids[q], "--filter", flt, "-k", 3)
        assert [h["id"] for h in got["results"]] == expected
    rows = _first_query("index", "search", index, "--query-row", q, "--filter-rows", ",".join(map(str, keep_rows)),
                        "-k", 3)
    assert [h["id"] for h in rows["results"]] == expected and [h["row"] for h in rows["results"]] == [
        ids.index(i) for i in expected]

    # the table prints both: id then row
    table = run("index", "search", index, "--query-id", ids[q], "-k", 4).stdout.splitlines()
    at = next(i for i, ln in enumerate(table) if ln.startswith("rank"))
    assert table[at].split()[:4] == ["rank", "id", "row", "distance"]
    assert table[at - 1].startswith(f"query (item): id {ids[q]} (row {q}): ")
    for line in table[at + 2:at + 6]:
        _, shown_id, shown_row = line.split()[:3]
        assert shown_id == str(ids[int(shown_row)])
    csv_rows = list(csv.DictReader(io.StringIO(run("index", "search", index, "--query-id", ids[q], "-k", 2,
                                                   "--format", "csv").stdout)))
    assert [(r["query_id"], r["query_row"]) for r in csv_rows] == [(str(ids[q]), str(q))] * 2
    assert all(r["id"] == str(ids[int(r["row"])]) for r in csv_rows)


@pytest.mark.parametrize("args, message", [
    (["--query-id", "999"], "no item has id '999' in the collection's 'id' column"),
    (["--query-row", "0", "--filter", "2,999"], "no item has id '999'"),
    (["--query-row", "0", "--filter", "2,999,998"], "no item has ids '999', '998'"),
    (["--query-row", "30"], "row 30 is out of range"),
    (["--query-row", "0", "--filter-rows", "1,30"], "row 30 is out of range"),
    (["--query-row", "0", "--filter-rows", "a,b"], "is not a list of row numbers"),
    (["--query-row", "0", "--filter", "1", "--filter-rows", "1"], "either --filter (ids) or --filter-rows"),
])
def test_an_unknown_id_or_row_is_an_error_naming_it(ided, args, message):
    res = run("index", "search", ided["numeric"]["index"], *args, ok=False)
    assert res.exit_code == 2 and res.stdout == ""
    line, = res.stderr.strip().splitlines()
    assert message in line, line
    option = next(a for a in args if a.startswith("--") and (a in line))
    assert option in line
    if "no item has" in message:  # the fix: rows go to the row option
        assert ("--query-row" if args[0] == "--query-id" else "--filter-rows") in line


def test_compare_report_names_items_by_id(ided, tmp_path):
    import re

    coll, ids = ided["strings"]["coll"], ided["strings"]["ids"]
    hits = _first_query("search", coll, "--model", "cosine", "--query-id", ids[7], "-k", 3)["results"]
    run("compare", coll, "--model", "cosine", "--query-id", ids[7], "-k", 3, "--no-png", "--out", tmp_path)
    html = (tmp_path / "index.html").read_text()
    assert re.findall(r'data-id="([^"]+)"', html) == [h["id"] for h in hits]
    assert f"id {ids[7]} (row 7)" in html


def test_embed_with_nothing_left_loads_no_model(ws, tmp_path):
    """A finished collection is recognised by its encoder's spec: a rerun succeeds when the
    model is gone, and loads nothing. --no-progress hides the "Loading weights" bar."""
    from anchordiv.encoders import minilm_path

    link = tmp_path / "model"
    link.symlink_to(minilm_path(), target_is_directory=True)
    txt = tmp_path / "lines.txt"
    txt.write_text("a cat on a mat\na dog in a park\na boat at sea\n")
    shown = run("embed", txt, "--out", tmp_path / "a", "--encoder", f"sentence-transformers:{link}", "--progress")
    assert "Loading weights" in shown.stderr  # what --no-progress hides
    spec = f"sentence-transformers:{link}/"  # another spec: loaded afresh in this process
    quiet = run("embed", txt, "--out", tmp_path / "b", "--encoder", spec, "--no-progress")
    assert "Embedded 3 of 3 texts" in quiet.stdout
    assert "Loading weights" not in quiet.stderr and "%|" not in quiet.stderr and "it/s" not in quiet.stderr
    link.unlink()  # the spec can no longer load
    script = Path(sys.executable).with_name("anchordiv")
    again = subprocess.run([script, "embed", txt, "--out", tmp_path / "b", "--encoder", spec],
                           capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300,
                           check=False)
    assert again.returncode == 0, again.stderr
    assert "Nothing to do: " in again.stdout and "3 embedded texts" in again.stdout
    assert "Loading weights" not in again.stderr


def test_eval_logs_a_line_per_step_when_not_on_a_terminal(ws, tmp_path):
    args = ["eval", "coordinate", ws["coll"], "--anchors", f"{ws['anchors']}:object", "--anchors",
            f"{ws['anchors']}:style", "--factor", "label", "--factor", "style", "--model", "softmax",
            "--proportions", "0,0.5,1", "--draws", 2, "--n-boot", 20]
    res = run(*args, "--out", tmp_path / "log")  # CliRunner's stderr is not a terminal
    total = 2 * 3 * 1 + 1  # draws × proportions × models, and the cosine baseline
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("coordinate: ")]
    assert lines[0] == f"coordinate: {total} steps" and lines[-1].startswith(f"coordinate: {total} steps in ")
    assert [ln.split(",")[0] for ln in lines[1:-1]] == [f"coordinate: step {i}/{total}" for i in range(1, total + 1)]
    assert "%|" not in res.stderr
    quiet = run(*args, "--no-progress", "--out", tmp_path / "quiet")
    assert "step" not in quiet.stderr and "%|" not in quiet.stderr and "it/s" not in quiet.stderr
    assert "coordinate:" in quiet.stdout  # the summary line
