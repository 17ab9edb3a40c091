"""The servers a test node's pods use, on a host address the node reaches.

The host end of the node's veth pair (tests/node) is an address of the host's own: the node's
namespace reaches it through the pair, a VM (tests/vm) through qemu's user network, whose
connections leave as the host's own. A throwaway Postgres and Redis of the test listen there and on
loopback, with a password, as pods reach any database: with credentials from a Secret.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.node.realnode import Addresses, RealNode
from tests.support.pg_servers import PostgresServer, postgres_server
from tests.support.redis_servers import RedisServer, free_port

#: The password of the pods' Postgres and Redis (they reach them over the node's network, as pods
#: reach any database: with credentials from a Secret).
PASSWORD = "node-tier-secret"


@dataclass
class HostServices:
    """A host address a node (a network namespace, or a VM through qemu's user network) reaches,
    with a Postgres and a Redis of the test's listening on it and on loopback."""

    addresses: Addresses
    suffix: str
    postgres: PostgresServer
    redis: RedisServer

    def dsn(self, database: str) -> str:
        """A DSN as a pod uses it, with the password; the test process may use it too."""
        return f"postgresql://postgres:{PASSWORD}@{self.addresses.host}:{self.postgres.port}/{database}"

    def local_dsn(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.postgres.port}/{database}"

    @property
    def redis_url(self) -> str:
        return f"redis://:{PASSWORD}@{self.addresses.host}:{self.redis.port}/0"


def _allow_pods(postgres: PostgresServer, addresses: Addresses) -> None:
    """Pods (masqueraded as the node) log in with a password; the test process still trusts loopback."""
    hba = postgres.data / "pg_hba.conf"
    subnet = addresses.host.rsplit(".", 2)[0] + ".0.0/16"
    with hba.open("a") as f:  # pods arrive masqueraded as the node's address
        f.write(f"host all all {subnet} scram-sha-256\n")
    postgres._run("psql", "-h", "127.0.0.1", "-p", str(postgres.port), "-U", "postgres", "-qc",
                  f"ALTER USER postgres PASSWORD '{PASSWORD}'")
    postgres._run("pg_ctl", "-D", str(postgres.data), "reload")


@contextlib.contextmanager
def host_services(workdir: Path) -> Iterator[HostServices]:
    """The node's network namespace and veth pair, and the servers on the host end of it."""
    addresses = Addresses.pick()
    suffix = os.urandom(3).hex()
    RealNode.make_network(addresses, suffix)
    try:
        with postgres_server(settings={"listen_addresses": f"127.0.0.1,{addresses.host}"}) as postgres:
            _allow_pods(postgres, addresses)
            redis = RedisServer(free_port(), workdir / "redis",
                                ["--bind", f"127.0.0.1 {addresses.host}"], password=PASSWORD)
            try:
                yield HostServices(addresses, suffix, postgres, redis)
            finally:
                redis.stop()
    finally:
        RealNode.remove_network(suffix)
