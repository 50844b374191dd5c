"""``anchordiv serve`` against hostile and careless clients, on a real uvicorn server on loopback.

Memory is charged by storage; idle and trickling connections are closed and one address
cannot take every slot; browsers on other origins cannot make the service work; every
handler error is a JSON 4xx, or a JSON 500 that says ``Connection: close``; any loopback
address can be bound; a duplicated id is an error. Sockets are raw where the point is
what a client sends byte by byte; every loop is bounded in count and time.
"""

import hashlib
import json
import os
import socket
import time
from pathlib import Path

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
from anchordiv.serve.cache import storage_nbytes, storages  # noqa: E402
from anchordiv.serve.server import ConnectionLimits  # noqa: E402
from anchordiv.serve.service import CONTEXT_OVERHEAD  # noqa: E402

N, DIM = 30, 8


class HashTextEncoder:
    """A deterministic text encoder: the sha256 of the UTF-8 text seeds a unit direction."""

    name, tau, has_images, dim = "hash", 0.05, False, DIM

    def encode_text(self, texts):
        out = []
        for t in texts:
            rng = np.random.default_rng(int(hashlib.sha256(t.encode("utf-8")).hexdigest()[:8], 16))
            x = rng.normal(size=DIM)
            out.append((x / np.linalg.norm(x)).astype(np.float32))
        return np.stack(out)


def _service(ids=None, dim=DIM, **kw):
    import pandas as pd

    rng = np.random.default_rng(3)
    X = rng.normal(size=(N, dim)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    meta = pd.DataFrame({"id": ids or list(range(1, N + 1)), "caption": [f"item {r}" for r in range(N)],
                         "label": [("odd", "even")[r % 2] for r in range(N)]})
    A = rng.normal(size=(11, dim)).astype(np.float32)
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    sets = {"left": ad.AnchorSet(A[:6], texts=[f"l{j}" for j in range(6)]),
            "right": ad.AnchorSet(A[6:], texts=[f"r{j}" for j in range(5)])}
    anchors = EmbeddedAnchors(path=Path("hostile.yaml"), sets=sets, mix={"left": 1.0, "right": 1.0}, encoder="hash",
                              tau=0.05)
    coll = Collection(X, metadata=meta, kind="text", tau=0.05, encoder="hash", path="hostile")
    return Service(coll, anchors, HashTextEncoder() if dim == DIM else None, **kw)


@pytest.fixture(scope="module")
def svc():
    return _service()


@pytest.fixture(scope="module")
def server(svc):
    with ServerThread(create_app(svc)) as s:
        yield s


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _clean_error(client, resp, status, field):
    """A JSON error naming ``field``; after it the same keep-alive client is served again."""
    assert resp.status_code == status, resp.text
    err = resp.json()
    assert err["field"] == field and err["error"].startswith(f"{field}: "), err
    if status >= 500:
        assert resp.headers.get("connection") == "close"
    assert client.get("/api/health").status_code == 200


# --------------------------------------------------------------------------- 1. memory by storage
def test_a_cached_latent_context_is_charged_its_real_storage():
    svc = _service(dim=64)
    for model in ("latent_gaussian", "latent_spherical"):
        key = svc.context_key(model, "left:0.5,right:0.5", 0.05, {"rank": 3})
        before = svc.contexts.stats()["bytes"]
        ctx = svc.context(key)
        comps = ctx.model.components_
        assert comps.shape == (3, 64)
        assert comps.untyped_storage().nbytes() == comps.numel() * comps.element_size()  # a compact copy
        anchors = ctx.info["anchors"]
        tensors = [anchors.embeddings, anchors.weights,
                   *(t for t in vars(ctx.model).values() if hasattr(t, "untyped_storage"))]
        real = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        shared = {key[-1] for key in storages(svc.rows, svc.anchors)}
        features = N * ctx.store.width * 4  # float32 features
        assert ctx.store.low is None and ctx.store.high.untyped_storage().nbytes() == features
        want = sum(n for p, n in real.items() if p not in shared) + features + CONTEXT_OVERHEAD
        assert svc.contexts.stats()["bytes"] - before == want


def test_a_view_is_charged_its_whole_buffer():
    import torch

    base = torch.zeros(384, 384, dtype=torch.float64)
    assert storage_nbytes(base[:, :7].T) == 384 * 384 * 8
    arr = np.zeros((384, 384))
    assert storage_nbytes(arr[:7], {"twice": arr[7:9]}) == arr.nbytes
    assert storage_nbytes(base[:7].clone()) == 7 * 384 * 8


# --------------------------------------------------------------------------- 2. slow-loris
def _closed_within(sock, seconds):
    """Seconds until the server closes ``sock`` (reading what it sends), or None after ``seconds``."""
    sock.settimeout(0.2)
    start = time.monotonic()
    got = b""
    while time.monotonic() - start < seconds:
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - start, got
        if not chunk:
            return time.monotonic() - start, got
        got += chunk
    return None, got


@pytest.fixture(scope="module")
def quick(svc):
    """A server whose headers must arrive within 1 s and bodies within 2 s; 8 connections per address."""
    limits = ConnectionLimits(header_timeout=1.0, body_timeout=2.0, per_client=8, max_connections=16)
    with ServerThread(create_app(svc), limits=limits) as s:
        yield s


def test_an_idle_connection_is_closed_after_the_header_timeout(quick):
    with socket.create_connection((quick.host, quick.port)) as sock:
        took, got = _closed_within(sock, 5)
    assert took is not None and 0.8 <= took <= 3, took
    assert got == b""  # nothing was asked, nothing is answered


def _trickle(sock, first, piece, interval, seconds):
    """Send ``first``, then ``piece`` every ``interval`` s for at most ``seconds``: (seconds until the
    server closed the socket or None, bytes it sent). Bytes sent after the server closed may reset the
    connection and lose its last answer, so only the closing time is certain."""
    sock.sendall(first)
    start = time.monotonic()
    got = b""
    while time.monotonic() - start < seconds:
        took, chunk = _closed_within(sock, interval)
        got += chunk
        if took is not None:
            return time.monotonic() - start, got
        try:
            sock.sendall(piece)
        except OSError:
            return time.monotonic() - start, got
    return None, got


HEAD = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
BODY = b"POST /api/search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"


def test_trickled_headers_are_cut_off(quick):
    with socket.create_connection((quick.host, quick.port)) as sock:  # a header line every 0.25 s, never the end
        took, got = _trickle(sock, HEAD, b"X-Slow: 1\r\n", 0.25, 6)
    assert took is not None and took <= 3, took
    assert got == b"" or got.startswith(b"HTTP/1.1 408")


def test_unfinished_headers_get_a_408_naming_the_timeout(quick):
    with socket.create_connection((quick.host, quick.port)) as sock:
        sock.sendall(HEAD)
        took, got = _closed_within(sock, 5)
    assert took is not None and 0.8 <= took <= 3, took
    assert got.startswith(b"HTTP/1.1 408") and b"connection: close" in got.lower()
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"] == \
        "the request line and headers did not arrive within 1 s"


def test_a_trickled_body_is_cut_off(quick):
    with socket.create_connection((quick.host, quick.port)) as sock:  # a byte every 0.2 s: 1000 need 200 s
        took, got = _trickle(sock, BODY, b" ", 0.2, 8)
    assert took is not None and took <= 4, took
    assert got == b"" or got.startswith(b"HTTP/1.1 408")
    with socket.create_connection((quick.host, quick.port)) as sock:
        sock.sendall(BODY)
        took, got = _closed_within(sock, 5)
    assert took is not None and 1.8 <= took <= 4, took
    assert got.startswith(b"HTTP/1.1 408") and b"the body did not arrive within 2 s" in got


def test_one_address_cannot_take_every_slot(quick):
    """Far more idle sockets from one address than its cap: a normal client is still answered, and the
    server holds no more than the cap of them."""
    socks = []
    try:
        for _ in range(40):
            socks.append(socket.create_connection((quick.host, quick.port)))
        time.sleep(0.2)
        with httpx.Client(base_url=quick.url, timeout=10) as c:
            for _ in range(3):
                assert c.post("/api/search", json={"row": 1, "model": "cosine", "k": 2}).status_code == 200
        open_ = 0
        for s in socks:
            took, _ = _closed_within(s, 0.01)
            open_ += took is None
        assert open_ <= 8
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------- 3. cross-site
def test_cross_site_requests_are_refused(svc, server, client):
    before = svc.contexts.stats()["misses"]
    body = {"row": 2, "model": "gaussian", "context": "left:0.3,right:0.7", "tau": 0.0421}
    cases = [
        ({"Origin": "http://evil.example"}, "json"),
        ({"Origin": "http://127.0.0.1:1"}, "json"),  # another port is another origin
        ({"Origin": "null"}, "json"),
        ({"Sec-Fetch-Site": "cross-site"}, "json"),
        ({"Sec-Fetch-Site": "same-site"}, "json"),
        ({"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}, "multipart"),
        ({"Origin": "http://evil.example"}, "none"),
    ]
    for headers, kind in cases:
        if kind == "json":
            resp = client.post("/api/search", json=body, headers=headers)
        elif kind == "multipart":
            resp = client.post("/api/search", data={k: str(v) for k, v in body.items()},
                               files={"x": ("x.txt", b"x", "text/plain")}, headers=headers)
        else:
            resp = client.post("/api/search", content=json.dumps(body).encode(), headers=headers)
        _clean_error(client, resp, 403, "origin")
        assert "--cors-origin" in resp.json()["error"]
    for url, payload in (("/knn-service", {"text": "x", "indice_name": "cosine"}), ("/metadata", {"ids": [1]})):
        resp = client.post(url, content=json.dumps(payload), headers={"Origin": "http://evil.example"})
        _clean_error(client, resp, 403, "origin")
    assert svc.contexts.stats()["misses"] == before  # nothing was built


def test_same_origin_and_non_browser_clients_are_served(server, client):
    own = {"Origin": server.url, "Sec-Fetch-Site": "same-origin"}
    ok = client.post("/api/search", json={"row": 2, "model": "cosine", "k": 3}, headers=own)
    assert ok.status_code == 200, ok.text
    form = client.post("/api/search", data={"row": "2", "model": "cosine", "k": "3"},
                       files={"unused": ("a.txt", b"a", "text/plain")}, headers=own)
    assert form.status_code == 422 and form.json()["field"] == "unused"  # reached the handler
    assert client.post("/api/search", json={"row": 2, "model": "cosine"},
                       headers={"Sec-Fetch-Site": "none"}).status_code == 200  # typed by the user
    # clip-retrieval's ClipClient: data=json.dumps(...), no Content-Type, no Origin
    raw = json.dumps({"text": "a thing", "indice_name": "cosine", "num_images": 3, "deduplicate": True,
                      "use_safety_model": True, "use_violence_detector": True, "image": None, "image_url": None,
                      "embedding_input": None, "use_mclip": False, "aesthetic_score": 9, "aesthetic_weight": 0.5,
                      "modality": "image", "num_result_ids": 3})
    resp = client.post("/knn-service", content=raw)
    assert resp.status_code == 200 and len(resp.json()) == 3
    assert client.post("/metadata", content=json.dumps({"ids": [1, 2]})).status_code == 200
    # /api/search wants JSON: no Content-Type, text/plain and urlencoded forms are refused
    for headers in ({}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}):
        resp = client.post("/api/search", content=b'{"row": 2}', headers=headers)
        _clean_error(client, resp, 415, "body")


def test_a_configured_cors_origin_is_served(svc):
    front = "http://front.example:8080"
    with ServerThread(create_app(svc, cors_origins=[front])) as s, httpx.Client(base_url=s.url) as c:
        resp = c.post("/knn-service", content=json.dumps({"text": "x", "indice_name": "cosine", "num_images": 2}),
                      headers={"Origin": front, "Sec-Fetch-Site": "cross-site"})
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == front
        assert c.post("/api/search", json={"row": 1, "model": "cosine"},
                      headers={"Origin": "http://other.example"}).status_code == 403


# --------------------------------------------------------------------------- 4. every handler error
def test_a_lone_surrogate_is_a_422_naming_the_field(client):
    post = client.post
    raw = {"Content-Type": "application/json"}
    _clean_error(client, post("/api/search", content=b'{"text": "a \\ud800 b", "model": "cosine"}', headers=raw),
                 422, "text")
    _clean_error(client, post("/api/search", content=b'{"row": 1, "filter": {"label": ["\\udfff"]}}', headers=raw),
                 422, "filter.label[0]")
    _clean_error(client, post("/knn-service", content=b'{"text": "\\ud83d", "indice_name": "cosine"}'), 422, "text")
    _clean_error(client, post("/metadata", content=b'{"ids": ["\\ud800"]}'), 422, "ids[0]")


def test_deeply_nested_json_is_a_400(client):
    deep = b'{"row": 1, "filter": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    _clean_error(client, client.post("/api/search", content=deep, headers={"Content-Type": "application/json"}),
                 400, "body")
    _clean_error(client, client.post("/knn-service", content=b"[" * 50_000), 400, "body")
    form = client.post("/api/search", files={"row": (None, "1"), "filter": (None, "[" * 5000 + "]" * 5000)})
    _clean_error(client, form, 422, "filter")


def test_proportions_are_normalised_without_overflow(client):
    huge = client.post("/api/search", json={"row": 1, "context": "softmax:left:1e308,right:1e308", "k": 5})
    even = client.post("/api/search", json={"row": 1, "context": "softmax:left:1,right:1", "k": 5})
    assert huge.status_code == 200, huge.text
    assert huge.json()["context"]["name"] == even.json()["context"]["name"] == "softmax:left:0.5,right:0.5"
    assert [h["id"] for h in huge.json()["results"]] == [h["id"] for h in even.json()["results"]]
    tiny = client.post("/api/search", json={"row": 1, "context": "softmax:left:1,right:1e-9", "k": 5})
    assert tiny.status_code == 200 and tiny.json()["context"]["name"] == "softmax:left"  # no ",right:0"
    for context in ("softmax:left:inf,right:1", "softmax:left:nan", "softmax:left:1e309"):
        _clean_error(client, client.post("/api/search", json={"row": 1, "context": context}), 422, "context")


@pytest.mark.parametrize("scale", [1e-45, 1e-30, 1e-13, 1e13, 1e20, 1e39])
@pytest.mark.parametrize("model", ["cosine", "latent_spherical"])
def test_an_embedding_of_extreme_norm_is_a_422(client, scale, model):
    q = [scale] + [0.0] * (DIM - 1)
    body = {"embedding": q, "model": model}
    if model != "cosine":
        body["context"] = "left"
    _clean_error(client, client.post("/api/search", json=body), 422, "embedding")
    resp = client.post("/knn-service", content=json.dumps({"embedding_input": q, "indice_name": "cosine"}))
    _clean_error(client, resp, 422, "embedding_input")


def test_a_chunked_body_over_the_limit_is_a_413_that_closes(client):
    def chunks(n, piece=b" " * 65536):
        for _ in range(n):
            yield piece

    resp = client.post("/api/search", content=chunks(40), headers={"Content-Type": "application/json"})
    _clean_error(client, resp, 413, "body")
    assert resp.headers.get("connection") == "close"
    boundary = b"b0undary"
    head = (b"--" + boundary + b'\r\nContent-Disposition: form-data; name="image"; filename="x.png"\r\n'
            b"Content-Type: image/png\r\n\r\n")

    def upload():
        yield head
        yield from chunks(180)  # 11.25 MiB, over the 10 MiB image limit

    resp = client.post("/api/search", content=upload(),
                       headers={"Content-Type": f"multipart/form-data; boundary={boundary.decode()}"})
    _clean_error(client, resp, 413, "image")


def test_an_unexpected_error_is_a_json_500_with_connection_close(svc):
    class Broken(type(svc)):
        def indices_list(self):
            raise RuntimeError("a bug")

    broken = _service()
    broken.__class__ = Broken
    with ServerThread(create_app(broken)) as s, httpx.Client(base_url=s.url, timeout=10) as c:
        resp = c.get("/indices-list")
        assert resp.status_code == 500 and resp.headers["connection"] == "close"
        assert resp.json() == {"error": "internal error (RuntimeError); the request was not completed",
                               "field": None}
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert c.get("/api/health").status_code == 200  # the keep-alive client reconnects


# --------------------------------------------------------------------------- 5. loopback addresses
def _ipv6_loopback():
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["127.0.0.2", "::1"])
def test_any_loopback_address_can_be_bound(svc, host):
    if host == "::1" and not _ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback (::1 cannot be bound)")
    with ServerThread(create_app(svc), host=host) as s, httpx.Client(base_url=s.url, timeout=10) as c:
        assert c.get("/api/health").status_code == 200, c.get("/api/health").text
        assert c.post("/api/search", json={"row": 1, "model": "cosine"}).status_code == 200
        assert c.get("/", headers={"Host": f"localhost:{s.port}"}).status_code == 200
        resp = c.get("/api/health", headers={"Host": f"evil.example:{s.port}"})
        assert resp.status_code == 400 and resp.json()["field"] == "host"  # DNS rebinding


# --------------------------------------------------------------------------- 15. duplicated ids
def test_a_duplicated_id_is_an_error_everywhere():
    dup = _service(ids=[1, 2, 2] + list(range(4, N + 1)))
    with ServerThread(create_app(dup)) as s, httpx.Client(base_url=s.url, timeout=10) as c:
        for resp, field in ((c.post("/api/search", json={"id": 2, "model": "cosine"}), "id"),
                            (c.post("/api/search", json={"id": "2", "model": "cosine"}), "id"),
                            (c.get("/api/items/2"), "id"),
                            (c.post("/metadata", content=json.dumps({"ids": [1, 2]})), "ids")):
            _clean_error(c, resp, 422, field)
            assert "appears 2 times" in resp.json()["error"] and "rows [1, 2]" in resp.json()["error"]
        assert c.post("/api/search", json={"row": 2, "model": "cosine", "k": 1}).json()["query"]["id"] == 2
        assert c.post("/api/search", json={"id": 1, "model": "cosine", "k": 1}).status_code == 200
