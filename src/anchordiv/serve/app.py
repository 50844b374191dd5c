"""The FastAPI app of ``anchordiv serve``: the JSON API, clip-retrieval's endpoints and the page.

Endpoints
---------
``GET /``                      the web page (static files shipped in the package)
``GET /api/contexts``          anchor sets, geometries, the default context, context names, collection info
``POST /api/search``           neighbours of a query under a context (JSON, or multipart with ``image``)
``GET /api/items/{id}``        one item by id (the ``id`` column's value)
``GET /api/thumb/{id}``        JPEG thumbnail of the item's own image file
``GET /api/health``            ``{"status": "ok", "cache": {...}}``
``GET /indices-list``          clip-retrieval: context names, the default first
``POST /knn-service``          clip-retrieval: ``[{"id", "similarity", **metadata}]``
``POST /metadata``             clip-retrieval: ``[{"id", "metadata"}]``

Errors are JSON ``{"error": "FIELD: message", "field": "FIELD"}`` with a 4xx status; an
unexpected failure is a JSON 500 with ``Connection: close``. A POST from a page on another
origin is refused (403, ``field: "origin"``) unless ``cors_origins`` lists it; clients that are
not browsers (no ``Origin``) are served. ``/api/search`` takes ``application/json`` or, for an
image, ``multipart/form-data``. Urls in answers are absolute, under the request's base url.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import validate as v
from .server import is_loopback
from .service import Service
from .validate import FieldError

#: Static files of the page, by URL name (nothing else is ever served from disk).
STATIC = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
#: Sent with every response.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                               "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}
#: Host names accepted on a loopback bind besides loopback IP literals (a guard against DNS rebinding).
LOOPBACK_HOSTS = ["localhost"]
#: Methods that never change state nor start a costly computation here.
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


class TooLarge(Exception):
    """A request body over the limit, noticed while it streams in."""

    def __init__(self, limit: int, field: str):
        super().__init__(f"{field}: the request body is larger than {limit} bytes")
        self.limit, self.field = limit, field


async def _send_json(send: Any, status: int, payload: dict, close: bool = False) -> None:
    headers = {**SECURITY_HEADERS, **({"Connection": "close"} if close else {})}
    response = JSONResponse(payload, status_code=status, headers=headers)
    await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def _header(scope: dict, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return ""


class SecurityHeaders:
    """ASGI middleware: add :data:`SECURITY_HEADERS` to every response that does not set them."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()
                         if k.lower().encode() not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)


def host_name(value: str) -> str:
    """The host of a ``Host`` header without its port: ``[::1]:8000`` → ``::1``, ``127.0.0.2:80`` → ``127.0.0.2``."""
    value = value.strip()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else ""
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class LoopbackHosts:
    """ASGI middleware: accept only a ``Host`` that is ``localhost``, a loopback IP literal or the bound
    address (a DNS-rebinding guard for a service bound to loopback)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            name = host_name(_header(scope, b"host")).lower()
            bound = (scope.get("server") or ("",))[0]
            if not (name in LOOPBACK_HOSTS or name == str(bound).lower() or (name and is_loopback(name))):
                return await _send_json(send, 400, FieldError(
                    "host", f"{v.show(name)} is not a loopback name; open the page as http://127.0.0.1:PORT/ or "
                            "http://localhost:PORT/", 400).payload(), close=True)
        await self.app(scope, receive, send)


class CrossSite:
    """ASGI middleware: refuse a state-changing or costly request (any method but GET, HEAD, OPTIONS)
    that a browser sent from another origin.

    A request passes when its ``Origin`` is the server's own or one of ``allowed`` (``--cors-origin``),
    or when it has neither ``Origin`` nor a cross-site ``Sec-Fetch-Site`` (a non-browser client such as
    clip-retrieval's ``ClipClient``).
    """

    def __init__(self, app: Any, allowed: list[str] | None = None):
        self.app, self.allowed = app, {o.rstrip("/").lower() for o in allowed or ()}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            origin = _header(scope, b"origin").strip().rstrip("/").lower()
            site = _header(scope, b"sec-fetch-site").strip().lower()
            own = f"{scope.get('scheme', 'http')}://{_header(scope, b'host').strip()}".lower()
            refused = None
            if origin and origin != own and origin not in self.allowed:
                refused = f"a page on {v.show(origin)} may not call this service"
            elif not origin and site not in ("", "same-origin", "none"):
                refused = f"a {site} page may not call this service"
            if refused:
                return await _send_json(send, 403, FieldError(
                    "origin", f"{refused}; start it with --cors-origin ORIGIN to allow a page on another origin",
                    403).payload(), close=True)
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: refuse bodies over the limit (10 MB + form overhead for uploads, 1 MB else),
    declared or streamed (chunked); the 413 closes the connection."""

    def __init__(self, app: Any, max_json: int = v.MAX_JSON_BYTES, max_upload: int = v.MAX_IMAGE_BYTES + (64 << 10)):
        self.app, self.max_json, self.max_upload = app, max_json, max_upload

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = _header(scope, b"content-type").lower().startswith("multipart/form-data")
        limit, field = (self.max_upload, "image") if upload else (self.max_json, "body")
        too_large = FieldError(field, f"the request body is larger than {limit} bytes", 413).payload()
        length = _header(scope, b"content-length").strip()
        if length and (not length.isdigit() or int(length) > limit):
            return await _send_json(send, 413, too_large, close=True)
        seen, started = 0, False

        async def limited() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise TooLarge(limit, field)
            return message

        async def watched(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, watched)
        except TooLarge:
            if started:
                raise
            await _send_json(send, 413, too_large, close=True)


def _base(request: Request) -> str:
    """The request's base url without the trailing slash, e.g. ``http://127.0.0.1:8000``."""
    return str(request.base_url).rstrip("/")


def _error(exc: FieldError) -> JSONResponse:
    return JSONResponse(exc.payload(), status_code=exc.status)


def _static(name: str) -> bytes:
    return resources.files("anchordiv.serve").joinpath("static", name).read_bytes()


def create_app(service: Service, *, loopback_only: bool = True, cors_origins: list[str] | None = None) -> FastAPI:
    """The HTTP app for ``service``.

    Parameters
    ----------
    service : Service
        What to search.
    loopback_only : bool
        Accept only requests whose Host is a loopback name (set when binding 127.0.0.1).
    cors_origins : list of str, optional
        Origins allowed to call the API from a browser (e.g. a clip-retrieval front end
        served elsewhere); none by default.
    """
    app = FastAPI(title="anchordiv", docs_url=None, redoc_url=None, openapi_url=None)
    page = {name: _static(name) for name in ("index.html", *STATIC)}

    app.add_middleware(BodyLimit)
    app.add_middleware(CrossSite, allowed=list(cors_origins or ()))
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type"])
    if loopback_only:
        app.add_middleware(LoopbackHosts)
    app.add_middleware(SecurityHeaders)

    @app.exception_handler(FieldError)
    async def field_error(request: Request, exc: FieldError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        field = getattr(exc, "field", None) or ("body" if exc.status_code == 400 else None)
        detail = str(exc.detail)
        return JSONResponse({"error": f"{field}: {detail}" if field and not detail.startswith(f"{field}:") else detail,
                             "field": field}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        # the server closes the connection after an unexpected error: say so, so a keep-alive client reconnects
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); the request was not completed",
                             "field": None}, status_code=500, headers={**SECURITY_HEADERS, "Connection": "close"})

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = (exc.errors() or [{}])[0]
        field = ".".join(str(x) for x in err.get("loc", ())[1:]) or None
        return JSONResponse({"error": f"{field}: {err.get('msg', 'invalid')}", "field": field}, status_code=422)

    async def _json(request: Request) -> dict:
        return v.parse_json_object(await request.body())

    # ------------------------------------------------------------------ page
    @app.get("/", include_in_schema=False)
    def index() -> Response:
        return Response(page["index.html"], media_type="text/html; charset=utf-8")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in STATIC:
            raise FieldError("name", f"no static file {name!r}", 404)
        return Response(page[name], media_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    # ------------------------------------------------------------ native API
    @app.get("/api/contexts")
    def contexts() -> dict:
        return service.info()

    @app.get("/api/health")
    def health() -> dict:
        return {"status": "ok", "cache": service.contexts.stats()}

    @app.post("/api/search")
    async def search(request: Request) -> dict:
        ctype = request.headers.get("content-type", "").lower()
        if ctype.startswith("multipart/form-data"):
            form = await request.form(max_files=1, max_fields=32)
            data: dict[str, Any] = {}
            image = None
            for key, value in form.multi_items():
                if key == "image" and hasattr(value, "read"):
                    image = await value.read(v.MAX_IMAGE_BYTES + 1)
                    if len(image) > v.MAX_IMAGE_BYTES:
                        raise FieldError("image", f"is larger than {v.MAX_IMAGE_BYTES} bytes", 413)
                elif isinstance(value, str):
                    data[key] = value
                else:
                    raise FieldError(key, "must be a plain form field")
            await form.close()
            return await run_in_threadpool(service.search, data, image, True, _base(request))
        if not ctype.startswith("application/json"):
            raise FieldError("body", "send JSON with Content-Type: application/json (or multipart/form-data "
                                     "to upload an image)", 415)
        data = await _json(request)
        if "image" in data:
            raise FieldError("image", "upload images as multipart/form-data")
        return await run_in_threadpool(service.search, data, None, False, _base(request))

    def _row(id: str) -> int:
        if len(id) > v.MAX_TEXT:
            raise FieldError("id", f"is longer than {v.MAX_TEXT} characters", 404)
        return service.find_row(id, "id")

    @app.get("/api/items/{id:path}")
    def item(id: str, request: Request) -> dict:
        return service.item(_row(id), _base(request))

    @app.get("/api/thumb/{id:path}")
    def thumb(id: str) -> Response:
        return Response(service.thumbnail(_row(id)), media_type="image/jpeg",
                        headers={"Cache-Control": "max-age=3600"})

    # --------------------------------------------------------- clip-retrieval
    @app.get("/indices-list")
    def indices_list() -> list:
        return service.indices_list()

    @app.post("/knn-service")
    async def knn_service(request: Request) -> list:
        return await run_in_threadpool(service.knn_service, await _json(request), _base(request))

    @app.post("/metadata")
    async def metadata(request: Request) -> list:
        return await run_in_threadpool(service.metadata, await _json(request), _base(request))

    return app
