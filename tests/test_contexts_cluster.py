"""Contexts on a real Dask cluster: each worker maps and builds its parts, queries are merged exactly.

The cluster's answers are compared with one process's :class:`FeatureStore` over the same
memory-mapped shards (identical rows and distances) and with a float64 brute force; workers are
killed with SIGKILL during builds and searches, removed for good, and the scheduler is killed.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import anchordiv as ad
from anchordiv.contexts import ContextLost, FeatureStore, PartsMissing, context_store
from anchordiv.contexts.cluster import cluster_parts
from anchordiv.io import MappedRows
from anchordiv.testing import assert_topk_up_to_rounding

from conftest import unit_rows

distributed = pytest.importorskip("distributed")

SHARDS = (9000, 4321, 7000)
PART_ROWS = 4096


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Three float16 shard files, their rows, anchors and queries."""
    rng = np.random.default_rng(11)
    d = 32
    center = rng.normal(size=d)
    root = tmp_path_factory.mktemp("shards")
    files, parts = [], []
    for i, n in enumerate(SHARDS):
        x = unit_rows(rng, n, d, center).astype(np.float16)
        files.append(str(root / f"img_emb_{i}.npy"))
        np.save(files[-1], x)
        parts.append(x)
    G = np.concatenate(parts).astype(np.float64)
    return files, G, unit_rows(rng, 16, d, center), unit_rows(rng, 12, d, center).astype(np.float32)


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=50) as c, distributed.Client(c) as client:
        yield c, client


def _rows(files):
    return MappedRows.open(files)


def _same(a, b):
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("name, storage", [("softmax", "float32"), ("softmax", "float16"),
                                           ("latent_gaussian", "float32"), ("cosine", "float32")])
def test_a_cluster_context_equals_one_process(name, storage, data, cluster):
    files, G, anchors, Q = data
    model = ad.make_model(name, **({} if name == "cosine" else {"tau": 0.05}),
                          **({"rank": 4} if name == "latent_gaussian" else {})).fit(None if name == "cosine" else anchors)
    one = FeatureStore(model, _rows(files), storage=storage).build()
    seen = []
    on = FeatureStore(model, _rows(files), storage=storage, client=cluster[1], part_rows=PART_ROWS)
    on.build(progress=lambda done, n: seen.append((done, n)))
    assert len(on.cluster.parts) == 7 and on.ready and seen[-1] == (len(G), len(G))
    assert [p.offset for p in on.cluster.parts] == [0, 4096, 8192, 9000, 13096, 13321, 17417]
    _same(on.search(Q, k=10), one.search(Q, k=10))
    d, i = on.search(Q, k=10)
    assert_topk_up_to_rounding(model, Q, G, i, d)
    # restrictions: rows allowed (across part boundaries) and rows excluded per query
    allow = np.arange(3000, 15000)
    exclude = np.asarray(one.search(Q, k=3, allow=allow)[1])
    _same(on.search(Q, k=10, allow=allow, exclude=exclude), one.search(Q, k=10, allow=allow, exclude=exclude))
    d, i = on.search(Q, k=10, allow=allow, exclude=exclude)
    assert not any(np.isin(i[r], exclude[r]).any() for r in range(len(Q))) and ((i >= 3000) & (i < 15000)).all()


def test_parts_are_whole_build_blocks_of_each_shard(data):
    files, *_ = data
    parts = cluster_parts(_rows(files), block=1000, part_rows=4096)
    assert [(p.start, p.stop, p.offset) for p in parts[:4]] == [(0, 4000, 0), (4000, 8000, 4000), (8000, 9000, 8000),
                                                                (0, 4000, 9000)]
    assert sum(len(p) for p in parts) == sum(SHARDS)


def test_rows_in_memory_are_refused_with_the_fix(data, cluster):
    files, G, anchors, _ = data
    model = ad.Softmax(tau=0.05).fit(anchors)
    with pytest.raises(ValueError, match="shards on disk.*mmap=True"):
        FeatureStore(model, G.astype(np.float32), client=cluster[1])
    with pytest.raises(ValueError, match="shards on disk"):
        context_store(model, np.load(files[0]), client=cluster[1])
    for bad in (0, -1.0, float("nan"), float("inf"), "5"):
        with pytest.raises(ValueError, match="timeout must be a positive number"):
            FeatureStore(model, _rows(files), client=cluster[1], timeout=bad)
    with pytest.raises(ValueError, match="part_rows must be"):
        FeatureStore(model, _rows(files), client=cluster[1], part_rows=0)


def _worker_pids(client):
    return client.run(os.getpid)


def _wait_for_workers(client, n, timeout=60):
    end = time.monotonic() + timeout
    while len(client.scheduler_info()["workers"]) < n:
        assert time.monotonic() < end, "the nanny did not restart the worker"
        time.sleep(0.1)


def test_a_worker_killed_during_a_build_changes_nothing(data, cluster):
    files, G, anchors, Q = data
    client = cluster[1]
    model = ad.Softmax(tau=0.05).fit(anchors)
    one = FeatureStore(model, _rows(files)).build()
    victim = list(_worker_pids(client).values())[0]
    killed = []

    def progress(done, n):
        if not killed:
            os.kill(victim, signal.SIGKILL)
            killed.append(done)

    store = FeatureStore(model, _rows(files), client=client, part_rows=1024)
    store.build(progress=progress)
    assert killed and killed[0] < len(G) and store.ready
    _same(store.search(Q, k=10), one.search(Q, k=10))
    _wait_for_workers(client, 2)


def test_a_worker_killed_during_a_search_changes_nothing(data, cluster):
    files, G, anchors, _ = data
    client = cluster[1]
    _wait_for_workers(client, 2)
    model = ad.Softmax(tau=0.05).fit(anchors)
    rng = np.random.default_rng(3)
    Q = unit_rows(rng, 3000, G.shape[1], G.mean(0)).astype(np.float32)  # long enough to be hit mid-way
    one = FeatureStore(model, _rows(files)).build()
    truth = one.search(Q, k=10)
    store = FeatureStore(model, _rows(files), client=client, part_rows=2048).build()
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("out", store.search(Q, k=10)))
    victim = list(_worker_pids(client).values())[1]
    thread.start()
    time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    thread.join(120)
    _same(result["out"], truth)
    _wait_for_workers(client, 2)
    _same(store.search(Q, k=10), truth)  # the lost parts were rebuilt where the scheduler chose


def test_workers_gone_for_good_name_the_missing_parts(data):
    files, _, anchors, Q = data
    model = ad.Softmax(tau=0.05).fit(anchors)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None, silence_logs=50) as c, distributed.Client(c) as client:
        store = FeatureStore(model, _rows(files), client=client, part_rows=PART_ROWS, timeout=2.0).build()
        for nanny in c.workers.values():  # the nanny will not start another worker
            nanny.close_gracefully(reason="the test removes the worker for good")
        for pid in _worker_pids(client).values():
            os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(PartsMissing, match=r"7 of 7 parts .* have no worker.*rows 0:4096 \(.*img_emb_0.npy \[0:4096\]\)"
                                               r".*No partial answer"):
            store.search(Q, k=10)
        assert time.monotonic() - t0 < 30


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dask(*args):
    return subprocess.Popen([sys.executable, "-m", "distributed.cli." + args[0], *args[1:]],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_scheduler_that_restarts_is_reported(data):
    files, _, anchors, Q = data
    model = ad.Softmax(tau=0.05).fit(anchors)
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    procs = [_dask("dask_scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard")]
    try:
        procs.append(_dask("dask_worker", address, "--nthreads", "1", "--no-dashboard", "--no-nanny"))
        with distributed.Client(address, timeout=60) as client:
            _wait_for_workers(client, 1)
            store = FeatureStore(model, _rows(files), client=client, part_rows=PART_ROWS).build()
            d, i = store.search(Q, k=10)
            procs[0].kill()
            procs[0].wait()
            procs[0] = _dask("dask_scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard")
            with pytest.raises(ContextLost, match="restarted or was lost.*build the context again"):
                end = time.monotonic() + 60
                while time.monotonic() < end:  # until the client has noticed
                    assert np.array_equal(store.search(Q, k=10)[1], i)
                    time.sleep(0.2)
    finally:
        for p in procs:
            p.kill()
            p.wait()


# --------------------------------------------------------------------------- the CLI and the service
def test_search_on_workers_equals_search_in_one_process(tmp_path):
    from test_cli import run

    rng = np.random.default_rng(4)
    X = unit_rows(rng, 5000, 24, rng.normal(size=24)).astype(np.float32)
    np.save(tmp_path / "coll.npy", X)
    args = ["search", tmp_path / "coll.npy", "--model", "cosine", "--query-row", 7, "--query-row", 4000, "-k", 6,
            "--format", "json"]
    alone = json.loads(run(*args).stdout)
    on_workers = json.loads(run(*args, "--workers", 2).stdout)
    rows = [[[h["row"] for h in q["results"]] for q in out["queries"]] for out in (alone, on_workers)]
    cos = X[[7, 4000]].astype(np.float64) @ X.T.astype(np.float64)
    truth = np.argsort(-cos, axis=1)[:, 1:7]
    assert rows[0] == rows[1] == truth.tolist()
    # both answers are the float64 truth up to float32 rounding (the workers re-rank in float64)
    for out in (alone, on_workers):
        dist = np.array([[h["distance"] for h in q["results"]] for q in out["queries"]])
        assert_topk_up_to_rounding(ad.make_model("cosine").fit(None), X[[7, 4000]], X, truth, dist,
                                   exclude=np.array([[7], [4000]]))
    bad = run(*args, "--workers", 2, "--scheduler", "tcp://127.0.0.1:1", ok=False)
    assert bad.exit_code == 2 and "either --workers" in bad.output


def test_serve_on_workers(tmp_path):
    """``anchordiv serve --workers 2`` in a subprocess: the default context lives on the cluster, in parts."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from anchordiv.serve import free_port
    from test_serve_api import _wait_port

    rng = np.random.default_rng(6)
    X = unit_rows(rng, 3000, 16, rng.normal(size=16)).astype(np.float32)
    np.save(tmp_path / "coll.npy", X)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "anchordiv.cli", "serve", str(tmp_path / "coll.npy"), "--model",
                             "cosine", "--port", str(port), "--workers", "2", "--state", str(tmp_path / "state")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_port(port, proc, timeout=120)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as c:
            got = c.post("/api/search", json={"row": 5, "k": 5}).json()
            truth = np.argsort(-(X[5].astype(np.float64) @ X.T.astype(np.float64)))[1:6]
            assert [h["row"] for h in got["results"]] == truth.tolist()
            status = c.get("/api/contexts/cosine").json()
            assert status["status"] == "ready" and status["parts"] == 1 and status["rows"] == 3000
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """A collection of 36 short texts embedded with minilm (``embed``), and the encoder."""
    from test_cli import run
    from anchordiv.encoders import LazyEncoder

    root = tmp_path_factory.mktemp("texts")
    items = [f"a {c} {a} {p}" for c in ("red", "blue", "green") for a in ("dog", "cat", "car", "boat")
             for p in ("on a beach", "in a park", "at night")]
    (root / "items.txt").write_text("\n".join(items) + "\n")
    run("embed", root / "items.txt", "--out", root / "coll", "--device", "cpu")
    return root / "coll", LazyEncoder("minilm", "cpu")


WRITTEN = ["a photo of a dog", "a photo of a boat", "a photo at night"]


def test_a_typed_context_written_to_milvus_by_the_workers(texts, milvus_server, tmp_path):
    """``index build --anchor ... --backend milvus --workers 2``: the workers write the context's compact
    features into a Milvus server collection; its answers are ``model.search``'s."""
    from test_cli import run
    from anchordiv.io import load_collection

    coll, enc = texts
    name = f"typed_{os.getpid()}_{int(time.time())}"
    args = [a for t in WRITTEN for a in ("--anchor", t)]
    run("index", "build", coll, *args, "--model", "softmax", "--backend", "milvus", "--index-type", "FLAT",
        "--param", f"uri={milvus_server['uri']}", "--param", f"collection_name={name}", "--workers", 2,
        "--out", tmp_path / "typed.index")
    found = json.loads(run("index", "search", tmp_path / "typed.index", "--query-text", "a dog on the sand",
                           "-k", 6, "--format", "json").stdout)
    model = ad.Softmax(tau=enc.tau).fit(ad.AnchorSet.from_texts(WRITTEN, enc))
    Q = np.asarray(enc.encode_text(["a dog on the sand"]), dtype=np.float32)
    G = np.asarray(load_collection(coll).embeddings, dtype=np.float32)
    rows = np.array([[h["row"] for h in q["results"]] for q in found["queries"]])
    dist = np.array([[h["distance"] for h in q["results"]] for q in found["queries"]])
    assert rows.shape == (1, 6)
    assert_topk_up_to_rounding(model, Q, G, rows, dist)
    from pymilvus import MilvusClient

    fields = {f["name"]: f for f in MilvusClient(uri=milvus_server["uri"]).describe_collection(name)["fields"]}
    assert fields["vec"]["params"]["dim"] in (2 * len(WRITTEN) + 1, 2 * len(WRITTEN) + 2)  # compact (+ MIPS column)


def test_service_contexts_written_on_a_cluster_equal_one_process(cluster, texts, tmp_path):
    """POST /api/contexts with written anchors on a service whose contexts live on the cluster."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from anchordiv.serve import ServerThread, Service, create_app
    from anchordiv.serve.cli import open_collection

    coll, enc = texts
    body = {"anchors": WRITTEN, "model": "softmax"}
    answers = []
    for client in (None, cluster[1]):
        svc = Service(open_collection(str(coll)), None, enc, state=tmp_path / f"state{client is None}",
                      client=client)
        with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
            made = c.post("/api/contexts", json=body).json()
            end = time.monotonic() + 60
            while c.get(f"/api/contexts/{made['context']}").json()["status"] == "building":
                assert time.monotonic() < end
                time.sleep(0.05)
            got = c.post("/api/search", json={"text": "a dog on the sand", "context": made["context"], "k": 8}).json()
            answers.append([(h["row"], h["distance"]) for h in got["results"]])
            assert ("parts" in c.get(f"/api/contexts/{made['context']}").json()) == (client is not None)
    assert answers[0] == answers[1] and len(answers[0]) == 8


def test_the_service_rebuilds_a_context_its_scheduler_lost(texts, tmp_path):
    """The scheduler is killed and started again: the next search is a 503 saying so, and the one
    after it builds the context again on the new cluster and answers as before."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from anchordiv.serve import ServerThread, Service, create_app
    from anchordiv.serve.cli import open_collection

    coll, enc = texts
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = ["dask_scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]
    worker = ["dask_worker", address, "--nthreads", "1", "--no-dashboard", "--no-nanny"]
    procs = [_dask(*scheduler), _dask(*worker)]
    body = {"text": "a dog on the sand", "context": "cosine", "k": 5}
    try:
        with distributed.Client(address, timeout=60) as client:
            _wait_for_workers(client, 1)
            svc = Service(open_collection(str(coll)), None, enc, default_model="cosine", state=tmp_path / "s",
                          client=client, build_wait=60)
            with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url, timeout=120) as c:
                first = c.post("/api/search", json=body).json()
                for p in procs:
                    p.kill()
                    p.wait()
                procs = [_dask(*scheduler)]
                end, lost = time.monotonic() + 60, None
                while time.monotonic() < end:
                    resp = c.post("/api/search", json=body)
                    if resp.status_code == 503:
                        lost = resp.json()
                        break
                    time.sleep(0.2)
                assert lost is not None and lost["field"] == "context" and "built again" in lost["error"]
                assert "tcp://" not in lost["error"] and str(coll) not in lost["error"]  # addresses stay in the log
                procs.append(_dask(*worker))
                _wait_for_workers(client, 1)
                again = c.post("/api/search", json=body)
                assert again.status_code == 200, again.text
                assert [h["row"] for h in again.json()["results"]] == [h["row"] for h in first["results"]]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("library", ["torch", "numpy"])
def test_workers_take_the_clients_gemm_library(library, cluster, tmp_path, monkeypatch):
    """The client's GEMM library (timed per shape, :mod:`anchordiv._gemm`) is the workers' too, so the parts'
    features round as one process's: identical rows and distances whichever library the client chose."""
    import torch
    from anchordiv import _gemm

    rng = np.random.default_rng(8)
    d = 512
    X = unit_rows(rng, 12000, d, rng.normal(size=d)).astype(np.float16)
    np.save(tmp_path / "img_emb_0.npy", X)
    model = ad.Softmax(tau=0.05).fit(unit_rows(rng, 16, d, X.astype(np.float64).mean(0)))
    monkeypatch.setitem(_gemm._CHOICE, (d, 16, torch.float32, torch.get_num_threads()), library)
    rows = _rows([str(tmp_path / "img_emb_0.npy")])
    one = FeatureStore(model, rows).build()
    on = FeatureStore(model, rows, client=cluster[1], part_rows=4096).build()
    Q = X[:40].astype(np.float32)
    _same(on.search(Q, k=10), one.search(Q, k=10))
    from threadpoolctl import threadpool_info

    def blas_threads():
        return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

    before = blas_threads()
    with _gemm.using({"threads": 3, "libraries": {(d, 16, torch.float32): library}}):
        assert blas_threads() == ({3} if library == "numpy" and before else before)  # numpy: the given threads
    assert blas_threads() == before
