"""Throwaway redis-server processes for tests that need a server of their own (faults, cluster).

Each server listens on a free loopback port, keeps its files in a temporary directory, and is
stopped by its own pid (never by name) when the context exits.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import redis

from tests.support.roles import stop_process
from tests.support.waiting import wait_for

REDIS_SERVER = shutil.which("redis-server") or "redis-server"
REDIS_CLI = shutil.which("redis-cli") or "redis-cli"
#: Debian's redis-sentinel package (the same program as redis-server, started in Sentinel mode).
REDIS_SENTINEL = shutil.which("redis-sentinel") or "redis-sentinel"


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(*, with_bus: bool = False) -> int:
    """A loopback port nobody listens on (and, for cluster nodes, port + 10000 free too)."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535 and with_bus:
            continue
        if not with_bus or _port_free(port + 10000):
            return port
    raise RuntimeError("no free port found")


class RedisServer:
    """One redis-server child process."""

    def __init__(
        self,
        port: int,
        workdir: Path,
        args: Sequence[str] = (),
        *,
        config: str | None = None,
        executable: str = REDIS_SERVER,
        password: str | None = None,
    ) -> None:
        self.port = port
        self.password = password
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        if config is not None:  # a configuration file (a sentinel rewrites its own): options come after it
            (workdir / "redis.conf").write_text(config)
        self.process = subprocess.Popen(
            [
                executable,
                *([str(workdir / "redis.conf")] if config is not None else []),
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
                "--logfile",
                str(workdir / "redis.log"),
                *(["--requirepass", password] if password else []),
                *args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.wait_ready()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5)

    def wait_ready(self, within: float = 10.0) -> None:
        def answers() -> bool:
            if self.process.poll() is not None:
                log = (self.workdir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on {self.port} exited: {log}")
            try:
                with self.client() as c:
                    return bool(c.ping())
            except redis.RedisError:
                return False

        wait_for(answers, within, f"redis-server on {self.port} answering PING", every=0.02)

    def stop(self) -> None:
        stop_process(self.process, 5)


@contextlib.contextmanager
def redis_server(*args: str) -> Iterator[RedisServer]:
    """A standalone throwaway server with extra ``args`` (e.g. ``--maxmemory``)."""
    with tempfile.TemporaryDirectory(prefix="jq-redis-") as tmp:
        server = RedisServer(free_port(), Path(tmp), args)
        try:
            yield server
        finally:
            server.stop()


def start_sentinel(workdir: Path, master: str, master_port: int, *, quorum: int = 2) -> RedisServer:
    """A ``redis-sentinel`` monitoring ``master`` at 127.0.0.1:``master_port``, quick to act.

    It declares the master down after 1 s without an answer, so a test's failover takes seconds.
    """
    config = "\n".join(
        [
            f"sentinel monitor {master} 127.0.0.1 {master_port} {quorum}",
            f"sentinel down-after-milliseconds {master} 1000",
            f"sentinel failover-timeout {master} 10000",
            f"sentinel parallel-syncs {master} 1",
            "",
        ]
    )
    return RedisServer(free_port(), workdir, ["--sentinel"], config=config, executable=REDIS_SENTINEL)


def wait_sentinels_settled(sentinels: Sequence[RedisServer], master: str, replicas: int, within: float = 30) -> None:
    """Until every sentinel knows the others and ``replicas`` replicas (a failover needs both)."""
    def settled() -> bool:
        for sentinel in sentinels:
            with sentinel.client() as c:
                peers = c.execute_command("SENTINEL", "SENTINELS", master)
                known = c.execute_command("SENTINEL", "REPLICAS", master)
                if len(peers) != len(sentinels) - 1 or len(known) != replicas:
                    return False
        return True

    wait_for(settled, within, f"sentinels knowing each other and {replicas} replica(s)")


def master_address(sentinel: RedisServer, master: str) -> tuple[str, int]:
    """The master ``sentinel`` currently names for ``master``."""
    with sentinel.client() as c:
        host, port = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", master)
    return (host.decode() if isinstance(host, bytes) else str(host)), int(port)


@contextlib.contextmanager
def redis_cluster(masters: int = 3) -> Iterator[list[RedisServer]]:
    """A local cluster of ``masters`` primaries (no replicas) with every slot assigned."""
    with tempfile.TemporaryDirectory(prefix="jq-cluster-") as tmp:
        nodes: list[RedisServer] = []
        try:
            for i in range(masters):
                port = free_port(with_bus=True)
                nodes.append(
                    RedisServer(
                        port,
                        Path(tmp) / f"node{i}",
                        [
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            "nodes.conf",
                            "--cluster-node-timeout",
                            "5000",
                        ],
                    )
                )
            subprocess.run(
                [REDIS_CLI, "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes], "--cluster-yes"],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=60,
            )
            _wait_cluster_ok(nodes)
            yield nodes
        finally:
            for node in nodes:
                node.stop()


def _wait_cluster_ok(nodes: Sequence[RedisServer], within: float = 20.0) -> None:
    def ok(node: RedisServer) -> bool:
        with node.client() as c:
            info = c.execute_command("CLUSTER", "INFO")
        return "cluster_state:ok" in (info.decode() if isinstance(info, bytes) else str(info))

    wait_for(lambda: all(ok(node) for node in nodes), within, "cluster_state:ok on every node")
