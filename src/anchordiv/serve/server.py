"""Run the app with uvicorn: in the foreground (the CLI) or in a background thread (tests, benchmarks)."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Any

#: Default bind address: loopback only.
DEFAULT_HOST = "127.0.0.1"


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
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _config(app: Any, host: str, port: int, log_level: str) -> Any:
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          limit_concurrency=256, timeout_keep_alive=5, timeout_graceful_shutdown=5)


def serve(app: Any, host: str = DEFAULT_HOST, port: int = 8000, log_level: str = "warning") -> None:
    """Serve ``app`` until interrupted; Ctrl-C (SIGINT) or SIGTERM finish open requests and close the port."""
    import uvicorn

    try:
        uvicorn.Server(_config(app, host, port, log_level)).run()
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled, after a clean shutdown
        pass


class ServerThread:
    """A uvicorn server in a background thread: ``with ServerThread(app) as s: s.url``."""

    def __init__(self, app: Any, host: str = DEFAULT_HOST, port: int | None = None, log_level: str = "warning"):
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        self.server = uvicorn.Server(_config(app, self.host, self.port, log_level))
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn:{self.port}", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

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
