"""Run the JudgeQueue operator: the entry point ``judgequeue operator`` calls.

One replica is enough (handlers are idempotent and level-based, and resume after a restart); deploy
it with ``strategy: Recreate``. For several replicas, pass ``peering`` (needs Kopf's
``KopfPeering``/``ClusterKopfPeering`` CRDs): replicas then elect one active operator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Sequence
from typing import Any

import kopf

from judgequeue.core.base.logs import setup_logging

from .handlers import build_registry
from .kube import KubeApi, connection_info, load_configuration
from .redact import RedactFilter
from .state import OperatorConfig, OperatorState

_GLOB = set("*?[")


def _drop_kopf_settings(record: logging.LogRecord) -> bool:
    """Kopf attaches its whole settings object to each object-log record; keep it out of the JSON."""
    record.__dict__.pop("settings", None)
    return True


def operator_settings(namespaces: Sequence[str] | None) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Literal namespaces need no scanning (listing namespaces needs cluster-wide RBAC).
    if namespaces and not any(_GLOB & set(ns) for ns in namespaces):
        settings.scanning.disabled = True
    return settings


def liveness_endpoint(address: str, port: int | None) -> str | None:
    """Kopf's liveness URL for ``address`` (an IPv6 address gets its brackets) and ``port``; None
    without a port (no endpoint)."""
    if not port:
        return None
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return f"http://{host}:{port}/healthz"


@dataclasses.dataclass(frozen=True)
class OperatorOptions:
    """How one operator process runs: what it serves and how it reaches the cluster.

    ``namespaces``: serve only these (None or empty: cluster-wide). ``liveness_port``: serve Kopf's
    ``/healthz`` there, bound to ``liveness_address``. ``peering``: a Kopf peering name for several
    replicas; without it the operator runs standalone (one replica). ``kubeconfig``: a kubeconfig
    path (default: in-cluster, else ``$KUBECONFIG``/``~/.kube/config``). ``config``: the timer's
    interval and the connection timeouts.
    """

    namespaces: Sequence[str] | None = None
    liveness_port: int | None = None
    liveness_address: str = "0.0.0.0"
    peering: str | None = None
    standalone: bool = False
    kubeconfig: str | None = None
    config: OperatorConfig = dataclasses.field(default_factory=OperatorConfig)


async def operate(
    options: OperatorOptions,
    *,
    stop_flag: threading.Event | asyncio.Event | None = None,
    ready_flag: threading.Event | asyncio.Event | None = None,
    state: OperatorState | None = None,
) -> None:
    """The operator as a coroutine (see :func:`run_operator`); ``state`` lets tests observe handlers."""
    configuration = load_configuration(options.kubeconfig)
    state = state or OperatorState(config=options.config)
    # Kopf posts its per-object log lines at WARNING and above as Events: scrub them first.
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, RedactFilter) for f in objects.filters):
        objects.addFilter(RedactFilter())

    async def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_info(configuration)

    registry = build_registry(state, login=login, kube_factory=lambda: KubeApi(configuration))
    namespaces = options.namespaces
    await kopf.operator(
        registry=registry,
        settings=operator_settings(namespaces),
        clusterwide=not namespaces,
        namespaces=list(namespaces or ()),
        standalone=options.standalone or options.peering is None,
        peering_name=options.peering,
        liveness_endpoint=liveness_endpoint(options.liveness_address, options.liveness_port),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def run_operator(options: OperatorOptions, *, log_level: str = "INFO") -> int:
    """Run until SIGINT/SIGTERM; returns the process exit code.

    Logs are JSON lines on stderr, like the roles', so one log pipeline reads both; every action the
    operator takes is one INFO line (:mod:`.actions`).
    """
    level = log_level.upper()
    known = level in ("DEBUG", "INFO", "WARNING", "ERROR")
    setup_logging(level if known else "INFO")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_drop_kopf_settings)
        handler.addFilter(RedactFilter())  # no secret in a log line, whoever wrote it
    if not known:
        logging.getLogger(__name__).warning(f"unknown log level {log_level!r}; using INFO")
    asyncio.run(operate(options))
    return 0
