"""Contexts written by hand over HTTP: create, poll, search, delete, restart, bounds and bad input.

A real uvicorn server on loopback serves the scene demo's collection (real MiniLM
embeddings); every neighbour list is compared with ``model.search`` on the same anchors,
embedded with the same encoder (``AnchorSet.from_texts``).
"""

import json
import os
import threading
import time

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

import anchordiv as ad  # noqa: E402
from anchordiv.serve import ServerThread, Service, create_app  # noqa: E402
from anchordiv.testing import assert_topk_up_to_rounding  # noqa: E402
from test_serve_api import demo  # noqa: E402,F401  (the scene demo's service, real MiniLM embeddings)

WRITTEN = ["a photo of a dog on a beach", "a photo of a dog in a park", "a photo of a dog in the snow"]
ROW = 7


def _service(demo, tmp_path, **kw):
    return Service(demo.collection, demo.anchors, demo.encoder, state=tmp_path / "state", **kw)


@pytest.fixture
def served(demo, tmp_path):
    svc = _service(demo, tmp_path)
    with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        yield svc, c


def _ready(c, name, timeout=60.0):
    """Poll GET /api/contexts/NAME until the build ends; the statuses seen."""
    seen, end = [], time.monotonic() + timeout
    while time.monotonic() < end:
        st = c.get(f"/api/contexts/{name}").json()
        seen.append(st["status"])
        if st["status"] != "building":
            return st, seen
        time.sleep(0.05)
    raise AssertionError(f"{name} still building after {timeout} s")


def _truth(demo, anchors, k=10, own=ROW, **model):
    G = np.asarray(demo.collection.embeddings, dtype=np.float64)
    geom = ad.Softmax(tau=demo.tau, **model).fit(anchors)
    return geom, G


def _neighbours(c, body):
    resp = c.post("/api/search", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    return data, [h["row"] for h in data["results"]], [h["distance"] for h in data["results"]]


def test_a_written_context_is_made_polled_and_searched(served, demo):
    svc, c = served
    resp = c.post("/api/contexts", json={"anchors": WRITTEN})
    assert resp.status_code in (200, 202), resp.text
    made = resp.json()
    name = made["context"]
    assert name.startswith("typed:") and made["status"] in ("building", "ready") and 0 <= made["progress"] <= 1
    status, seen = _ready(c, name)
    assert status["status"] == "ready" and status["progress"] == 1.0 and status["path"] == "scan"
    assert status["rows"] == 360 and status["features"] == 2 * len(WRITTEN) + 1
    data, rows, dist = _neighbours(c, {"row": ROW, "context": name, "k": 10})
    anchors = ad.AnchorSet.from_texts(WRITTEN, demo.encoder)
    geom, G = _truth(demo, anchors)
    assert_topk_up_to_rounding(geom, G[ROW][None], G, np.array([rows]), np.array([dist]),
                               exclude=np.array([[ROW]]))
    assert data["context"]["written"] == WRITTEN and data["context"]["n_anchors"] == 3
    assert data["why"] and data["why"][0]["anchor"] in WRITTEN and data["why"][0]["set"] == "typed"
    # the same anchors and parameters name the same context; every interface knows it
    again = c.post("/api/contexts", json={"anchors": list(WRITTEN)}).json()
    assert again["context"] == name and again["status"] == "ready"
    assert name in c.get("/indices-list").json()
    info = c.get("/api/contexts").json()
    assert name in info["names"] and info["written"][0]["context"] == name and info["written"][0]["anchors"] == WRITTEN
    knn = c.post("/knn-service", json={"text": "a dog", "indice_name": name, "num_images": 5}).json()
    text_rows = _neighbours(c, {"text": "a dog", "context": name, "k": 5})[1]
    assert [h["id"] for h in knn] == text_rows  # the demo's ids are rows


def test_a_mixture_with_the_file_and_weights(served, demo):
    svc, c = served
    body = {"anchors": WRITTEN, "sets": "typed:0.6,breeds:0.4", "weights": [3, 1, 1], "tau": 0.07}
    made = c.post("/api/contexts", json=body).json()
    _ready(c, made["context"])
    data, rows, dist = _neighbours(c, {"row": ROW, "context": made["context"], "k": 8})
    written = ad.AnchorSet.from_texts(WRITTEN, demo.encoder, weights=[3, 1, 1])
    mixed = ad.AnchorSet.mixture([written, demo.anchors.sets["breeds"]], [0.6, 0.4])
    G = np.asarray(demo.collection.embeddings, dtype=np.float64)
    geom = ad.Softmax(tau=0.07).fit(mixed)
    assert_topk_up_to_rounding(geom, G[ROW][None], G, np.array([rows]), np.array([dist]), exclude=np.array([[ROW]]))
    assert data["context"]["anchors"] == "typed:0.6,breeds:0.4" and data["context"]["tau"] == 0.07
    other = c.post("/api/contexts", json={"anchors": WRITTEN, "tau": 0.07}).json()["context"]
    assert other != made["context"]  # another mixture is another context


def test_a_written_context_of_another_geometry(served, demo):
    svc, c = served
    texts = [f"a photo of a {b}" for b in ("husky", "beagle", "poodle", "corgi", "pug", "boxer")]
    made = c.post("/api/contexts", json={"anchors": texts, "model": "latent_gaussian", "params": {"rank": 3}}).json()
    _ready(c, made["context"])
    _, rows, dist = _neighbours(c, {"row": ROW, "context": made["context"], "k": 6})
    G = np.asarray(demo.collection.embeddings, dtype=np.float64)
    geom = ad.LatentGaussian(tau=demo.tau, rank=3).fit(ad.AnchorSet.from_texts(texts, demo.encoder))
    assert_topk_up_to_rounding(geom, G[ROW][None], G, np.array([rows]), np.array([dist]), exclude=np.array([[ROW]]))


def test_delete_and_restart(demo, tmp_path):
    svc = _service(demo, tmp_path)
    with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        keep = c.post("/api/contexts", json={"anchors": WRITTEN}).json()["context"]
        drop = c.post("/api/contexts", json={"anchors": WRITTEN[:2]}).json()["context"]
        _ready(c, keep)
        _ready(c, drop)
        before = _neighbours(c, {"row": ROW, "context": keep, "k": 10})[1]
        gone = c.delete(f"/api/contexts/{drop}")
        assert gone.status_code == 200 and gone.json()["status"] == "deleted"
        assert c.get(f"/api/contexts/{drop}").status_code == 404
        resp = c.post("/api/search", json={"row": ROW, "context": drop})
        assert resp.status_code == 404 and resp.json()["field"] == "name"
        assert c.delete("/api/contexts/softmax:breeds").status_code == 422
    state = json.loads((tmp_path / "state" / "contexts.json").read_text())
    assert [e["name"] for e in state["contexts"]] == [keep] and state["contexts"][0]["anchors"] == WRITTEN
    restarted = _service(demo, tmp_path)  # a new process would read the same file
    assert keep in restarted.indices_list() and drop not in restarted.indices_list()
    with ServerThread(create_app(restarted)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        assert c.get(f"/api/contexts/{keep}").json()["status"] == "stored"  # not built until used
        assert _neighbours(c, {"row": ROW, "context": keep, "k": 10})[1] == before
        assert c.get(f"/api/contexts/{keep}").json()["status"] == "ready"


def test_a_building_context_says_how_far_it_is(demo, tmp_path):
    svc = _service(demo, tmp_path, build_wait=0.0)
    release = threading.Event()

    def blocker():  # holds the one builder thread
        release.wait(30)
        return ad.Cosine(), True

    svc.contexts.start("blocker", blocker)
    with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        resp = c.post("/api/contexts", json={"anchors": WRITTEN})
        assert resp.status_code == 202 and resp.json()["status"] == "building" and resp.json()["progress"] == 0.0
        name = resp.json()["context"]
        busy = c.post("/api/search", json={"row": ROW, "context": name})
        body = busy.json()
        assert busy.status_code == 503 and body["field"] == "context" and "still building (0%" in body["error"]
        assert body["status"] == "building" and body["progress"] == 0.0
        release.set()
        assert _ready(c, name)[0]["status"] == "ready"
        assert c.post("/api/search", json={"row": ROW, "context": name}).status_code == 200


@pytest.mark.parametrize("body,status,field", [
    ({"anchors": []}, 422, "anchors"),
    ({"anchors": "a dog"}, 422, "anchors"),
    ({"anchors": ["a dog"] + [f"anchor {i}" for i in range(256)]}, 422, "anchors"),
    ({"anchors": ["a dog", "x" * 301]}, 422, "anchors[1]"),
    ({"anchors": ["a dog", "  "]}, 422, "anchors[1]"),
    ({"anchors": ["a dog", "a dog "]}, 422, "anchors[1]"),
    ({"anchors": ["a dog", 3]}, 422, "anchors[1]"),
    ({"anchors": ["a dog", "a cat"], "weights": [1]}, 422, "weights"),
    ({"anchors": ["a dog", "a cat"], "weights": [0, 0]}, 422, "weights"),
    ({"anchors": ["a dog"], "model": "cosine"}, 422, "model"),
    ({"anchors": ["a dog"], "model": "nope"}, 422, "model"),
    ({"anchors": ["a dog"], "tau": 0}, 422, "tau"),
    ({"anchors": ["a dog"], "sets": "breeds"}, 422, "sets"),
    ({"anchors": ["a dog"], "sets": "typed:0.5,nope:0.5"}, 422, "sets"),
    ({"anchors": ["a dog"], "params": {"rank": 3}}, 422, "params.rank"),
    ({"anchors": ["a dog"], "colour": "red"}, 422, "colour"),
])
def test_bad_context_requests_name_the_field(served, body, status, field):
    _, c = served
    resp = c.post("/api/contexts", json=body)
    assert resp.status_code == status, resp.text
    assert resp.json()["field"] == field and resp.json()["error"].startswith(f"{field}: ")


def test_the_number_of_written_contexts_is_bounded(demo, tmp_path):
    svc = _service(demo, tmp_path, max_contexts=2)
    with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        for i in range(2):
            assert c.post("/api/contexts", json={"anchors": [f"a photo number {i}"]}).status_code in (200, 202)
        full = c.post("/api/contexts", json={"anchors": ["one too many"]})
        assert full.status_code == 507 and full.json()["field"] == "anchors" and "at most 2" in full.json()["error"]
    no_encoder = Service(demo.collection, demo.anchors, None)
    with ServerThread(create_app(no_encoder)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        resp = c.post("/api/contexts", json={"anchors": ["a dog"]})
        assert resp.status_code == 422 and "no encoder" in resp.json()["error"]


def test_a_damaged_state_file_is_named_and_ignored(demo, tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "contexts.json").write_text('{"format": "anchordiv.contexts", "version": 1, "encoder": '
                                                      '"minilm", "contexts": [{"name": "typed:0", "anchors": ["x"], '
                                                      '"model": "softmax", "tau": 0.05}]}')
    with pytest.warns(UserWarning, match="cannot restore the written contexts"):
        svc = _service(demo, tmp_path)
    assert not [n for n in svc.indices_list() if n.startswith("typed:")]


def test_a_geometry_without_temperature_and_a_failed_fit(served, demo):
    svc, c = served
    made = c.post("/api/contexts", json={"anchors": WRITTEN, "model": "iti"}).json()
    _ready(c, made["context"])
    _, rows, dist = _neighbours(c, {"row": ROW, "context": made["context"], "k": 5})
    G = np.asarray(demo.collection.embeddings, dtype=np.float64)
    geom = ad.ImageTextInversion().fit(ad.AnchorSet.from_texts(WRITTEN, demo.encoder))
    assert_topk_up_to_rounding(geom, G[ROW][None], G, np.array([rows]), np.array([dist]), exclude=np.array([[ROW]]))
    assert c.post("/api/contexts", json={"anchors": WRITTEN, "model": "iti", "tau": 0.05}).json()["field"] == "tau"
    bad = c.post("/api/contexts", json={"anchors": WRITTEN[:1], "model": "gaussian"})  # one anchor: no covariance
    assert bad.status_code == 422 and bad.json()["field"] == "model" and "cannot fit" in bad.json()["error"]
    names = c.get("/indices-list").json()
    assert made["context"] in names and len([n for n in names if n.startswith("typed:")]) == 1


def test_serve_maps_a_sharded_float16_collection(demo, tmp_path, monkeypatch):
    """``anchordiv serve``'s collection is memory-mapped as stored; written contexts over it are exact."""
    from anchordiv.io import MappedRows
    from anchordiv.serve.cli import open_collection, state_folder

    X = np.asarray(demo.collection.embeddings, dtype=np.float16)
    folder = tmp_path / "coll" / "text_emb"
    folder.mkdir(parents=True)
    for i, (a, b) in enumerate([(0, 100), (100, 250), (250, 360)]):
        np.save(folder / f"text_emb_{i}.npy", X[a:b])
    coll = open_collection(str(tmp_path / "coll"))
    assert isinstance(coll.embeddings, MappedRows) and coll.embeddings.dtype == np.float16
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    state = state_folder(str(tmp_path / "coll"), coll)
    assert state.parent == tmp_path / "cache" / "anchordiv" / "serve"
    assert state == state_folder(str(tmp_path / "coll"), open_collection(str(tmp_path / "coll")))
    svc = Service(coll, None, demo.encoder, tau=demo.tau, state=state)
    with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        name = c.post("/api/contexts", json={"anchors": WRITTEN}).json()["context"]
        _ready(c, name)
        _, rows, dist = _neighbours(c, {"row": ROW, "context": name, "k": 10})
    G = X.astype(np.float64)
    geom = ad.Softmax(tau=demo.tau).fit(ad.AnchorSet.from_texts(WRITTEN, demo.encoder))
    assert_topk_up_to_rounding(geom, G[ROW][None], G, np.array([rows]), np.array([dist]), exclude=np.array([[ROW]]))
    assert (state / "contexts.json").is_file()
