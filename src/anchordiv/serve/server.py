"""Run the app with uvicorn: in the foreground (the CLI) or in a background thread (tests, benchmarks).

Connections are guarded against clients that hold them without sending (slow-loris): a
request's line and headers must arrive within ``header_timeout`` seconds of the connection
(or of the previous response), its body within ``body_timeout``; one client address holds at
most ``per_client`` connections and the server ``max_connections``. When a cap is reached, the
connection idle the longest (no request in progress) is closed to make room; only when every
one is busy is the new connection refused (503).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import threading
import time
from typing import Any, Callable

from .limits import ConnectionLimits

#: Default bind address: loopback only.
DEFAULT_HOST = "127.0.0.1"


def guarded_protocol(limits: ConnectionLimits) -> type:
    """uvicorn's h11 protocol with :class:`ConnectionLimits`: a class per server (it holds the server's
    connections by client address)."""
    from .protocol import GuardedH11Protocol  # uvicorn is imported when a server starts

    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "clients": {}})


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = DEFAULT_HOST) -> int:
    """A free TCP port on ``host``."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class PortError(OSError):
    """The address cannot be bound; the message is one line that says why and what to do."""

    def __str__(self) -> str:
        return str(self.strerror)


def bind(host: str = DEFAULT_HOST, port: int = 8000) -> socket.socket:
    """A TCP socket bound to ``host:port`` (as uvicorn binds it), or :class:`PortError`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if ":" in host else host
        if exc.errno == errno.EADDRINUSE:
            msg = f"port {port} on {shown} is already in use; stop what serves there or choose another with --port"
        elif exc.errno == errno.EACCES:
            msg = f"no permission to bind {shown}:{port}; choose a port above 1023 with --port"
        else:
            msg = f"cannot bind {shown}:{port} ({exc.strerror or exc}); check --host and --port"
        raise PortError(exc.errno, msg) from None
    sock.set_inheritable(True)
    return sock


def _config(app: Any, host: str, port: int, log_level: str, limits: ConnectionLimits | None = None) -> Any:
    import uvicorn

    limits = limits or ConnectionLimits()
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          http=guarded_protocol(limits), ws="none", limit_concurrency=None,
                          timeout_keep_alive=5, timeout_graceful_shutdown=5)


def serve(app: Any, host: str = DEFAULT_HOST, port: int = 8000, log_level: str = "warning",
          sock: socket.socket | None = None, on_started: Callable[[], Any] | None = None,
          limits: ConnectionLimits | None = None) -> None:
    """Serve ``app`` until interrupted; Ctrl-C (SIGINT) or SIGTERM finish open requests and close the port.

    ``sock``: a socket from :func:`bind` (else one is bound here, raising :class:`PortError`);
    ``on_started``: called in a background thread once the server accepts connections;
    ``limits``: timeouts and connection caps (default :class:`ConnectionLimits`).
    """
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list | None = None) -> None:
            await super().startup(sockets)
            if on_started is not None and not self.should_exit:
                threading.Thread(target=on_started, name="on-started", daemon=True).start()

    sock = bind(host, port) if sock is None else sock
    try:
        Server(_config(app, host, port, log_level, limits)).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, after a clean shutdown
        pass


class ServerThread:
    """A uvicorn server in a background thread: ``with ServerThread(app) as s: s.url``."""

    def __init__(self, app: Any, host: str = DEFAULT_HOST, port: int | None = None, log_level: str = "warning",
                 limits: ConnectionLimits | None = None):
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        self.server = uvicorn.Server(_config(app, self.host, self.port, log_level, limits))
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn:{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://[{self.host}]:{self.port}" if ":" in self.host else f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the server to exit and wait for its thread."""
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError(f"the server on {self.url} did not stop within {timeout} s")

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
