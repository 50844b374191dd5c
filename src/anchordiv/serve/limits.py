"""The server's connection limits (timeouts and caps) and its raw error response."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ConnectionLimits:
    """Timeouts and caps of the server's connections (see the module docstring)."""

    header_timeout: float = 10.0
    body_timeout: float = 60.0
    per_client: int = 32
    max_connections: int = 256

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "per_client", "max_connections"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": message, "field": None}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body
