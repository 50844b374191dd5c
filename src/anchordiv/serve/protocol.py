"""The connection guard of the server: uvicorn's h11 protocol with timeouts and connection caps."""

from __future__ import annotations

import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import ConnectionLimits, _raw_response


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with :class:`ConnectionLimits`; a subclass per
    server sets ``limits`` and ``clients`` (its connections by client address)."""

    limits: ConnectionLimits = ConnectionLimits()
    clients: dict[str, set] = {}

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._timer: Any = None
        self._phase = ""
        self._idle_since = time.monotonic()
        self._address = self.client[0] if self.client else ""
        mine = self.clients.setdefault(self._address, set())
        mine.add(self)
        if len(mine) > self.limits.per_client and not self._make_room(mine):
            return self._refuse("too many connections from one address")
        if len(self.connections) > self.limits.max_connections and not self._make_room(self.connections):
            return self._refuse("too many connections")
        self._rearm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        mine = self.clients.get(self._address)
        if mine is not None:
            mine.discard(self)
            if not mine:
                self.clients.pop(self._address, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._rearm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._rearm()

    # ---------------------------------------------------------------- state
    def _busy(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _make_room(self, group: Any) -> bool:
        """Close the connection of ``group`` idle the longest; False when all are busy."""
        idle = [c for c in list(group) if c is not self and isinstance(c, GuardedH11Protocol)
                and not c._busy() and not c.transport.is_closing()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c._idle_since)
        oldest._close()
        return True

    def _refuse(self, why: str) -> None:
        self.transport.write(_raw_response(503, "Service Unavailable", f"{why}; try again later"))
        self._close()

    def _close(self) -> None:
        self._cancel()
        self.connections.discard(self)
        mine = self.clients.get(self._address)
        if mine is not None:
            mine.discard(self)
        if not self.transport.is_closing():
            self.transport.close()

    def _cancel(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()
            self._timer = None

    def _rearm(self) -> None:
        """Start the deadline of the phase the connection is in: headers, body, or none while the app works."""
        if self.transport.is_closing():
            return self._cancel()
        if not self._busy():
            phase, timeout = "headers", self.limits.header_timeout
        elif self.conn.their_state is h11.SEND_BODY:
            phase, timeout = "body", self.limits.body_timeout
        else:
            phase, timeout = "app", None
        if phase == self._phase:
            return
        self._cancel()
        self._phase = phase
        if phase == "headers":
            self._idle_since = time.monotonic()
        if timeout is not None:
            self._timer = self.loop.call_later(timeout, self._timed_out)

    def _timed_out(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        started = self._busy() and self.cycle.response_started
        partial = self._busy() or bool(self.conn.trailing_data[0])
        if partial and not started:
            what = "body" if self._phase == "body" else "request line and headers"
            limit = self.limits.body_timeout if self._phase == "body" else self.limits.header_timeout
            self.transport.write(_raw_response(408, "Request Timeout",
                                               f"the {what} did not arrive within {limit:g} s"))
        self._close()

