"""The web page of ``anchordiv serve`` in Debian's Chromium, driven by Playwright.

The page starts at the service's default context, runs a query, the mixture slider moves
(by keyboard and by value), a result is clicked (a query by its id), and side-by-side mode
shows three contexts; every neighbour list on screen is compared with the API's answer for
the same context name. Set ``ANCHORDIV_SCREENSHOT=PATH``
to keep a screenshot of the side-by-side view.
"""

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
httpx = pytest.importorskip("httpx")
sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                                         "(make setup installs it: apt-get install chromium)")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
QUERY = "a husky in a raincoat on a sandy beach"

from anchordiv.serve import ServerThread, Service, create_app  # noqa: E402


@pytest.fixture(scope="module")
def server():
    from anchordiv.apps.serve_demo import demo_service

    try:
        svc = demo_service(360, 0, "minilm")
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"the minilm encoder is not available: {exc}")
    with ServerThread(create_app(svc)) as s:
        yield s


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    pg = browser.new_page(viewport={"width": 1500, "height": 1100})
    pg.requests = []
    pg.on("request", lambda r: pg.requests.append(r.url))
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.goto(server.url + "/")
    pg.wait_for_selector("body[data-ready=true]")
    yield pg
    assert not pg.errors
    assert all(u.startswith(server.url + "/") for u in pg.requests), pg.requests  # nothing leaves the server
    pg.close()


def api(server, body):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        resp = c.post("/api/search", json=body)
        assert resp.status_code == 200, resp.text
        return resp.json()


def wait_ready(pg, n_columns=1):
    pg.wait_for_function(
        "n => { const r = document.getElementById('results');"
        " return r.dataset.state === 'ready' && r.querySelectorAll('.column[data-state=ready]').length === n; }",
        arg=n_columns)


def shown(pg):
    """Per column: its context name and the ids and texts of its cards, as on screen."""
    return pg.eval_on_selector_all(".column", """cols => cols.map(c => ({
        context: c.dataset.context, title: c.querySelector('h2').textContent,
        ids: [...c.querySelectorAll('.card')].map(b => b.dataset.id),
        texts: [...c.querySelectorAll('.card .text')].map(p => p.textContent),
        why: (c.querySelector('.why') || {}).textContent || ''}))""")


def query_of(pg):
    """The query fields the page sends, e.g. {"text": ...} or {"id": ...}."""
    return json.loads(pg.get_attribute("#query-text", "data-query"))


def check_against_api(server, column, query, k=12):
    data = api(server, {**query, "context": column["context"], "k": k})
    assert data["context"]["name"] == column["context"] == column["title"]
    assert column["ids"] == [str(h["id"]) for h in data["results"]]
    assert column["texts"] == [h["text"] for h in data["results"]]
    return data


def test_page_starts_at_the_default_context(page, server):
    with httpx.Client(base_url=server.url) as c:
        default = c.get("/api/contexts").json()["default"]
        assert c.get("/indices-list").json()[0] == default["name"] == "softmax:breeds"
        no_context = c.post("/api/search", json={"text": QUERY, "k": 12}).json()
    page.fill("#q", QUERY)
    page.press("#q", "Enter")
    wait_ready(page)
    col = shown(page)[0]
    assert col["context"] == default["name"] == no_context["context"]["name"]
    assert col["ids"] == [str(h["id"]) for h in no_context["results"]]
    assert page.text_content("#mix-out") == "breeds 1 · places 0"  # the slider starts at breeds alone


def test_controls_are_labelled_and_keyboard_reachable(page):
    unlabelled = page.eval_on_selector_all(
        "input, select", "els => els.filter(e => !e.labels || e.labels.length === 0).map(e => e.id)")
    assert unlabelled == []
    assert page.get_attribute("#mix", "type") == "range"
    page.focus("#q")
    page.keyboard.type("a corgi")
    page.keyboard.press("Enter")
    wait_ready(page)
    page.focus(".card")  # result cards are buttons: Enter makes one the query, by its id
    first = shown(page)[0]["ids"][0]
    page.keyboard.press("Enter")
    page.wait_for_function("id => document.getElementById('query-text').textContent.includes('item ' + id)",
                           arg=first)
    wait_ready(page)
    assert query_of(page) == {"id": int(first)} and first not in shown(page)[0]["ids"]


def test_query_and_mixture_slider_match_the_api(page, server):
    page.select_option("#model", "softmax")
    page.select_option("#set-a", "breeds")
    page.select_option("#set-b", "places")
    page.fill("#mix", "0.5")
    page.fill("#q", QUERY)
    page.click("#search-button")
    wait_ready(page)
    col = shown(page)[0]
    assert col["context"] == "softmax:breeds:0.5,places:0.5"
    data = check_against_api(server, col, {"text": QUERY})
    assert "Why:" in col["why"] and data["why"][0]["anchor"] in col["why"]
    seen = {0.5: col["ids"]}
    # keyboard: two steps left on the slider (0.05 each) give p = 0.4
    page.focus("#mix")
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("document.querySelector('.column').dataset.context === 'softmax:breeds:0.4,places:0.6'")
    wait_ready(page)
    assert page.text_content("#mix-out") == "breeds 0.4 · places 0.6"
    col = shown(page)[0]
    check_against_api(server, col, {"text": QUERY})
    for p, context in ((1, "softmax:breeds"), (0, "softmax:places"), (0.8, "softmax:breeds:0.8,places:0.2")):
        page.fill("#mix", str(p))
        page.wait_for_function("c => document.querySelector('.column').dataset.context === c", arg=context)
        wait_ready(page)
        col = shown(page)[0]
        check_against_api(server, col, {"text": QUERY})
        seen[p] = col["ids"]
    assert seen[1] != seen[0] and seen[0.5] != seen[1] and seen[0.5] != seen[0]
    # breeds alone: every neighbour is a husky; places alone: every neighbour is on a beach
    meta = {h["id"]: h["labels"] for h in api(server, {"text": QUERY, "context": "breeds", "k": 12})["results"]}
    assert {meta[int(i)]["breed"] for i in seen[1]} == {"husky"}
    beach = api(server, {"text": QUERY, "context": "places", "k": 12})["results"]
    assert {h["labels"]["place"] for h in beach} == {"beach"} and [str(h["id"]) for h in beach] == seen[0]


def test_side_by_side_columns_differ_and_match_the_api(page, server):
    page.fill("#q", QUERY)
    page.press("#q", "Enter")
    wait_ready(page)
    page.check("#side")
    wait_ready(page, 3)
    cols = shown(page)
    assert [c["context"] for c in cols] == ["softmax:breeds", "softmax:places", "softmax:clothing"]
    for c in cols:
        check_against_api(server, c, {"text": QUERY})
    assert len({tuple(c["ids"]) for c in cols}) == 3
    assert len(set(cols[0]["ids"]) & set(cols[1]["ids"])) < 6
    # chips: under breeds every card is a husky, and the query's own labels are highlighted for a row query
    page.click(".column[data-context='softmax:clothing'] .card")
    wait_ready(page, 3)
    chips = page.eval_on_selector_all(".column[data-context='softmax:clothing'] .chip.match", "els => els.length")
    assert chips >= 12  # every neighbour shares the query's clothing
    page.select_option("#col-1", "cosine")
    wait_ready(page, 3)
    cols = shown(page)
    assert cols[1]["context"] == "cosine"
    query = query_of(page)
    assert list(query) == ["id"]
    for c in cols:
        check_against_api(server, c, query)
    target = os.environ.get("ANCHORDIV_SCREENSHOT")
    if target:
        page.screenshot(path=target, full_page=True)


class _TextStub:
    name, tau, has_images, dim = "stub", 0.05, False, 8

    def encode_text(self, texts):
        out = []
        for t in texts:
            v = np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=8)
            out.append((v / np.linalg.norm(v)).astype(np.float32))
        return np.stack(out)


def test_strings_from_data_are_shown_as_text(browser):
    """Captions, labels and anchor phrases with markup reach the page as text, never as HTML."""
    import pandas as pd

    import anchordiv as ad
    from anchordiv.anchorsfile import EmbeddedAnchors
    from anchordiv.io import Collection

    evil = '<img src=x onerror="window.__pwned=1">'
    enc = _TextStub()
    texts = [f"{evil} item {i}" if i % 2 else f"<b>bold</b> item {i}" for i in range(20)]
    X = enc.encode_text(texts)
    meta = pd.DataFrame({"id": [f"<b>{i}</b>" for i in range(20)], "caption": texts,
                         "label": [evil if i % 3 else "<i>x</i>" for i in range(20)]})
    sets = {"evil": ad.AnchorSet(enc.encode_text(["a", "b"]), texts=[evil, "<script>window.__pwned=2</script>"])}
    svc = Service(Collection(X, metadata=meta, kind="text", tau=0.05, encoder="stub", path="<coll>"),
                  EmbeddedAnchors(path=Path("a.yaml"), sets=sets, mix={"evil": 1.0},
                                  encoder="stub", tau=0.05), enc, title=f"{evil} title")
    with ServerThread(create_app(svc)) as s:
        pg = browser.new_page()
        pg.goto(s.url + "/")
        pg.wait_for_selector("body[data-ready=true]")
        pg.fill("#q", evil)
        pg.press("#q", "Enter")
        wait_ready(pg)
        texts_shown = shown(pg)[0]["texts"]
        assert len(texts_shown) == 12 and all(t in texts for t in texts_shown)
        assert pg.evaluate("window.__pwned") is None
        assert pg.eval_on_selector_all("img, b, i, script:not([src])", "els => els.length") == 0
        assert evil in pg.text_content("#title") and evil in pg.text_content(".why")
        assert "&lt;img src=x" in pg.inner_html("#results")  # escaped by textContent
        first = shown(pg)[0]["ids"][0]
        pg.click(".card")  # a query by a string id, which the page shows as text
        pg.wait_for_function("id => document.getElementById('query-text').textContent.includes('item ' + id)",
                             arg=first)
        wait_ready(pg)
        assert query_of(pg) == {"id": first} and first not in shown(pg)[0]["ids"]
        assert pg.evaluate("window.__pwned") is None
        assert pg.eval_on_selector_all("img, b, i, script:not([src])", "els => els.length") == 0
        pg.close()


def _stub_service():
    import anchordiv as ad
    from anchordiv.anchorsfile import EmbeddedAnchors
    from anchordiv.io import Collection

    enc = _TextStub()
    X = enc.encode_text([f"item {i}" for i in range(20)])
    sets = {"s": ad.AnchorSet(enc.encode_text(["a", "b", "c"]), texts=["a", "b", "c"])}
    return Service(Collection(X, kind="text", tau=0.05, encoder="stub", path="coll"),
                   EmbeddedAnchors(path=Path("a.yaml"), sets=sets, mix={"s": 1.0}, encoder="stub", tau=0.05), enc)


def test_a_page_on_another_origin_cannot_make_the_service_work(browser):
    """A page served on another loopback port posts a multipart form and a body with no Content-Type
    to the service: Chromium's requests are refused (403) and no context is built."""
    import http.server
    import threading

    svc = _stub_service()
    with ServerThread(create_app(svc)) as s:
        target = s.url + "/api/search"
        attack = f"""<!doctype html><title>attack</title>
<form id="f" method="post" action="{target}" enctype="multipart/form-data">
<input name="row" value="1"><input name="model" value="latent_gaussian"><input name="context" value="s">
<input name="tau" value="0.0371"></form>
<script>
fetch("{target}", {{method: "POST", mode: "no-cors",
                    body: new Blob([JSON.stringify({{row: 2, model: "gaussian", tau: 0.0372}})])}})
  .then(() => {{ document.title = "sent"; }}, () => {{ document.title = "failed"; }});
</script>""".encode()

        class Page(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(attack)))
                self.end_headers()
                self.wfile.write(attack)

            def log_message(self, *args):
                pass

        other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
        thread = threading.Thread(target=other.serve_forever, daemon=True)
        thread.start()
        seen = []
        try:
            pg = browser.new_page()
            pg.on("response", lambda r: seen.append((r.url, r.status)) if r.url == target else None)
            pg.goto(f"http://127.0.0.1:{other.server_address[1]}/")
            pg.wait_for_function("document.title !== 'attack'", timeout=10_000)
            with pg.expect_navigation(timeout=10_000) as nav:
                pg.evaluate("document.getElementById('f').submit()")
            assert nav.value.status == 403
            assert json.loads(pg.text_content("body"))["field"] == "origin"
            pg.close()
        finally:
            other.shutdown()
            other.server_close()
        assert (target, 403) in seen
        assert svc.contexts.stats()["misses"] == 0  # neither request built a context
        assert svc.context_key("latent_gaussian", "s", 0.0371) not in svc.contexts
        pg = browser.new_page()  # the service's own page still posts forms (multipart, same origin)
        pg.goto(s.url + "/")
        pg.wait_for_selector("body[data-ready=true]")
        status = pg.evaluate("""async () => { const f = new FormData(); f.append("row", "1");
            f.append("model", "latent_gaussian"); f.append("context", "s"); f.append("tau", "0.0371");
            return (await fetch("/api/search", {method: "POST", body: f})).status; }""")
        pg.close()
        assert status == 200 and svc.context_key("latent_gaussian", "s", 0.0371) in svc.contexts


@pytest.mark.parametrize("swagger", [True, False], ids=["swagger-ui", "plain"])
def test_docs_page_renders_offline(browser, swagger, monkeypatch):
    """``/docs`` renders the API from ``/openapi.json`` with no request outside the server, no error and
    no CSP violation: Swagger UI when its package is installed, else the plain page; the title is text."""
    from anchordiv.serve import app as app_module

    if swagger:
        pytest.importorskip("fastapi_offline")
    else:
        monkeypatch.setattr(app_module, "swagger_files", lambda: {})
    svc = _stub_service()
    svc.title = '<img src=x onerror="window.__pwned=1"> docs'
    with ServerThread(create_app(svc)) as s:
        pg = browser.new_page()
        requests, errors, console = [], [], []
        pg.on("request", lambda r: requests.append(r.url))
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
        pg.goto(s.url + "/docs")
        if swagger:
            pg.wait_for_selector(".opblock-summary-path", timeout=30_000)
            paths = pg.eval_on_selector_all(".opblock-summary-path", "els => els.map(e => e.textContent)")
            pg.click("#operations-search-search_api_search_post .opblock-summary")
            pg.wait_for_selector("#operations-search-search_api_search_post .opblock-body", timeout=10_000)
        else:
            pg.wait_for_selector("#openapi h2", timeout=30_000)
            paths = [h.split(" ", 1)[1] for h in pg.eval_on_selector_all("#openapi section h2",
                                                                         "els => els.map(e => e.textContent)")]
            assert '"maximum": 1000' in pg.text_content("#openapi")  # the request schemas are shown
        assert {"/api/search", "/api/contexts", "/knn-service", "/metadata", "/indices-list"} <= set(paths)
        assert svc.title in pg.title() and pg.evaluate("window.__pwned") is None
        assert not errors and not console, (errors, console)
        assert requests and all(u.startswith(s.url + "/") for u in requests), requests
        pg.close()


WRITTEN = ["a photo of a dog on a snowy mountain", "a photo of a dog in a busy city street",
           "a photo of a dog in a yellow raincoat"]


def contexts_api(server, method="GET", path="", **kw):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        return c.request(method, "/api/contexts" + path, **kw)


def make_written(pg, lines):
    """Write ``lines`` in the box and click Make context; the context name the page shows as ready."""
    pg.fill("#anchors-text", "\n".join(lines))
    with pg.expect_request(lambda r: r.url.endswith("/api/contexts") and r.method == "POST") as sent:
        pg.click("#make-context")
    pg.wait_for_selector("#write-status[data-state=ready]")
    return json.loads(sent.value.post_data), pg.text_content("#write-message").split()[1].rstrip(".,")


def test_written_anchors_make_a_context_beside_cosine_and_the_file_set(page, server):
    default = contexts_api(server).json()["default"]
    sent, name = make_written(page, [WRITTEN[0], "", "  ", WRITTEN[1], WRITTEN[2], ""])  # blank lines dropped
    assert sent == {"anchors": WRITTEN, "model": "softmax", "tau": default["tau"]}
    assert name.startswith("typed:") and page.get_attribute("#write-progress", "value") == "1"
    assert "Give a query" in page.text_content("#write-message")  # no query yet: nothing searched
    assert page.eval_on_selector_all(".column", "els => els.length") == 0
    status = contexts_api(server, path="/" + name).json()
    assert status["context"] == name and status["status"] == "ready"
    listed = {w["context"]: w for w in contexts_api(server).json()["written"]}
    assert listed[name]["anchors"] == WRITTEN and listed[name]["model"] == "softmax"
    page.fill("#q", QUERY)
    page.press("#q", "Enter")
    wait_ready(page, 3)
    cols = shown(page)
    assert [c["context"] for c in cols] == [name, "cosine", "softmax:breeds"]
    data = [check_against_api(server, c, {"text": QUERY}) for c in cols]
    assert data[0]["context"]["written"] == WRITTEN and data[0]["context"]["anchors"] == "typed"
    assert cols[0]["ids"] != cols[1]["ids"] and cols[0]["ids"] != cols[2]["ids"]
    top = data[0]["why"][0]["anchor"]
    assert top in WRITTEN and f"“{top}”" in cols[0]["why"]
    assert all(w in page.text_content(".column[data-column='0'] .written") for w in WRITTEN)
    assert page.is_checked("#side") and page.input_value("#col-0") == name
    assert "shown beside" in page.text_content("#write-message")
    assert "anchors=" in page.url
    page.click("#clear-written")  # the view before the context comes back; the URL drops the anchors
    wait_ready(page)
    assert [c["context"] for c in shown(page)] == ["softmax:breeds"] and not page.is_checked("#side")
    assert [page.input_value(f"#col-{i}") for i in range(3)] == ["softmax:breeds", "softmax:places", "softmax:clothing"]
    assert "anchors=" not in page.url and page.is_hidden("#clear-written")


def test_the_url_restores_the_written_context_and_the_query(page, server, browser):
    page.select_option("#model", "gaussian")
    page.fill("#tau", "0.07")
    page.dispatch_event("#tau", "change")
    page.fill("#k", "8")
    page.dispatch_event("#k", "change")
    sent, name = make_written(page, WRITTEN[:2])
    assert sent == {"anchors": WRITTEN[:2], "model": "gaussian", "tau": 0.07}
    page.fill("#q", QUERY)
    page.press("#q", "Enter")
    wait_ready(page, 3)
    page.click(".column[data-column='1'] .card")  # an item of cosine's column becomes the query
    page.wait_for_function("() => document.getElementById('query-text').dataset.query.includes('id')")
    wait_ready(page, 3)
    before, query = shown(page), query_of(page)
    assert [c["context"] for c in before] == [name, "cosine", "gaussian:breeds"]
    for c in before:
        check_against_api(server, c, query, k=8)
    url = page.url
    assert "anchors=" in url and f"id={query['id']}" in url and "model=gaussian" in url
    fresh = browser.new_page(viewport={"width": 1500, "height": 1100})
    errors = []
    fresh.on("pageerror", lambda e: errors.append(str(e)))
    fresh.goto(url)
    fresh.wait_for_selector("body[data-ready=true]")
    wait_ready(fresh, 3)
    assert shown(fresh) == before and query_of(fresh) == query
    assert fresh.input_value("#anchors-text") == "\n".join(WRITTEN[:2])
    assert (fresh.input_value("#model"), fresh.input_value("#tau"), fresh.input_value("#k")) == ("gaussian", "0.07", "8")
    assert fresh.get_attribute("#write-status", "data-state") == "ready" and fresh.url == url
    assert not errors
    fresh.close()


def test_invalid_url_parameters_are_ignored(page, server):
    page.goto(server.url + "/?model=nope&tau=-3&k=2.5&filter=%7B&a=zz&mix=7&side=1&cols=nope&cols=cosine"
              "&id=no-such-item&amodel=cosine")
    page.wait_for_selector("body[data-ready=true]")
    assert (page.input_value("#model"), page.input_value("#tau"), page.input_value("#k")) == ("softmax", "0.05", "12")
    assert (page.input_value("#filter"), page.input_value("#set-a"), page.input_value("#mix")) == ("", "breeds", "1")
    assert page.is_checked("#side") and page.input_value("#col-0") == "softmax:breeds"
    assert page.input_value("#col-1") == "cosine" and page.get_attribute("#clear-query", "hidden") is not None
    page.goto(server.url + "/?q=" + QUERY.replace(" ", "+") + "&k=5&side=0")
    page.wait_for_selector("body[data-ready=true]")
    wait_ready(page)
    col = shown(page)[0]
    check_against_api(server, col, {"text": QUERY}, k=5)
    assert query_of(page) == {"text": QUERY}


def test_an_anchor_too_long_shows_the_servers_error(page, server):
    lines = ["a photo of a dog", "x" * 301]
    expected = contexts_api(server, "POST", json={"anchors": lines})
    assert expected.status_code == 422
    page.fill("#anchors-text", "\n".join(lines))
    page.click("#make-context")
    page.wait_for_selector("#write-status[data-state=error]")
    assert page.text_content("#write-message") == expected.json()["error"]
    assert "300 characters" in expected.json()["error"]
    assert page.get_attribute("#anchors-text", "aria-invalid") == "true"
    assert page.get_attribute("#write-status", "aria-live") == "polite" and page.is_hidden("#write-progress")
    assert "anchors=" not in page.url and page.is_hidden("#clear-written")


def test_build_progress_is_polled_until_ready(page, server):
    """The page polls GET /api/contexts/NAME while the answer says building (here the POST's answer is
    replaced by a 202 at 40%) and shows the progress, then the context when it is ready."""
    polls = []

    def building(route):
        resp = route.fetch()
        body = {**resp.json(), "status": "building", "progress": 0.4}
        route.fulfill(status=202, json=body)

    page.route(server.url + "/api/contexts", lambda r: building(r) if r.request.method == "POST" else r.fallback())
    page.on("request", lambda r: polls.append(r.url) if "/api/contexts/typed" in r.url else None)
    page.evaluate("""() => { window.seen = []; new MutationObserver(() => window.seen.push(
        [document.getElementById('write-progress').value, document.getElementById('write-message').textContent]))
        .observe(document.getElementById('write-status'), {subtree: true, childList: true, characterData: true,
                                                            attributes: true}); }""")
    page.fill("#q", QUERY)
    page.press("#q", "Enter")
    wait_ready(page)
    _, name = make_written(page, WRITTEN[1:])
    wait_ready(page, 3)
    assert polls and all(u == f"{server.url}/api/contexts/{name.replace(':', '%3A')}" for u in polls)
    seen = page.evaluate("window.seen")
    assert [0.4, f"Building {name}: 40% of the collection"] in seen
    assert shown(page)[0]["context"] == name
