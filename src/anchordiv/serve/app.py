"""The FastAPI app of ``anchordiv serve``: the JSON API, clip-retrieval's endpoints, the page and the docs.

Endpoints
---------
``GET /``                      the web page (static files shipped in the package)
``GET /docs``                  the OpenAPI page (served from the package: no CDN); ``GET /openapi.json``
``GET /api/contexts``          anchor sets, geometries, the default context, context names, collection info
``POST /api/contexts``         write anchors: a new context, built in the background (``{"context", "status", "progress"}``)
``GET /api/contexts/{name}``   a context's status and progress; ``DELETE`` forgets a written context
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

import html
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import middleware
from .errors import FieldError, parse_json_object
from .middleware import SECURITY_HEADERS
from .schemas import (ERRORS, MAX_IMAGE_BYTES, MAX_TEXT, ContextRequest, Contexts, ContextStatus, Health, Item, KnnHit,
                      KnnRequest, MetadataEntry, MetadataRequest, SearchRequest, SearchResponse, field_error, from_form)
from .service import Service

#: Static files of the page, by URL name (nothing else is ever served from disk).
STATIC = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8",
          "docs.js": "text/javascript; charset=utf-8"}
#: Swagger UI's files served under ``/docs/`` when the ``fastapi-offline`` package is installed.
SWAGGER = {"swagger-ui-bundle.js": "text/javascript; charset=utf-8", "swagger-ui.css": "text/css; charset=utf-8"}
#: The docs page's policy: Swagger UI sets inline styles and shows data: images.
DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


def get_service(request: Request) -> Service:
    """The service the app serves (a dependency of every endpoint)."""
    return request.app.state.service


ServiceDep = Annotated[Service, Depends(get_service)]


def base_url(request: Request) -> str:
    """The request's base url without the trailing slash, e.g. ``http://127.0.0.1:8000``."""
    return str(request.base_url).rstrip("/")


BaseUrl = Annotated[str, Depends(base_url)]


async def json_object(request: Request) -> dict:
    """The request's body as a JSON object (400 when it is not one)."""
    return parse_json_object(await request.body())


async def search_input(request: Request, service: ServiceDep) -> tuple[SearchRequest, bytes | None]:
    """A validated :class:`SearchRequest` from JSON or a multipart form, and the uploaded image if any."""
    ctype = request.headers.get("content-type", "").lower()
    image = None
    if ctype.startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=32)
        fields: dict[str, str] = {}
        for key, value in form.multi_items():
            if key == "image" and hasattr(value, "read"):
                image = await value.read(MAX_IMAGE_BYTES + 1)
                if len(image) > MAX_IMAGE_BYTES:
                    raise FieldError("image", f"is larger than {MAX_IMAGE_BYTES} bytes", 413)
            elif isinstance(value, str) and key != "image":
                fields[key] = value
            else:
                raise FieldError(key, "must be a plain form field" if key != "image" else "must be an uploaded file")
        await form.close()
        data = from_form(fields)
    elif ctype.startswith("application/json"):
        data = await json_object(request)
        if "image" in data:
            raise FieldError("image", "upload images as multipart/form-data")
    else:
        raise FieldError("body", "send JSON with Content-Type: application/json (or multipart/form-data "
                                 "to upload an image)", 415)
    return service.request(SearchRequest, data, image=image is not None), image


def body_of(*models: type, form: bool = False) -> dict:
    """``openapi_extra`` describing a request body read by a dependency (JSON, and a form for uploads)."""
    content = {"application/json": {"schema": models[0].model_json_schema()}}
    if form:
        schema = models[0].model_json_schema()
        schema["properties"] = {**schema["properties"], "image": {"type": "string", "format": "binary",
                                                                  "description": "An image file (image encoders)."}}
        content["multipart/form-data"] = {"schema": schema}
    return {"requestBody": {"required": True, "content": content}}


# ------------------------------------------------------------------------------ native API
api = APIRouter(prefix="/api", tags=["search"], responses=ERRORS)


@api.get("/contexts", response_model=Contexts)
def contexts(service: ServiceDep) -> dict:
    """Anchor sets, geometries and their parameters, the default context, context names, limits."""
    return service.info()


@api.post("/contexts", response_model=ContextStatus, status_code=200, openapi_extra=body_of(ContextRequest),
          responses={202: {"model": ContextStatus, "description": "Building: poll GET /api/contexts/NAME."}})
async def create_context(service: ServiceDep, data: Annotated[dict, Depends(json_object)]) -> JSONResponse:
    """Write anchors: a new context over the whole collection, built in the background; its name and status."""
    body, status = await run_in_threadpool(service.create_context, data)
    return JSONResponse(body, status_code=status)


def context_name(name: str) -> str:
    """A context name (a path parameter)."""
    if len(name) > MAX_TEXT:
        raise FieldError("name", f"is longer than {MAX_TEXT} characters", 404)
    return name


@api.get("/contexts/{name:path}", response_model=ContextStatus)
def context_status(name: Annotated[str, Depends(context_name)], service: ServiceDep) -> dict:
    """A context's status and build progress."""
    return service.context_status(name)


@api.delete("/contexts/{name:path}", response_model=ContextStatus)
def delete_context(name: Annotated[str, Depends(context_name)], service: ServiceDep) -> dict:
    """Forget a written context (a build in progress is cancelled)."""
    return service.delete_context(name)


@api.get("/health", response_model=Health)
def health(service: ServiceDep) -> dict:
    """The service is up; statistics of the context cache."""
    return {"status": "ok", "cache": service.contexts.stats()}


@api.post("/search", response_model=SearchResponse, response_model_exclude_unset=True,
          openapi_extra=body_of(SearchRequest, form=True))
async def search(service: ServiceDep, base: BaseUrl,
                 given: Annotated[tuple, Depends(search_input)]) -> dict:
    """Neighbours of one query under one context."""
    return await run_in_threadpool(service.search, given[0], given[1], base)


def item_row(id: str, service: ServiceDep) -> int:
    """The row of the item ``id`` (a path parameter)."""
    if len(id) > MAX_TEXT:
        raise FieldError("id", f"is longer than {MAX_TEXT} characters", 404)
    return service.find_row(id, "id")


@api.get("/items/{id:path}", response_model=Item)
def item(row: Annotated[int, Depends(item_row)], service: ServiceDep, base: BaseUrl) -> dict:
    """One item by id."""
    return service.item(row, base)


@api.get("/thumb/{id:path}", response_class=Response,
         responses={200: {"content": {"image/jpeg": {}}, "description": "A JPEG thumbnail."}})
def thumb(row: Annotated[int, Depends(item_row)], service: ServiceDep) -> Response:
    """The JPEG thumbnail of an item's own image file."""
    return Response(service.thumbnail(row), media_type="image/jpeg", headers={"Cache-Control": "max-age=3600"})


# ------------------------------------------------------------------------------ clip-retrieval
clip = APIRouter(tags=["clip-retrieval"], responses=ERRORS)


@clip.get("/indices-list", response_model=list[str])
def indices_list(service: ServiceDep) -> list:
    """Context names, the default first (clip-retrieval's index names)."""
    return service.indices_list()


@clip.post("/knn-service", response_model=list[KnnHit], openapi_extra=body_of(KnnRequest))
async def knn_service(service: ServiceDep, base: BaseUrl, data: Annotated[dict, Depends(json_object)]) -> list:
    """clip-retrieval's search: ``[{"id", "similarity", **metadata}]``."""
    return await run_in_threadpool(service.knn_service, data, base)


@clip.post("/metadata", response_model=list[MetadataEntry], openapi_extra=body_of(MetadataRequest))
async def metadata(service: ServiceDep, base: BaseUrl, data: Annotated[dict, Depends(json_object)]) -> list:
    """clip-retrieval's metadata of items by id."""
    return await run_in_threadpool(service.metadata, data, base)


# ------------------------------------------------------------------------------ page and docs
page = APIRouter(include_in_schema=False)


def _static(name: str) -> bytes:
    return resources.files("anchordiv.serve").joinpath("static", name).read_bytes()


def swagger_files() -> dict[str, bytes]:
    """Swagger UI's files from the ``fastapi-offline`` package, or nothing when it is not installed."""
    try:
        import fastapi_offline
    except ImportError:
        return {}
    from pathlib import Path

    folder = Path(fastapi_offline.__file__).parent / "static"
    return {name: (folder / name).read_bytes() for name in SWAGGER}


def docs_page(title: str, swagger: bool) -> bytes:
    """The ``/docs`` page: Swagger UI from ``/docs/``, else a plain rendering of ``/openapi.json``."""
    assets = ('<link rel="stylesheet" href="/docs/swagger-ui.css">\n'
              '<script src="/docs/swagger-ui-bundle.js"></script>\n') if swagger else \
        '<link rel="stylesheet" href="/static/style.css">\n'
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n<title>{html.escape(title)} · API'
            f'</title>\n<link rel="icon" href="data:,">\n{assets}'
            '<script src="/static/docs.js" defer></script></head>\n'
            '<body><div id="swagger-ui"></div><main id="openapi" hidden></main></body></html>\n').encode()


@page.get("/")
def index(request: Request) -> Response:
    return Response(request.app.state.files["index.html"], media_type="text/html; charset=utf-8")


@page.get("/static/{name}")
def static(name: str, request: Request) -> Response:
    if name not in STATIC:
        raise FieldError("name", f"no static file {name!r}", 404)
    return Response(request.app.state.files[name], media_type=STATIC[name], headers={"Cache-Control": "no-cache"})


@page.get("/docs")
def docs(request: Request) -> Response:
    return Response(request.app.state.files["docs"], media_type="text/html; charset=utf-8",
                    headers={"Content-Security-Policy": DOCS_CSP})


@page.get("/docs/{name}")
def docs_file(name: str, request: Request) -> Response:
    files = request.app.state.files
    if name not in SWAGGER or name not in files:
        raise FieldError("name", f"no docs file {name!r}", 404)
    return Response(files[name], media_type=SWAGGER[name], headers={"Cache-Control": "max-age=3600"})


# ------------------------------------------------------------------------------ errors
async def on_field_error(request: Request, exc: FieldError) -> JSONResponse:
    return JSONResponse(exc.payload(), status_code=exc.status)


async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    field = getattr(exc, "field", None) or ("body" if exc.status_code == 400 else None)
    detail = str(exc.detail)
    return JSONResponse({"error": f"{field}: {detail}" if field and not detail.startswith(f"{field}:") else detail,
                         "field": field}, status_code=exc.status_code)


async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return await on_field_error(request, field_error(list(exc.errors())))


async def on_server_error(request: Request, exc: Exception) -> JSONResponse:
    """The server closes the connection after an unexpected error: say so, so a keep-alive client reconnects."""
    return JSONResponse({"error": f"internal error ({type(exc).__name__}); the request was not completed",
                         "field": None}, status_code=500, headers={**SECURITY_HEADERS, "Connection": "close"})


ERROR_HANDLERS = {FieldError: on_field_error, StarletteHTTPException: on_http_error,
                  RequestValidationError: on_validation_error, Exception: on_server_error}


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
    app = FastAPI(title="anchordiv", summary=service.title, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json", exception_handlers=ERROR_HANDLERS,
                  description="Search a collection under anchor contexts. Errors are "
                              '`{"error": "FIELD: message", "field": "FIELD"}` with a 4xx status.')
    swagger = swagger_files()
    app.state.service = service
    app.state.files = {**{name: _static(name) for name in ("index.html", *STATIC)}, **swagger,
                       "docs": docs_page(service.title, bool(swagger))}
    for router in (page, api, clip):
        app.include_router(router)
    middleware.install(app, loopback_only, cors_origins)
    return app
