"""ASGI middleware of the service: security headers, loopback hosts, cross-site posts, body limits.

Each refusal is a JSON ``{"error": "FIELD: message", "field": "FIELD"}`` that closes the connection.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from .errors import FieldError, show
from .schemas import MAX_IMAGE_BYTES, MAX_JSON_BYTES
from .server import is_loopback

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
                    "host", f"{show(name)} is not a loopback name; open the page as http://127.0.0.1:PORT/ or "
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
                refused = f"a page on {show(origin)} may not call this service"
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

    def __init__(self, app: Any, max_json: int = MAX_JSON_BYTES, max_upload: int = MAX_IMAGE_BYTES + (64 << 10)):
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


def install(app: Any, loopback_only: bool = True, cors_origins: list[str] | None = None) -> None:
    """Add the service's middleware to ``app``: the body limit innermost, the security headers outermost."""
    app.add_middleware(BodyLimit)
    app.add_middleware(CrossSite, allowed=list(cors_origins or ()))
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type"])
    if loopback_only:
        app.add_middleware(LoopbackHosts)
    app.add_middleware(SecurityHeaders)
