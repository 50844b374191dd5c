"""``anchordiv serve``: an HTTP search service and a web page where anchors steer similarity.

:class:`Service` holds a collection, its anchor sets, an encoder and saved indexes, and
caches fitted contexts; :func:`create_app` wraps it in a FastAPI app (JSON API,
clip-retrieval's ``/indices-list``, ``/knn-service`` and ``/metadata``, and the page);
:class:`ServerThread` runs it with uvicorn in a background thread, with the timeouts and
connection caps of :class:`ConnectionLimits`.

Needs the ``serve`` extra: ``pip install 'anchordiv[serve]'`` (fastapi, uvicorn,
python-multipart).
"""

from __future__ import annotations

from typing import Any

from .cache import ByteLRU
from .server import ConnectionLimits, ServerThread, free_port
from .service import Context, ContextKey, Service
from .errors import FieldError


def create_app(service: Service, **kwargs: Any) -> Any:
    """The FastAPI app for ``service`` (see :func:`anchordiv.serve.app.create_app`)."""
    from .app import create_app as _create

    return _create(service, **kwargs)


def build_demo_service(*args: Any, **kwargs: Any) -> Service:
    """The scene demo's service (see :func:`anchordiv.serve.demo.build_demo_service`)."""
    from .demo import build_demo_service as _build

    return _build(*args, **kwargs)


__all__ = ["ByteLRU", "ConnectionLimits", "Context", "ContextKey", "FieldError", "Service", "ServerThread",
           "build_demo_service", "create_app", "free_port"]
