"""``anchordiv serve``: an HTTP search service and a web page where anchors steer similarity.

:class:`Service` holds a collection (memory-mapped), its anchor sets, an encoder and saved
indexes, and the live contexts built over it (anchors from the file or written by hand); :func:`create_app` wraps it in a FastAPI app (JSON API,
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
from .contexts import ContextKey, WrittenContexts
from .service import Service
from .errors import FieldError


def create_app(service: Service, **kwargs: Any) -> Any:
    """The FastAPI app for ``service`` (see :func:`anchordiv.serve.app.create_app`)."""
    from .app import create_app as _create

    return _create(service, **kwargs)


__all__ = ["ByteLRU", "ConnectionLimits", "ContextKey", "WrittenContexts", "FieldError", "Service", "ServerThread",
           "create_app", "free_port"]
