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
    from anchordiv.serve.demo import demo_service

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
