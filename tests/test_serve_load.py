"""Load test of ``anchordiv serve`` on the demo collection: 200 requests from 20 concurrent clients.

Loopback only, bounded in count (200) and time (a 30 s timeout per request, 120 s in all).
Requests mix text and row queries, geometries and mixture proportions (the slider), so
contexts are built while others are searched. Asserts 0 errors and that every answer
equals the sequential answer to the same request; prints p50 and p99 latency.
"""

import json
import os
import statistics
import threading
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
httpx = pytest.importorskip("httpx")

from anchordiv.serve import ServerThread, create_app  # noqa: E402

CLIENTS, PER_CLIENT = 20, 10
TEXTS = ["a husky on the beach", "a corgi wearing boots", "a poodle in the city", "a pug napping in the kitchen",
         "a beagle in a sweater", "a dalmatian in the forest"]


def requests_for(client: int) -> list[dict]:
    out = []
    for j in range(PER_CLIENT):
        n = client * PER_CLIENT + j
        p = round((n % 11) / 10, 1)
        body = {"model": ("softmax", "gaussian", "cosine", "iti")[n % 4], "k": 10,
                "context": f"breeds:{p},places:{round(1 - p, 1)}" if p not in (0, 1) else ("breeds", "places")[p == 0]}
        if body["model"] == "cosine":
            body.pop("context")
        body.update({"text": TEXTS[n % len(TEXTS)]} if n % 3 else {"row": (7 * n) % 360})
        out.append(body)
    return out


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def test_200_requests_from_20_clients(capsys):
    from anchordiv.apps.serve_demo import demo_service

    try:
        svc = demo_service(360, 0, "minilm")
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"the minilm encoder is not available: {exc}")
    latencies, errors, answers = [], [], {}
    lock = threading.Lock()
    with ServerThread(create_app(svc)) as server:
        assert server.host == "127.0.0.1"
        start = threading.Barrier(CLIENTS)

        def client(i):
            with httpx.Client(base_url=server.url, timeout=30) as c:
                start.wait()
                for body in requests_for(i):
                    t = time.perf_counter()
                    try:
                        resp = c.post("/api/search", json=body)
                        ok = resp.status_code == 200 and len(resp.json()["results"]) == 10
                    except Exception as exc:  # a timeout or a dropped connection counts as an error
                        ok, resp = False, exc
                    with lock:
                        latencies.append(time.perf_counter() - t)
                        if ok:
                            answers.setdefault(json.dumps(body, sort_keys=True), []).append(
                                [h["id"] for h in resp.json()["results"]])
                        else:
                            errors.append((body, getattr(resp, "text", repr(resp))))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        wall = time.perf_counter() - t0
        assert not any(t.is_alive() for t in threads), "the load test did not finish in 120 s"
        with httpx.Client(base_url=server.url, timeout=30) as c:  # the same requests, one at a time
            for key, got in answers.items():
                body = json.loads(key)
                want = [h["id"] for h in c.post("/api/search", json=body).json()["results"]]
                assert all(g == want for g in got), body
    assert len(latencies) == CLIENTS * PER_CLIENT
    assert errors == []
    p50, p99 = percentile(latencies, 50) * 1000, percentile(latencies, 99) * 1000
    with capsys.disabled():
        print(f"\nload test: {len(latencies)} requests, {CLIENTS} clients, {len(errors)} errors, "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, mean {statistics.mean(latencies) * 1000:.1f} ms, "
              f"{len(latencies) / wall:.0f} requests/s, wall {wall:.1f} s")
    assert wall < 120


# --------------------------------------------------------------------------- memory under distinct contexts
def _rss() -> int:
    """Resident set size of this process in bytes (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _latent_service(cache_bytes, n=200, dim=192, n_anchors=30):
    import numpy as np

    import anchordiv as ad
    from anchordiv.anchorsfile import EmbeddedAnchors
    from anchordiv.io import Collection
    from anchordiv.serve import Service

    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, dim)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    A = rng.normal(size=(n_anchors, dim)).astype(np.float32)
    A /= np.linalg.norm(A, axis=1, keepdims=True)
    sets = {"a": ad.AnchorSet(A[: n_anchors // 2]), "b": ad.AnchorSet(A[n_anchors // 2:])}
    anchors = EmbeddedAnchors(path=None, sets=sets, mix={"a": 1.0, "b": 1.0}, encoder="none", tau=0.05)
    return Service(Collection(X, kind="text", tau=0.05, encoder="none"), anchors, cache_bytes=cache_bytes)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads the resident set size from /proc (Linux)")
def test_memory_stays_within_the_cache_bound_over_2000_contexts(capsys):
    """2,000 distinct latent contexts (distinct τ, two geometries, one set or a mixture) in one process:
    the resident set grows by at most the cache bound + 10 % + 64 MiB."""
    bound = 16 << 20
    svc = _latent_service(bound)
    for i in range(8):  # warm up every code path (imports, allocator pools) before the baseline
        svc.context(svc.context_key(("latent_gaussian", "latent_spherical")[i % 2], ("a", "a:0.5,b:0.5")[i // 4],
                                    0.5 + i, {"rank": 7}))
    base = peak = _rss()
    t0 = time.perf_counter()
    for i in range(2000):
        model = ("latent_gaussian", "latent_spherical")[i % 2]
        context = "a" if i % 4 < 2 else "a:0.5,b:0.5"
        svc.context(svc.context_key(model, context, 0.01 + i * 1e-5, {"rank": 7}))
        if i % 50 == 0:
            peak = max(peak, _rss())
            assert svc.contexts.stats()["bytes"] <= bound
    peak = max(peak, _rss())
    stats = svc.contexts.stats()
    grown = peak - base
    with capsys.disabled():
        print(f"\n2000 contexts in {time.perf_counter() - t0:.1f} s: RSS +{grown / 2**20:.1f} MiB (allowed "
              f"{(bound * 1.1 + (64 << 20)) / 2**20:.1f}), cache {stats['bytes'] / 2**20:.1f} MiB of "
              f"{bound / 2**20:.0f}, {stats['entries']} entries, {stats['evictions']} evictions")
    assert stats["misses"] == 2008 and stats["bytes"] <= bound
    assert grown <= bound * 1.1 + (64 << 20)


# --------------------------------------------------------------------------- idle sockets, cross-origin posts
def test_300_idle_sockets_do_not_lock_out_a_normal_client(capsys):
    """300 sockets from one address that never send a byte: a normal client on the same address is answered."""
    import socket

    svc = _latent_service(64 << 20, n=200, dim=32)
    with ServerThread(create_app(svc)) as server:
        socks = []
        try:
            t0 = time.perf_counter()
            for _ in range(300):
                socks.append(socket.create_connection((server.host, server.port), timeout=5))
            opened = time.perf_counter() - t0
            times = []
            with httpx.Client(base_url=server.url, timeout=10) as c:
                for i in range(5):
                    t = time.perf_counter()
                    resp = c.post("/api/search", json={"row": i, "model": "cosine", "k": 5})
                    times.append(time.perf_counter() - t)
                    assert resp.status_code == 200, resp.text
                    assert len(resp.json()["results"]) == 5
            still_open = 0
            for s in socks:
                s.settimeout(0.01)
                try:
                    still_open += s.recv(1) != b""
                except TimeoutError:
                    still_open += 1
                except OSError:
                    pass
        finally:
            for s in socks:
                s.close()
    with capsys.disabled():
        print(f"\n300 idle sockets opened in {opened:.2f} s; {still_open} left open by the server; normal requests "
              f"answered in max {max(times) * 1000:.1f} ms (p50 {percentile(times, 50) * 1000:.1f} ms)")
    assert still_open <= 32  # the per-address cap


def test_cross_origin_form_posts_are_refused_and_build_nothing():
    """40 form posts, each naming a new context, from a page on another origin: all 403, no context built."""
    svc = _latent_service(64 << 20, n=200, dim=32)
    with ServerThread(create_app(svc)) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        before = svc.contexts.stats()["misses"]
        for i in range(40):
            form = {"row": "1", "model": "latent_gaussian", "context": "a", "tau": str(0.01 + i * 1e-3)}
            for headers in ({"Origin": "http://127.0.0.1:9", "Sec-Fetch-Site": "same-site"},
                            {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"}):
                resp = c.post("/api/search", files={k: (None, v) for k, v in form.items()}, headers=headers)
                assert resp.status_code == 403 and resp.json()["field"] == "origin"
        assert svc.contexts.stats()["misses"] == before
        own = c.post("/api/search", files={k: (None, v) for k, v in form.items()},
                     headers={"Origin": server.url, "Sec-Fetch-Site": "same-origin"})
        assert own.status_code == 200 and svc.contexts.stats()["misses"] == before + 1
