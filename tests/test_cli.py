"""The ``anchordiv`` command line, on a tiny text collection embedded once with minilm."""

import csv
import io
import json
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
    assert "query (id): #1 a watercolor painting of a cat" in table
    assert "rank" in table and "distance" in table and "text" in table and "label" in table
    # under the style anchors, the other watercolour is the nearest neighbour
    lines = table.splitlines()
    assert lines[3].startswith("top anchors: a watercolor painting (")
    assert lines[6].split()[:2] == ["1", "4"]

    data = search_json(ws, "--anchors", f"{ws['anchors']}:object:0.7,style:0.3", "--query-text", "a kitten",
                       "--query-row", 0, "-k", 3)
    assert data["model"] == "softmax" and data["tau"] == pytest.approx(0.05)
    q_id, q_text = data["queries"]
    assert q_id["kind"] == "id" and q_id["row"] == 0
    assert 0 not in [h["id"] for h in q_id["results"]]  # the query row is left out
    assert q_text["kind"] == "text" and q_text["results"][0]["label"] == "cat"
    d = [h["distance"] for h in q_text["results"]]
    assert d == sorted(d) and len(d) == 3 and [h["rank"] for h in q_text["results"]] == [1, 2, 3]

    rows = list(csv.DictReader(io.StringIO(run(
        "search", ws["coll"], "--model", "cosine", "--query-row", 2, "--include-self", "-k", 2,
        "--format", "csv").stdout)))
    assert [r["rank"] for r in rows] == ["1", "2"] and rows[0]["id"] == "2"
    assert float(rows[0]["distance"]) == pytest.approx(0.0, abs=1e-5)
    assert set(rows[0]) >= {"query", "query_kind", "id", "distance", "text", "label", "style"}


@pytest.mark.parametrize("model, extra", [
    ("softmax", ["--tau", "0.1"]), ("gaussian", []), ("gmm", ["--components", "2", "--seed", "1"]),
    ("latent_gaussian", ["--rank", "3"]), ("latent_spherical", ["--rank", "0.9"]), ("cosine", []), ("iti", []),
])
def test_search_every_model(ws, model, extra):
    anchors = [] if model == "cosine" else ["--anchors", str(ws["anchors"])]
    data = search_json(ws, "--model", model, *anchors, *extra, "--query-text", "a dog", "-k", 4)
    hits = data["queries"][0]["results"]
    assert len(hits) == 4 and len({h["id"] for h in hits}) == 4
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
                assert [h["id"] for h in a["results"]] == [h["id"] for h in b["results"]]
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
    assert "anchorsfile.py" in "".join(traceback.format_exception(*debug.exc_info))


def test_installed_script(ws):
    """The console script in a real subprocess (started by the fixture): a search with cached anchors."""
    assert ws["proc"] is not None, f"{ws['script']} is missing; run `pip install -e .` to install the script"
    out, err = ws["proc"].communicate(timeout=300)
    assert ws["proc"].returncode == 0, err
    hits = json.loads(out)["queries"][0]["results"]
    assert len(hits) == 2 and hits[0]["id"] == 4  # the other watercolour


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
    assert by_id["queries"][0]["query"].startswith("#3 ")
    assert "no item has id '999'" in run("search", coll, "--model", "cosine", "--query-id", 999, ok=False).stderr
    # a collection without an id column: --query-id says to use --query-row
    bad = run("search", ws["coll"], "--model", "cosine", "--query-id", 1, ok=False)
    assert bad.exit_code == 2 and "--query-row 1" in bad.stderr
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
    assert [h["id"] for h in results[0]] == [h["id"] for h in results[1]] and len(results[0]) == 8
    (tmp_path / "ids.txt").write_text("1\n4\n6\n")
    for flt in ("1,4,6", f"@{tmp_path / 'ids.txt'}"):
        got = json.loads(run("index", "search", paths["dask"], "--query-text", "a red car", "-k", 3, "--filter", flt,
                             "--format", "json").stdout)["queries"][0]["results"]
        assert [h["id"] for h in got] == [h["id"] for h in results[0] if h["id"] in (1, 4, 6)]
    bad = run("index", "search", paths["one"], "--query-text", "a red car", "-k", 3, "--filter", "id > 3", ok=False)
    assert bad.exit_code == 2 and "not a list of ids" in bad.stderr and "milvus" in bad.stderr
    both = run("index", "build", ws["coll"], "--anchors", spec, "--workers", 2, "--scheduler", "tcp://127.0.0.1:1",
               "--out", tmp_path / "x.index", ok=False)
    assert both.exit_code == 2 and "either --workers" in both.stderr
