"""``anchordiv serve``: the JSON API and clip-retrieval's endpoints, against a real uvicorn server.

The demo collection (360 scene descriptions, minilm) is served on a free loopback port;
every neighbour list is checked against ``model.search`` on the same context, fitted
independently here. A small image collection with a stub encoder covers thumbnails and
image uploads; collections whose ids differ from their rows (ids 1..30, string ids) show
that ``id`` means the ``id`` column everywhere and ``row`` the position.
"""

import base64
import hashlib
import importlib.util
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import anchordiv as ad  # noqa: E402
from anchordiv.anchorsfile import EmbeddedAnchors  # noqa: E402
from anchordiv.io import Collection  # noqa: E402
from anchordiv.serve import ServerThread, Service, create_app  # noqa: E402

QUERY_ROW = 7


@pytest.fixture(scope="module")
def demo():
    from anchordiv.apps.serve_demo import demo_service

    try:
        return demo_service(360, 0, "minilm")
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"the minilm encoder is not available: {exc}")


@pytest.fixture(scope="module")
def server(demo):
    with ServerThread(create_app(demo)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def fitted(svc, model, context=None, **params):
    """The context's geometry, fitted here from the service's anchor sets (not from its cache)."""
    anchors = None
    if context:
        parts = [p.split(":") for p in context.split(",")]
        sets = [svc.anchors.sets[p[0]] for p in parts]
        anchors = sets[0] if len(sets) == 1 else ad.AnchorSet.mixture(sets, [float(p[1]) for p in parts])
    if model in ("softmax", "gaussian", "gmm", "latent_gaussian", "latent_spherical"):
        params.setdefault("tau", svc.tau)
    return ad.make_model(model, **params).fit(anchors)


def expected(svc, geom, q, k, own=None):
    X = svc.collection.embeddings
    d, i = geom.search(np.asarray(q, dtype=np.float32)[None], X, k=k,
                       exclude=None if own is None else np.array([[own]]))
    return np.asarray(d[0]), [int(x) for x in i[0]]


def ids(resp):
    return [h["id"] for h in resp["results"]]


def rows(resp):
    return [h["row"] for h in resp["results"]]


def similarities(model, distances):
    """The documented similarity: exp(−d) for a divergence, 1 − d for cosine, −d for iti."""
    d = np.asarray(distances, dtype=np.float64)
    if model == "cosine":
        return 1 - d
    if model == "iti":
        return -d
    return np.exp(-np.maximum(d, 0))


# --------------------------------------------------------------------------- contexts
def test_contexts_describe_sets_models_and_collection(client, demo):
    info = client.get("/api/contexts").json()
    assert [s["name"] for s in info["sets"]] == ["breeds", "places", "clothing"]
    assert info["sets"][0]["phrases"][0] == "a photo of a husky." and info["sets"][0]["size"] == 6
    assert {m["name"] for m in info["models"]} == set(ad.registry())
    soft = next(m for m in info["models"] if m["name"] == "softmax")
    assert soft["needs_anchors"] and soft["params"]["tau"] == pytest.approx(0.05)
    c = info["collection"]
    assert (c["n"], c["dim"], c["kind"], c["encoder"]) == (360, 384, "text", "minilm")
    assert c["label_columns"] == ["breed", "place", "clothing"] and "husky" in c["labels"]["breed"]
    assert c["text_queries"] and not c["image_queries"] and not c["has_images"]
    assert info["limits"] == {"max_k": 1000, "max_text": 1000, "max_context": 500, "max_image_bytes": 10 * 2**20,
                              "max_anchors": 256, "max_anchor_chars": 300, "max_contexts": 32}
    assert info["default"] == {"name": "softmax:breeds", "model": "softmax", "anchors": "breeds",
                               "tau": pytest.approx(0.05), "k": 12}
    assert info["names"] == client.get("/indices-list").json()
    assert set(info["similarity"]) == {"cosine", "iti", "divergence"}


# --------------------------------------------------------------------------- search
@pytest.mark.parametrize("model,context,params", [
    ("softmax", "breeds", {}),
    ("softmax", "breeds:0.3,places:0.7", {}),
    ("gaussian", "places", {}),
    ("gmm", "clothing", {"n_components": 2}),
    ("latent_gaussian", "breeds:0.5,clothing:0.5", {"rank": 4}),
    ("latent_spherical", "places", {"rank": 0.9}),
    ("iti", "breeds", {}),
    ("cosine", None, {}),
])
def test_row_query_equals_model_search(client, demo, model, context, params):
    body = {"row": QUERY_ROW, "model": model, "context": context, "k": 10, "params": params or None}
    resp = client.post("/api/search", json=body)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    d, i = expected(demo, fitted(demo, model, context, **params), demo.collection.embeddings[QUERY_ROW], 10,
                    own=QUERY_ROW)
    assert ids(data) == i and rows(data) == i  # the demo has no 'id' column: ids are rows
    dist = [h["distance"] for h in data["results"]]
    assert np.allclose(dist, d, rtol=1e-5, atol=1e-6)
    sim = [h["similarity"] for h in data["results"]]
    assert sim == pytest.approx(similarities(model, dist).tolist(), rel=1e-12, abs=1e-12)
    assert all(a >= b for a, b in zip(sim, sim[1:]))  # monotone: the nearest is the most similar
    if model not in ("cosine", "iti"):
        assert all(0 < x <= 1 for x in sim)
    assert data["query"] == {"kind": "row", "id": QUERY_ROW, "row": QUERY_ROW, "text": demo.item_text(QUERY_ROW),
                             "labels": demo.labels_of(QUERY_ROW)}
    hit = data["results"][0]
    assert hit["text"] == demo.collection.metadata["text"][hit["row"]]
    assert hit["labels"] == {c: demo.collection.metadata[c][hit["row"]] for c in ("breed", "place", "clothing")}
    assert data["context"]["model"] == model and data["context"]["anchors"] == context
    assert data["context"]["name"] == (f"{model}:{context}" if context else model)


def test_text_query_why_and_include_self(client, demo):
    text = "a husky wearing a raincoat on the beach"
    data = client.post("/api/search", json={"text": text, "model": "softmax", "context": "breeds", "k": 8}).json()
    q = demo.encoder.encode_text([text])[0]
    geom = fitted(demo, "softmax", "breeds")
    d, i = expected(demo, geom, q, 8)
    assert ids(data) == i and data["query"] == {"kind": "text", "text": text}
    assert {demo.collection.metadata["breed"][r] for r in ids(data)} == {"husky"}
    # the why line: p(anchor | q) of the breeds set, largest first
    A = demo.anchors.sets["breeds"]
    logits = A.embeddings.double().numpy() @ q.astype(np.float64) / demo.tau
    p = np.exp(logits - logits.max())
    p /= p.sum()
    top = np.argsort(-p)[:3]
    assert [w["anchor"] for w in data["why"]] == [A.texts[j] for j in top]
    assert [w["mass"] for w in data["why"]] == pytest.approx(p[top].tolist())
    assert data["why"][0]["anchor"] == "a photo of a husky." and data["why"][0]["set"] == "breeds"
    # a row query leaves its own row out unless include_self
    own = client.post("/api/search", json={"row": 3, "model": "cosine", "k": 3, "include_self": True}).json()
    assert ids(own)[0] == 3 and own["results"][0]["distance"] == pytest.approx(0, abs=1e-6)
    assert 3 not in ids(client.post("/api/search", json={"row": 3, "model": "cosine", "k": 3}).json())


def test_mixture_slider_moves_the_neighbourhood(client, demo):
    """p = 1 (breeds) and p = 0 (places) give neighbourhoods sharing the breed and the place."""
    row = QUERY_ROW
    meta = demo.collection.metadata
    near = {}
    for p in (1.0, 0.5, 0.0):
        ctx = f"breeds:{p},places:{1 - p}"
        data = client.post("/api/search", json={"row": row, "context": ctx, "k": 10}).json()
        near[p] = ids(data)
        assert near[p] == expected(demo, fitted(demo, "softmax", ctx if 0 < p < 1 else
                                                ("breeds" if p else "places")), demo.rows[row], 10, row)[1]
    assert data["context"]["anchors"] == "places"  # a zero share drops the set
    assert all(meta["breed"][r] == meta["breed"][row] for r in near[1.0])
    assert all(meta["place"][r] == meta["place"][row] for r in near[0.0])
    assert near[1.0] != near[0.5] != near[0.0]


def test_filter_restricts_to_matching_rows(client, demo):
    data = client.post("/api/search", json={"row": QUERY_ROW, "context": "breeds", "k": 5,
                                            "filter": {"place": ["beach", "park"]}}).json()
    meta = demo.collection.metadata
    rows = np.flatnonzero(meta["place"].isin(["beach", "park"]).to_numpy())
    rows = rows[rows != QUERY_ROW]
    geom = fitted(demo, "softmax", "breeds")
    _, i = geom.search(demo.collection.embeddings[QUERY_ROW][None], demo.collection.embeddings[rows], k=5)
    assert ids(data) == [int(rows[j]) for j in i[0]]
    assert data["filter"] == {"place": ["beach", "park"]}
    few = client.post("/api/search", json={"row": 0, "model": "cosine", "k": 50,
                                           "filter": {"breed": "pug", "place": "beach", "clothing": "boots"}}).json()
    want = meta.index[(meta.breed == "pug") & (meta.place == "beach") & (meta.clothing == "boots")].tolist()
    assert sorted(ids(few)) == sorted(r for r in want if r != 0)  # k is capped by the matching rows


def test_context_is_fitted_once_under_concurrent_requests(client, demo):
    before = client.get("/api/health").json()["cache"]
    body = {"row": 11, "model": "gaussian", "context": "breeds:0.35,clothing:0.65", "tau": 0.0421, "k": 6}
    out = []

    def go():
        with httpx.Client(base_url=str(client.base_url), timeout=60) as c:
            out.append(c.post("/api/search", json=body).json())

    threads = [threading.Thread(target=go) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = client.get("/api/health").json()["cache"]
    assert after["misses"] == before["misses"] + 1 and after["hits"] >= before["hits"] + 11
    assert len(out) == 12 and all(ids(r) == ids(out[0]) for r in out)
    assert ids(out[0]) == expected(demo, fitted(demo, "gaussian", "breeds:0.35,clothing:0.65", tau=0.0421),
                                   demo.rows[11], 6, 11)[1]


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize("body,status,field", [
    ({"row": 1, "k": 0}, 422, "k"),
    ({"row": 1, "k": 1001}, 422, "k"),
    ({"row": 1, "k": "5"}, 422, "k"),
    ({"row": 1, "k": True}, 422, "k"),
    ({"row": 1, "tau": -1}, 422, "tau"),
    ({"row": 1, "tau": "hot"}, 422, "tau"),
    ({"row": 1, "model": "nope"}, 422, "model"),
    ({"row": 1, "context": "nope"}, 422, "context"),
    ({"row": 1, "context": "breeds:0.5,places"}, 422, "context"),
    ({"row": 1, "context": "breeds:-1"}, 422, "context"),
    ({"row": 1, "context": "x" * 501}, 422, "context"),
    ({"text": "x" * 1001}, 422, "text"),
    ({"text": ""}, 422, "text"),
    ({"text": 5}, 422, "text"),
    ({"text": "a dog", "row": 1}, 422, "query"),
    ({"k": 5}, 422, "query"),
    ({"row": 360}, 404, "row"),
    ({"row": -1}, 404, "row"),
    ({"row": 1.5}, 422, "row"),
    ({"id": "no-such-id"}, 404, "id"),
    ({"row": 1, "colour": "red"}, 422, "colour"),
    ({"row": 1, "filter": {"colour": "red"}}, 422, "filter.colour"),
    ({"row": 1, "filter": ["breed"]}, 422, "filter"),
    ({"row": 1, "filter": {"breed": []}}, 422, "filter.breed"),
    ({"row": 1, "model": "latent_gaussian", "context": "breeds", "params": {"rank": 0}}, 422, "params.rank"),
    ({"row": 1, "model": "softmax", "params": {"rank": 4}}, 422, "params.rank"),
    ({"row": 1, "params": [1]}, 422, "params"),
    ({"embedding": [0.1] * 5}, 422, "embedding"),
    ({"embedding": [float("nan")] * 384}, 422, "embedding"),
    ({"row": 1, "index": "nope"}, 422, "index"),
    ({"row": 1, "symmetric": "yes"}, 422, "symmetric"),
    ({"image": "AAAA"}, 422, "image"),
])
def test_every_field_is_validated(client, body, status, field):
    resp = client.post("/api/search", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert resp.status_code == status, resp.text
    err = resp.json()
    assert err["field"] == field and err["error"].startswith(f"{field}: ")


def test_malformed_bodies_and_limits(client):
    post = client.post
    assert post("/api/search", content=b"{not json", headers={"Content-Type": "application/json"}).json()["field"] \
        == "body"
    assert post("/api/search", json=[1, 2]).status_code == 400
    assert post("/api/search", content=b"row=1", headers={"Content-Type": "text/plain"}).status_code == 415
    big = post("/api/search", content=b" " * (2 << 20), headers={"Content-Type": "application/json"})
    assert big.status_code == 413 and big.json()["field"] == "body"
    upload = post("/api/search", files={"image": ("big.png", b"\0" * (10 * 2**20 + 1), "image/png")},
                  data={"k": "3"})
    assert upload.status_code == 413 and upload.json()["field"] == "image"
    no_tower = post("/api/search", files={"image": ("x.png", _png((255, 0, 0)), "image/png")}, data={"k": "3"})
    assert no_tower.status_code == 422 and no_tower.json()["field"] == "image"
    assert "no image tower" in no_tower.json()["error"]


def test_items_and_thumbnails_by_id(client, demo):
    item = client.get("/api/items/5").json()  # no 'id' column: the id is the row number
    assert item["id"] == 5 and item["row"] == 5 and item["text"] == demo.collection.metadata["text"][5]
    assert item["thumbnail"] is None
    assert item["labels"] == demo.labels_of(5)
    for bad in ("360", "-1", "abc", "1e3", "%2e%2e"):
        resp = client.get(f"/api/items/{bad}")
        assert resp.status_code == 404 and resp.json()["field"] == "id", bad
    assert client.get("/api/items/..%2F..%2Fetc%2Fpasswd").status_code == 404  # no such id
    assert client.get("/api/thumb/5").status_code == 404  # a text collection has no images
    assert client.get("/api/thumb/../../etc/passwd").status_code == 404
    assert client.get("/static/../service.py").status_code == 404
    assert client.get("/static/index.html").status_code == 404


def test_security_headers_and_loopback_hosts(client, server):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    for resp in (page, client.get("/api/contexts"), client.get("/static/app.js")):
        assert "default-src 'none'" in resp.headers["content-security-policy"]
        assert resp.headers["x-content-type-options"] == "nosniff"
    html = page.text + client.get("/static/app.js").text + client.get("/static/style.css").text
    assert "http://" not in html and "https://" not in html and "innerHTML" not in html  # offline, no markup
    assert client.get("/", headers={"Host": "evil.example"}).status_code == 400  # DNS rebinding
    assert server.host == "127.0.0.1"
    from anchordiv.serve.cli import serve_command

    assert next(p for p in serve_command.params if p.name == "host").default == "127.0.0.1"


# --------------------------------------------------------------------------- clip-retrieval
def _clip_client_body(**over):
    """Exactly the JSON that clip_retrieval.clip_client.ClipClient posts (its defaults)."""
    body = {"text": None, "image": None, "image_url": None, "embedding_input": None, "deduplicate": True,
            "use_safety_model": True, "use_violence_detector": True, "indice_name": "softmax:breeds",
            "use_mclip": False, "aesthetic_score": 9, "aesthetic_weight": 0.5, "modality": "image",
            "num_images": 40, "num_result_ids": 40}
    body.update(over)
    return json.dumps(body)


def test_clip_retrieval_endpoints(client, demo):
    names = client.get("/indices-list").json()
    assert names[0] == "softmax:breeds" and names[1] == "cosine" and "iti:clothing" in names  # the default first
    assert len(names) == 1 + 6 * 3 and len(set(names)) == len(names)
    # ClipClient sends data=json.dumps(...) with no Content-Type, as here
    resp = client.post("/knn-service", content=_clip_client_body(text="a corgi in a bow tie", num_images=5,
                                                                 num_result_ids=5))
    assert resp.status_code == 200, resp.text
    hits = resp.json()
    native = client.post("/api/search", json={"text": "a corgi in a bow tie", "context": "breeds", "k": 5}).json()
    unique, seen = [], set()  # deduplicate=True drops repeated embeddings
    for h in native["results"]:
        if demo.collection.embeddings[h["id"]].tobytes() not in seen:
            seen.add(demo.collection.embeddings[h["id"]].tobytes())
            unique.append(h)
    assert [h["id"] for h in hits] == [h["id"] for h in unique]
    assert [h["similarity"] for h in hits] == pytest.approx([np.exp(-h["distance"]) for h in unique], rel=1e-12)
    assert all(0 < h["similarity"] <= 1 for h in hits)
    assert set(hits[0]) >= {"id", "similarity", "caption", "breed", "place", "clothing"}
    assert hits[0]["caption"] == demo.collection.metadata["text"][hits[0]["id"]]
    # cosine: similarity is the cosine similarity, as clip back reports it
    q = demo.collection.embeddings[4]
    cos = client.post("/knn-service", content=_clip_client_body(
        embedding_input=q.tolist(), indice_name="cosine", num_images=4, deduplicate=False)).json()
    X = demo.collection.embeddings
    sims = X @ q / np.linalg.norm(X, axis=1) / np.linalg.norm(q)
    assert [h["id"] for h in cos] == np.argsort(-sims, kind="stable")[:4].tolist()
    assert [h["similarity"] for h in cos] == pytest.approx(np.sort(sims)[::-1][:4], abs=1e-5)
    mixed = client.post("/knn-service", content=_clip_client_body(
        text="a dog", indice_name="gaussian:breeds:0.6,places:0.4", num_images=3)).json()
    want = client.post("/api/search", json={"text": "a dog", "model": "gaussian", "context": "breeds:0.6,places:0.4",
                                            "k": 3}).json()
    assert [h["id"] for h in mixed] == ids(want)
    meta = client.post("/metadata", content=json.dumps({"ids": [3, 9], "indice_name": "cosine"})).json()
    assert [m["id"] for m in meta] == [3, 9]
    assert meta[1]["metadata"]["caption"] == demo.collection.metadata["text"][9]
    assert client.post("/metadata", content=json.dumps({"ids": [360]})).json()["field"] == "ids"
    for body, field in ((_clip_client_body(image_url="http://example.com/x.jpg"), "image_url"),
                        (_clip_client_body(text="a", indice_name="softmax"), "indice_name"),
                        (_clip_client_body(text="a", indice_name="softmax:nope"), "indice_name"),
                        (_clip_client_body(text="a", num_images=5000), "num_images"),
                        (_clip_client_body(image="not base64!"), "image"),
                        (_clip_client_body(), "text"),
                        (json.dumps({"ids": "3"}), "ids")):
        url = "/metadata" if '"ids"' in body else "/knn-service"
        resp = client.post(url, content=body)
        assert resp.status_code in (404, 422) and resp.json()["field"] == field, (body, resp.text)


def _clip_client_module():
    spec = importlib.util.find_spec("clip_retrieval")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "clip_client.py"
    mod_spec = importlib.util.spec_from_file_location("_clip_client", path)  # its package __init__ needs flask etc.
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_real_clip_client(server, client):
    """clip-retrieval's own ClipClient, when installed (it is not a dependency: it pins an old numpy)."""
    mod = _clip_client_module()
    if mod is None:
        pytest.skip("clip-retrieval is not installed; test_clip_retrieval_endpoints sends its exact requests")
    names = client.get("/indices-list").json()
    assert "softmax:places" in names
    cc = mod.ClipClient(url=f"{server.url}/knn-service", indice_name="softmax:places", num_images=6,
                        modality=mod.Modality.TEXT)
    hits = cc.query(text="a pug in the snowy mountains")
    native = client.post("/api/search", json={"text": "a pug in the snowy mountains", "context": "places",
                                              "k": 6}).json()
    assert [h["id"] for h in hits] == ids(native) and all("caption" in h for h in hits)
    emb = cc.query(embedding_input=[float(x) for x in np.eye(384)[0]])
    assert len(emb) == 6 and all(0 < h["similarity"] <= 1 for h in emb)


# --------------------------------------------------------------------------- images
def _png(rgb, size=(40, 30)):
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, rgb).save(buf, format="PNG")
    return buf.getvalue()


class StubImageEncoder:
    """A tiny image-text "encoder": an image maps to its mean colour, a text to a hashed direction."""

    name, tau, has_images, dim = "stub", 0.05, True, 8

    @staticmethod
    def _unit(x):
        return (x / np.linalg.norm(x)).astype(np.float32)

    def encode_images(self, images):
        out = []
        for im in images:
            r, g, b = np.asarray(im.convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(0) / 255
            out.append(self._unit(np.array([r, g, b, 1 - r, 1 - g, 1 - b, 0.5, 0.5])))
        return np.stack(out)

    def encode_text(self, texts):
        out = []
        for t in texts:
            seed = int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)
            out.append(self._unit(np.random.default_rng(seed).normal(size=8)))
        return np.stack(out)


COLOURS = [(250, 10, 10), (10, 250, 10), (10, 10, 250), (240, 240, 20), (20, 240, 240), (120, 120, 120)]


@pytest.fixture(scope="module")
def image_server(tmp_path_factory):
    import pandas as pd

    root = tmp_path_factory.mktemp("images")
    (root / "secret.txt").write_text("do not serve me")
    enc = StubImageEncoder()
    paths = []
    for j, rgb in enumerate(COLOURS):
        p = root / "img" / f"c{j}.png"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(_png(rgb, (300, 200)))
        paths.append(str(p))
    paths.append(str(root / "img" / "missing.png"))
    from PIL import Image

    X = np.concatenate([enc.encode_images([Image.open(p) for p in paths[:-1]]),
                        enc.encode_text(["missing"])])
    meta = pd.DataFrame({"image_path": paths, "label": ["warm", "cold", "cold", "warm", "cold", "grey", "none"]})
    coll = Collection(X, metadata=meta, kind="image", tau=0.05, encoder="stub", path=str(root))
    rng = np.random.default_rng(1)
    sets = {"warm": ad.AnchorSet(enc._unit(rng.normal(size=(3, 8))), texts=["red", "orange", "yellow"]),
            "cold": ad.AnchorSet(enc._unit(rng.normal(size=(2, 8))), texts=["blue", "cyan"])}
    anchors = EmbeddedAnchors(path=root / "a.yaml", sets=sets, mix={"warm": 1.0, "cold": 1.0}, encoder="stub",
                              tau=0.05)
    svc = Service(coll, anchors, enc)
    with ServerThread(create_app(svc)) as s:
        yield s, svc


def test_thumbnails_serve_only_the_collections_images(image_server):
    from PIL import Image

    server, svc = image_server
    with httpx.Client(base_url=server.url) as c:
        info = c.get("/api/contexts").json()["collection"]
        assert info["has_images"] and info["image_queries"] and info["label_columns"] == ["label"]
        resp = c.get("/api/thumb/2")
        assert resp.status_code == 200 and resp.headers["content-type"] == "image/jpeg"
        im = Image.open(io.BytesIO(resp.content))
        assert max(im.size) == 256 and np.abs(np.asarray(im).reshape(-1, 3).mean(0) - COLOURS[2]).max() < 4
        assert c.get("/api/thumb/6").json()["field"] == "id"  # its file is missing
        for bad in ("7", "..%2Fsecret.txt", "%2e%2e%2fsecret.txt", "0%00", "0.png"):
            resp = c.get(f"/api/thumb/{bad}")
            assert resp.status_code == 404 and b"do not serve" not in resp.content, bad
        item = c.get("/api/items/1").json()
        assert item["text"] == "c1.png" and item["thumbnail"] == f"{server.url}/api/thumb/1"
        assert "image_path" not in item["metadata"]  # the server's paths stay on the server
        meta = c.post("/metadata", content=json.dumps({"ids": [0]})).json()[0]["metadata"]
        assert meta["image_path"] == "c0.png"
        assert max(Image.open(io.BytesIO(base64.b64decode(meta["image"]))).size) == 256


def test_relative_image_paths_resolve_against_the_collection_folder_only(tmp_path, monkeypatch):
    import pandas as pd

    folder, cwd = tmp_path / "coll", tmp_path / "cwd"
    (folder / "img").mkdir(parents=True)
    (cwd / "img").mkdir(parents=True)
    (folder / "img" / "a.png").write_bytes(_png((250, 10, 10), (64, 64)))
    (cwd / "img" / "b.png").write_bytes(_png((10, 10, 250), (64, 64)))  # only in the working directory
    monkeypatch.chdir(cwd)
    enc = StubImageEncoder()
    X = enc.encode_text(["a", "b"])
    meta = pd.DataFrame({"image_path": ["img/a.png", "img/b.png"]})
    coll = Collection(X, metadata=meta, kind="image", tau=0.05, encoder="stub", path=str(folder))
    svc = Service(coll, None, enc, default_model="cosine")
    with ServerThread(create_app(svc)) as server, httpx.Client(base_url=server.url) as c:
        assert c.get("/api/thumb/0").status_code == 200
        assert c.get("/api/thumb/1").status_code == 404


def test_image_upload_query(image_server):
    server, svc = image_server
    png = _png((15, 245, 20))
    with httpx.Client(base_url=server.url) as c:
        resp = c.post("/api/search", files={"image": ("q.png", png, "image/png")},
                      data={"model": "softmax", "context": "warm:0.5,cold:0.5", "k": "3",
                            "filter": json.dumps({"label": ["warm", "cold"]})})
        assert resp.status_code == 200, resp.text
        data = resp.json()
        from PIL import Image

        q = svc.encoder.encode_images([Image.open(io.BytesIO(png))])[0]
        geom = fitted(svc, "softmax", "warm:0.5,cold:0.5")
        rows = np.array([0, 1, 2, 3, 4])
        _, i = geom.search(q[None], svc.collection.embeddings[rows], k=3)
        assert data["query"] == {"kind": "image"} and ids(data) == rows[i[0]].tolist()
        assert data["results"][0]["thumbnail"] == f"{server.url}/api/thumb/1"  # absolute: usable from anywhere
        assert c.get(data["results"][0]["thumbnail"]).headers["content-type"] == "image/jpeg"
        clip = c.post("/knn-service", content=_clip_client_body(image=base64.b64encode(png).decode(),
                                                                 indice_name="cosine", num_images=2)).json()
        X = svc.collection.embeddings
        assert [h["id"] for h in clip] == np.argsort(-(X @ q), kind="stable")[:2].tolist()
        assert clip[0]["id"] == 1 and clip[0]["url"] == f"{server.url}/api/thumb/1"
        for files, field in (({"image": ("x.png", b"not an image", "image/png")}, "image"),
                             ({"image": ("x.png", png, "image/png")}, "k")):
            resp = c.post("/api/search", files=files, data={"k": "zero"} if field == "k" else {})
            assert resp.status_code == 422 and resp.json()["field"] == field


# --------------------------------------------------------------------------- the command
def _wait_port(port, proc, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stdout.read()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError("the server did not start")


def test_cli_serve_with_a_faiss_index_and_clean_shutdown(tmp_path):
    """``anchordiv serve`` in a subprocess: an --index is searchable, and SIGINT stops it cleanly."""
    from anchordiv.serve import free_port

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 16)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    np.save(tmp_path / "coll.npy", X)
    model = ad.make_model("gaussian", tau=0.05).fit(ad.AnchorSet(X[:20]))
    index = ad.Index(model, backend="faiss", index_type="hnsw")
    index.add(X, ids=np.arange(300))
    index.save(tmp_path / "g.index")
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "anchordiv.cli", "serve", str(tmp_path / "coll.npy"),
                             "--index", f"hnsw={tmp_path / 'g.index'}", "--model", "cosine", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_port(port, proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            got = c.post("/api/search", json={"row": 5, "index": "hnsw", "k": 5}).json()
            d, i = index.search(X[5:6], k=5, exclude=np.array([[5]]))
            assert ids(got) == i[0].tolist() and got["context"]["name"] == "index:hnsw"
            exact = model.search(X[5:6], X, k=5, exclude=np.array([[5]]))[1][0].tolist()
            assert ids(got) == exact  # HNSW with re-ranking finds the exact top 5 here
            assert "index:hnsw" in c.get("/indices-list").json()
            assert c.post("/api/search", json={"row": 5, "index": "hnsw", "model": "softmax"}).json()["field"] \
                == "model"
            assert c.post("/api/search", json={"text": "a cat"}).json()["field"] == "text"  # no encoder
            names = c.get("/indices-list").json()
            assert names == ["cosine", "index:hnsw"]  # --model cosine: the default is cosine
            by_name = c.post("/api/search", json={"row": 5, "context": "index:hnsw", "k": 5}).json()
            assert ids(by_name) == ids(got) and by_name["context"]["name"] == "index:hnsw"
            knn = c.post("/knn-service", content=_clip_client_body(embedding_input=X[5].tolist(),
                                                                    indice_name="index:hnsw", num_images=6,
                                                                    deduplicate=False)).json()
            d6, i6 = index.search(X[5:6], k=6)
            assert [h["id"] for h in knn] == i6[0].tolist() and knn[0]["id"] == 5
            assert [h["similarity"] for h in knn] == pytest.approx(np.exp(-np.maximum(d6[0], 0)), rel=1e-6)
            assert c.post("/api/search", json={"row": 5, "context": "index:nope"}).json()["field"] == "context"
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert f"http://127.0.0.1:{port}/" in out
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0  # the port is closed


def test_server_thread_stops_cleanly(demo):
    s = ServerThread(create_app(demo)).start()
    with httpx.Client(base_url=s.url) as c:
        assert c.get("/api/health").json()["status"] == "ok"
    s.stop()
    assert not s.thread.is_alive()
    with socket.socket() as sock:
        assert sock.connect_ex((s.host, s.port)) != 0


# --------------------------------------------------------------------------- ids, rows, names, defaults
N_IDS = 30


def _id_collection(id_values, root=None):
    """30 rows of 8-d unit vectors with ``id`` column ``id_values``, a caption and a label; two anchor sets."""
    import pandas as pd

    rng = np.random.default_rng(3)
    X = rng.normal(size=(N_IDS, 8)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    meta = pd.DataFrame({"id": id_values, "caption": [f"item at row {r}" for r in range(N_IDS)],
                         "label": [("odd", "even")[r % 2] for r in range(N_IDS)]})
    coll = Collection(X, metadata=meta, kind="text", tau=0.05, encoder="none", path=str(root or "ids"))
    A = rng.normal(size=(11, 8)).astype(np.float32)
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    sets = {"left": ad.AnchorSet(A[:6], texts=[f"l{j}" for j in range(6)]),
            "right": ad.AnchorSet(A[6:], texts=[f"r{j}" for j in range(5)])}
    anchors = EmbeddedAnchors(path=Path("ids.yaml"), sets=sets, mix={"left": 1.0, "right": 1.0}, encoder="none",
                              tau=0.05)
    return coll, anchors


ID_KINDS = {"ints 1..30": list(range(1, N_IDS + 1)),
            "strings": [f"p/{chr(97 + r % 26)}-{r * 7 % 31}" for r in range(N_IDS)]}


@pytest.fixture(scope="module", params=list(ID_KINDS))
def id_server(request):
    id_values = ID_KINDS[request.param]
    coll, anchors = _id_collection(id_values)
    svc = Service(coll, anchors)
    with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url, timeout=60) as c:
        yield s, c, svc, id_values


def test_an_id_names_the_same_item_everywhere(id_server):
    """Results, {"id": ...} queries, /api/items/{id}, /knn-service and /metadata agree on ids."""
    server, c, svc, id_values = id_server
    X = svc.collection.embeddings
    row = 14
    by_row = c.post("/api/search", json={"row": row, "model": "cosine", "k": 6}).json()
    want = np.argsort(-(X @ X[row]), kind="stable")[1:7].tolist()
    assert rows(by_row) == want and ids(by_row) == [id_values[r] for r in want]
    assert by_row["query"]["id"] == id_values[row] and by_row["query"]["row"] == row
    by_id = c.post("/api/search", json={"id": id_values[row], "model": "cosine", "k": 6}).json()
    assert ids(by_id) == ids(by_row) and rows(by_id) == want and by_id["query"]["row"] == row
    for hit in by_row["results"]:
        item = c.get(f"/api/items/{quote(str(hit['id']), safe='')}").json()
        assert (item["id"], item["row"], item["text"]) == (hit["id"], hit["row"], f"item at row {hit['row']}")
        again = c.post("/api/search", json={"id": hit["id"], "model": "cosine", "k": 1, "include_self": True}).json()
        assert again["results"][0]["id"] == hit["id"] and again["results"][0]["row"] == hit["row"]
    knn = c.post("/knn-service", content=_clip_client_body(embedding_input=X[row].tolist(), indice_name="cosine",
                                                           num_images=7, deduplicate=False)).json()
    assert [h["id"] for h in knn] == [id_values[row]] + ids(by_row)
    assert [h["caption"] for h in knn] == [f"item at row {r}" for r in [row] + want]
    meta = c.post("/metadata", content=json.dumps({"ids": [h["id"] for h in knn[:3]]})).json()
    assert [m["id"] for m in meta] == [h["id"] for h in knn[:3]]
    assert [m["metadata"]["caption"] for m in meta] == [h["caption"] for h in knn[:3]]
    mod = _clip_client_module()
    if mod is not None:  # clip-retrieval's own client sees the same ids
        cc = mod.ClipClient(url=f"{server.url}/knn-service", indice_name="cosine", num_images=7,
                            deduplicate=False)
        assert [h["id"] for h in cc.query(embedding_input=X[row].tolist())] == [h["id"] for h in knn]


def test_the_issue_example_id_15_is_row_14():
    coll, anchors = _id_collection(ID_KINDS["ints 1..30"])
    with ServerThread(create_app(Service(coll, anchors))) as s, httpx.Client(base_url=s.url) as c:
        _id_15_is_row_14(c)


def _id_15_is_row_14(c):
    assert c.post("/api/search", json={"id": 15, "model": "cosine", "k": 1}).json()["query"]["row"] == 14
    assert c.post("/api/search", json={"id": "15", "model": "cosine", "k": 1}).json()["query"]["row"] == 14
    assert c.get("/api/items/15").json()["row"] == 14
    assert c.post("/api/search", json={"row": 15, "model": "cosine", "k": 1}).json()["query"]["id"] == 16


def test_an_id_that_does_not_exist_is_an_error(id_server):
    server, c, svc, id_values = id_server
    missing = [31, 0, "31", "nope"] if id_values[0] == 1 else ["p/zz", 0, 14, "P/A-0"]
    for value in missing:
        resp = c.post("/api/search", json={"id": value, "model": "cosine"})
        err = resp.json()
        assert resp.status_code == 404 and err["field"] == "id" and repr(value) in err["error"], value
        assert "use row" in err["error"]
        resp = c.get(f"/api/items/{quote(str(value), safe='')}")
        assert resp.status_code == 404 and repr(str(value)) in resp.json()["error"]
        resp = c.post("/metadata", content=json.dumps({"ids": [value]}))
        assert resp.status_code == 404 and resp.json()["field"] == "ids"
    for value in (True, 1.5, [1], {"id": 1}):
        resp = c.post("/api/search", json={"id": value, "model": "cosine"})
        assert resp.status_code == 422 and resp.json()["field"] == "id", value
    resp = c.post("/api/search", json={"row": N_IDS, "model": "cosine"})
    assert resp.status_code == 404 and resp.json()["field"] == "row"
    first = c.post("/api/search", json={"row": 0, "model": "cosine", "k": 1}).json()["query"]
    assert (first["row"], first["id"]) == (0, id_values[0])


def test_duplicate_ids_are_an_error_naming_the_rows():
    coll, anchors = _id_collection([1, 2, 2] + list(range(4, N_IDS + 1)))
    svc = Service(coll, anchors)
    with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url) as c:
        err = c.post("/api/search", json={"id": 2, "model": "cosine"}).json()
        assert err["field"] == "id" and "rows [1, 2]" in err["error"]
        assert c.post("/api/search", json={"row": 2, "model": "cosine", "k": 1}).json()["query"]["id"] == 2


def test_one_default_context_everywhere(id_server):
    server, c, svc, id_values = id_server
    info = c.get("/api/contexts").json()
    default = info["default"]
    assert default == {"name": "softmax:left", "model": "softmax", "anchors": "left", "tau": 0.05, "k": 12}
    assert c.get("/indices-list").json()[0] == default["name"]
    X = svc.collection.embeddings
    plain = c.post("/api/search", json={"embedding": X[3].tolist(), "k": 5}).json()
    named = c.post("/api/search", json={"embedding": X[3].tolist(), "context": default["name"], "k": 5}).json()
    assert plain["context"]["name"] == named["context"]["name"] == default["name"]
    assert ids(plain) == ids(named)
    geom = ad.make_model("softmax", tau=0.05).fit(svc.anchors.sets["left"])
    _, i = geom.search(X[3:4], X, k=5)
    assert rows(plain) == i[0].tolist()
    knn = c.post("/knn-service", content=json.dumps({"embedding_input": X[3].tolist(), "num_images": 5})).json()
    assert [h["id"] for h in knn] == ids(plain)
    # a geometry without a context takes the default context's anchors
    gauss = c.post("/api/search", json={"embedding": X[3].tolist(), "model": "gaussian", "k": 5}).json()
    assert gauss["context"]["name"] == "gaussian:left"


def test_default_context_can_be_chosen_and_is_checked():
    coll, anchors = _id_collection(list(range(N_IDS)))
    svc = Service(coll, anchors, default_model="gaussian", default_context="right:0.25,left:0.75")
    assert svc.default_key.name == "gaussian:right:0.25,left:0.75" and svc.indices_list()[0] == svc.default_key.name
    assert svc.search({"row": 1, "k": 3})["context"]["name"] == svc.default_key.name
    assert Service(coll, anchors, default_model="cosine").indices_list()[0] == "cosine"
    with pytest.raises(ValueError, match="default_context: unknown anchor set 'nope'"):
        Service(coll, anchors, default_context="nope")


def test_every_listed_name_is_accepted_by_search_and_knn_service(id_server):
    server, c, svc, id_values = id_server
    X = svc.collection.embeddings
    names = c.get("/indices-list").json()
    assert len(names) == 1 + 6 * 2 and names == c.get("/api/contexts").json()["names"]
    for name in names:
        body = {"embedding": X[2].tolist(), "context": name, "k": 4}
        resp = c.post("/api/search", json=body)
        assert resp.status_code == 200, (name, resp.text)
        data = resp.json()
        assert data["context"]["name"] == name
        knn = c.post("/knn-service", content=_clip_client_body(embedding_input=X[2].tolist(), indice_name=name,
                                                               num_images=4, deduplicate=False))
        assert knn.status_code == 200 and [h["id"] for h in knn.json()] == ids(data), name
        model, _, sets = name.partition(":")
        split = c.post("/api/search", json={**body, "model": model, "context": sets or None}).json()
        assert ids(split) == ids(data) and split["context"]["name"] == name  # MODEL + SETS: the same context
    for bad, field in (("softmax", "context"), ("cosine:left", "context"), ("index:style", "context"),
                       ("softmax:nope", "context")):
        resp = c.post("/api/search", json={"row": 1, "context": bad})
        assert resp.status_code in (404, 422) and resp.json()["field"] == field, bad
    resp = c.post("/api/search", json={"row": 1, "context": "softmax:left", "model": "gaussian"})
    assert resp.json()["field"] == "model" and "contradicts" in resp.json()["error"]


def test_similarity_is_bounded_and_monotone(id_server):
    server, c, svc, id_values = id_server
    X = svc.collection.embeddings
    q = X[5] * 0.6 + X[9] * 0.8
    for model in ("softmax", "gaussian", "latent_gaussian", "cosine", "iti"):
        data = c.post("/api/search", json={"embedding": q.tolist(), "model": model, "k": N_IDS}).json()
        d = np.array([h["distance"] for h in data["results"]])
        s = np.array([h["similarity"] for h in data["results"]])
        assert np.all(np.diff(s) <= 0) and np.all(np.diff(d) >= 0)
        if model == "cosine":
            cos = X @ q / np.linalg.norm(q)
            assert s == pytest.approx(cos[rows(data)], abs=1e-6)
        elif model == "iti":
            assert np.all(np.abs(s) <= 1) and s == pytest.approx(-d, abs=0)
        else:
            assert np.all((s > 0) & (s <= 1)) and s == pytest.approx(np.exp(-np.maximum(d, 0)), rel=1e-12)
            assert d.max() > 1  # some distances exceed 1, where 1 − d would be negative
        assert data["context"]["similarity"] == c.get("/api/contexts").json()["similarity"][
            {"cosine": "cosine", "iti": "iti"}.get(model, "divergence")]


def test_thumbnail_urls_are_absolute_and_use_string_ids(tmp_path):
    import pandas as pd

    enc = StubImageEncoder()
    paths, id_values = [], ["red/one", "green two", "blue?3"]
    for j, rgb in enumerate(COLOURS[:3]):
        p = tmp_path / f"c{j}.png"
        p.write_bytes(_png(rgb, (64, 64)))
        paths.append(str(p))
    from PIL import Image

    X = enc.encode_images([Image.open(p) for p in paths])
    meta = pd.DataFrame({"id": id_values, "image_path": paths, "label": ["a", "b", "c"]})
    svc = Service(Collection(X, metadata=meta, kind="image", tau=0.05, encoder="stub", path=str(tmp_path)),
                  None, enc, default_model="cosine")
    with ServerThread(create_app(svc)) as s, httpx.Client(base_url=s.url) as c:
        data = c.post("/api/search", json={"id": "green two", "k": 2}).json()
        assert data["query"]["row"] == 1
        for hit in data["results"]:
            assert hit["thumbnail"] == f"{s.url}/api/thumb/{quote(hit['id'], safe='')}"
            im = Image.open(io.BytesIO(httpx.get(hit["thumbnail"]).content))
            assert np.abs(np.asarray(im).reshape(-1, 3).mean(0) - COLOURS[hit["row"]]).max() < 4
        item = c.get(f"/api/items/{quote('red/one', safe='')}").json()
        assert item["row"] == 0 and item["thumbnail"] == f"{s.url}/api/thumb/red%2Fone"
        knn = c.post("/knn-service", content=_clip_client_body(embedding_input=X[2].tolist(), indice_name="cosine",
                                                               num_images=1)).json()
        assert knn[0]["id"] == "blue?3" and knn[0]["url"] == f"{s.url}/api/thumb/blue%3F3"


def test_busy_port_is_a_one_line_error(tmp_path):
    """``anchordiv serve`` on a port in use: one error line, exit 1, and never "Serving"."""
    np.save(tmp_path / "coll.npy", np.eye(4, dtype=np.float32))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "anchordiv.cli", "serve", str(tmp_path / "coll.npy"),
                               "--model", "cosine", "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Serving" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [f"Error: port {port} on 127.0.0.1 is already in use; stop what serves there or choose "
                     "another with --port"]


class _CountingEncoder:
    """A text encoder that counts the texts it embeds (to see whether the demo cache was used)."""

    name, tau = "counting-stub", 0.05

    def __init__(self):
        self.calls = 0

    def encode_text(self, texts, progress=False):
        self.calls += len(texts)
        out = []
        for t in texts:
            seed = int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)
            v = np.random.default_rng(seed).normal(size=16)
            out.append((v / np.linalg.norm(v)).astype(np.float32))
        return np.stack(out)


def test_demo_embeddings_are_cached_by_encoder_and_content(tmp_path):
    from anchordiv.apps.serve_demo import build_demo_service

    enc = _CountingEncoder()
    cold = build_demo_service(24, 0, enc, cache=tmp_path)
    assert enc.calls == 24 + 18
    files = list(tmp_path.glob("scene-counting-stub-*.npz"))
    assert len(files) == 1 and not list(tmp_path.glob(".*.tmp"))
    warm = build_demo_service(24, 0, enc, cache=tmp_path)
    assert enc.calls == 24 + 18  # nothing embedded again
    np.testing.assert_array_equal(warm.collection.embeddings, cold.collection.embeddings)
    for name in ("breeds", "places", "clothing"):
        np.testing.assert_array_equal(warm.anchors.sets[name].embeddings.numpy(),
                                      cold.anchors.sets[name].embeddings.numpy())
    assert warm.tau == cold.tau == 0.05
    assert warm.search({"row": 3, "k": 5})["results"] == cold.search({"row": 3, "k": 5})["results"]
    build_demo_service(25, 0, enc, cache=tmp_path)  # other texts: another key
    assert enc.calls == 2 * (24 + 18) + 1 and len(list(tmp_path.glob("scene-*.npz"))) == 2
    files[0].write_bytes(b"not an npz")  # a corrupt file is recomputed and rewritten
    build_demo_service(24, 0, enc, cache=tmp_path)
    assert enc.calls == 3 * (24 + 18) + 1
    build_demo_service(24, 0, enc, cache=tmp_path)
    assert enc.calls == 3 * (24 + 18) + 1


# --------------------------------------------------------------------------- OpenAPI and /docs
def test_openapi_describes_every_endpoint_and_model(client):
    spec = client.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.") and spec["info"]["title"] == "anchordiv"
    assert set(spec["paths"]) == {"/api/contexts", "/api/contexts/{name}", "/api/health", "/api/search", "/api/items/{id}",
                                  "/api/thumb/{id}", "/indices-list", "/knn-service", "/metadata"}
    search = spec["paths"]["/api/search"]["post"]
    body = search["requestBody"]["content"]
    assert set(body) == {"application/json", "multipart/form-data"}
    fields = body["application/json"]["schema"]["properties"]
    assert fields["k"]["minimum"] == 1 and fields["k"]["maximum"] == 1000 and fields["k"]["description"]
    assert fields["tau"]["anyOf"][0]["minimum"] == 1e-4 and fields["text"]["anyOf"][0]["maxLength"] == 1000
    assert body["application/json"]["schema"]["additionalProperties"] is False
    assert all(f.get("description") for f in fields.values())
    assert body["multipart/form-data"]["schema"]["properties"]["image"]["format"] == "binary"
    assert search["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/SearchResponse")
    schemas = spec["components"]["schemas"]
    assert {"SearchResponse", "Hit", "Why", "Item", "Contexts", "Health", "KnnHit", "MetadataEntry",
            "ErrorBody"} <= set(schemas)
    assert "HTTPValidationError" not in schemas  # errors have the service's own shape
    for path in spec["paths"].values():
        for op in path.values():
            assert op["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    knn = spec["paths"]["/knn-service"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"indice_name", "num_images", "text", "image", "embedding_input"} <= set(knn["properties"])
    meta = spec["paths"]["/metadata"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert meta["required"] == ["ids"] and meta["properties"]["ids"]["description"]


def test_docs_are_served_from_the_package(client):
    page = client.get("/docs")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "http://" not in page.text and "https://" not in page.text and "<script>" not in page.text
    assert "script-src 'self';" in page.headers["content-security-policy"]  # no inline script, no CDN
    srcs = [part.split('"', 1)[0] for part in page.text.split('src="')[1:] + page.text.split('href="')[1:]]
    for src in srcs:
        if src.startswith("/"):
            assert client.get(src).status_code == 200, src
    if importlib.util.find_spec("fastapi_offline"):
        assert "/docs/swagger-ui-bundle.js" in srcs
    missing = client.get("/docs/index.html")
    assert missing.status_code == 404 and missing.json()["field"] == "name"


def test_docs_title_is_escaped():
    from anchordiv.serve.app import docs_page

    page = docs_page('<script>alert("x")</script> & co', swagger=False).decode()
    assert "<script>alert" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co" in page
