"""A real Milvus standalone server for the tests: PyPI ``milvus`` (``milvus-server``).

``milvus-server`` is a Python wrapper that runs ``milvus run standalone`` as a child and
answers SIGTERM slowly, so it is started in its own session (process group) and stopped
by signalling that group: SIGTERM, then SIGKILL after a timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

#: Every ``--<name>-port`` option of ``milvus-server``; each gets a free loopback port.
PORT_OPTIONS = ("etcd", "root-coord", "proxy", "proxy-internal", "query-coord", "query-node", "index-coord",
                "index-node", "data-coord", "data-node")
#: Seconds to wait for a server to answer, and for its process group to end after SIGTERM.
START_TIMEOUT, STOP_TIMEOUT = 180.0, 3.0


def executable() -> str | None:
    """The ``milvus-server`` script of this Python environment (or on PATH), None without one."""
    beside = Path(sys.executable).with_name("milvus-server")
    return str(beside) if beside.is_file() else shutil.which("milvus-server")


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (all held open until every one is chosen)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


class MilvusServer:
    """One ``milvus-server`` process group on free loopback ports with data under ``data_dir``.

    ``uri`` is the proxy's address; ``token`` is ``"root:Milvus"`` (the server's default
    credentials) when authorization is enabled, else None.
    """

    def __init__(self, data_dir: str | os.PathLike, authorization: bool = False):
        exe = executable()
        if exe is None:
            raise RuntimeError("milvus-server is not installed; pip install milvus==2.3.5")
        *listen, peer = free_ports(len(PORT_OPTIONS) + 1)
        ports = dict(zip(PORT_OPTIONS, listen))
        self.data_dir = Path(data_dir)
        self.uri = f"http://127.0.0.1:{ports['proxy']}"
        self.token = "root:Milvus" if authorization else None
        cmd = [exe, "--data", str(self.data_dir)]
        for name, port in ports.items():
            cmd += [f"--{name}-port", str(port)]
        if authorization:
            cmd += ["--authorization-enabled", "true"]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # the embedded etcd's peer port has no option (default 2380, taken by a second server):
        # Milvus reads the etcd configuration file named by $ETCD_CONFIG_PATH
        etcd = self.data_dir / "etcd.yaml"
        client, peer_url = f"http://127.0.0.1:{ports['etcd']}", f"http://127.0.0.1:{peer}"
        etcd.write_text(f"name: default\nlisten-client-urls: {client}\nadvertise-client-urls: {client}\n"
                        f"listen-peer-urls: {peer_url}\ninitial-advertise-peer-urls: {peer_url}\n"
                        f"initial-cluster: default={peer_url}\n")
        self._log = open(self.data_dir / "milvus-server.log", "wb")
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env={**os.environ, "ETCD_CONFIG_PATH": str(etcd)}, start_new_session=True)
        self.pgid = self.process.pid  # a new session: its leader's pid is the group id
        try:
            self._wait_until_answering()
        except BaseException:
            self.stop()
            raise

    def _wait_until_answering(self) -> None:
        from pymilvus import MilvusClient

        deadline = time.monotonic() + START_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None or self._panicked():
                raise RuntimeError(f"milvus-server failed to start (exit code {self.process.poll()}); see "
                                   f"{self.data_dir / 'milvus-server.log'} and {self.data_dir / 'logs'}")
            try:
                client = MilvusClient(uri=self.uri, token=self.token or "", timeout=5)
                try:
                    client.list_collections()
                    self.version = client.get_server_version()
                    return
                finally:
                    client.close()
            except Exception as exc:  # not up yet
                last = exc
                time.sleep(1.0)
        raise TimeoutError(f"milvus-server at {self.uri} did not answer within {START_TIMEOUT:.0f} s ({last!r})")

    def _panicked(self) -> bool:
        """Whether the server binary died (its wrapper lives on and would keep the port unanswered)."""
        for name in ("milvus-stdout.log", "milvus-stderr.log"):
            with contextlib.suppress(OSError):
                if b"\npanic: " in (self.data_dir / "logs" / name).read_bytes():
                    return True
        return False

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it when it has not ended after ``STOP_TIMEOUT`` seconds."""
        for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(self.pgid):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=0.2)
            if not _group_alive(self.pgid):
                break
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        self._log.close()


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still running (signal 0 reaches members)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # zombies of the group still count for killpg: ask for live members
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
