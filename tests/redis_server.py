"""Start and stop private ``redis-server`` processes for tests (single nodes and clusters).

Every server listens on loopback (or a unix socket in a temp dir), has persistence off, and
is stopped by its PID -- never by name -- so tests running beside other work are safe.
``REDIS_SERVER`` is the binary (None when absent: tests skip with that reason).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")
SKIP_REASON = "redis-server is not installed (CI installs it: apt-get install -y redis-server)"


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(cluster: bool = False) -> int:
    """A free loopback port; for a cluster node also its bus port (port + 10000), which
    Redis requires to be <= 65535."""
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 50000)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisServer:
    """One redis-server; ``url`` points at it. ``kill()`` / ``start()`` restart on the same port."""

    def __init__(self, *args: str, port: Optional[int] = None, unix: bool = False, tls: bool = False,
                 workdir: Optional[str] = None, tls_files: Optional[tuple[str, str]] = None):
        assert REDIS_SERVER, SKIP_REASON
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="hicache-redis-"))
        self.port = port or free_port()
        self.unix_path = str(self.dir / "redis.sock") if unix else None
        self.tls = tls or tls_files is not None
        self.extra = list(args)
        self.proc: Optional[subprocess.Popen] = None
        if tls_files is not None:  # (certificate, key) made by the caller, e.g. signed by a test CA
            self.cert, self.key = tls_files
        elif tls:
            self._make_certs()
        self.start()

    def _make_certs(self) -> None:
        self.cert = str(self.dir / "cert.pem")
        self.key = str(self.dir / "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", self.key,
                        "-out", self.cert, "-days", "1", "-subj", "/CN=localhost"],
                       check=True, capture_output=True)

    def argv(self) -> list[str]:
        argv = [REDIS_SERVER, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--protected-mode", "no", "--daemonize", "no"]
        if self.tls:
            argv += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", self.cert,
                     "--tls-key-file", self.key, "--tls-ca-cert-file", self.cert, "--tls-auth-clients", "no"]
        else:
            argv += ["--port", str(self.port)]
        if self.unix_path:
            argv += ["--unixsocket", self.unix_path, "--unixsocketperm", "700"]
        return argv + self.extra

    def start(self, timeout: float = 10.0) -> None:
        log = open(self.dir / f"redis-{self.port}.log", "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"redis-server exited: {(self.dir / f'redis-{self.port}.log').read_text()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                    if self.tls:
                        return
                    sock.sendall(b"PING\r\n")
                    reply = sock.recv(64)
                if reply.startswith((b"+PONG", b"-NOAUTH")):  # up (with or without a password)
                    return
            except OSError:
                pass
            time.sleep(0.02)
        self.kill()
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def cli(self, *args: str) -> str:
        """Run a redis-cli command against this server (not for TLS servers)."""
        assert REDIS_CLI, "redis-cli is missing"
        out = subprocess.run([REDIS_CLI, "-h", "127.0.0.1", "-p", str(self.port), *args],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def kill(self) -> None:
        """SIGKILL (a crash: no goodbye to clients)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """``n`` cluster-enabled servers joined into one cluster with no replicas."""

    def __init__(self, n: int = 3):
        self.dir = tempfile.mkdtemp(prefix="hicache-cluster-")
        self.nodes: list[RedisServer] = []
        try:
            self._start(n)
        except BaseException:
            self.close()
            raise

    def _start(self, n: int) -> None:
        for _ in range(n):
            port = free_port(cluster=True)
            d = os.path.join(self.dir, str(port))
            os.makedirs(d)
            self.nodes.append(RedisServer("--cluster-enabled", "yes", "--cluster-config-file",
                                          f"nodes-{port}.conf", "--cluster-node-timeout", "2000",
                                          port=port, workdir=d))
        hosts = [f"127.0.0.1:{s.port}" for s in self.nodes]
        subprocess.run([REDIS_CLI, "--cluster", "create", *hosts, "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in s.cli("CLUSTER", "INFO") for s in self.nodes):
                return
            time.sleep(0.1)
        raise RuntimeError("cluster did not become ok")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.nodes)

    def node_id(self, server: RedisServer) -> str:
        return server.cli("CLUSTER", "MYID")

    def owner(self, slot: int) -> RedisServer:
        for s in self.nodes:
            for line in s.cli("CLUSTER", "NODES").splitlines():
                parts = line.split()
                if "myself" in parts[2]:
                    for rng in parts[8:]:
                        if rng.startswith("["):
                            continue
                        lo, _, hi = rng.partition("-")
                        if int(lo) <= slot <= int(hi or lo):
                            return s
        raise AssertionError(f"no owner for slot {slot}")

    def close(self) -> None:
        for s in self.nodes:
            s.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
