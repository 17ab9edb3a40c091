"""``judgequeue operator``: the Kubernetes operator, imported only when it runs."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
from collections.abc import Mapping

from ..base.errors import Failure
from ..config import (
    parse_duration,
)
from .common import Commands


def cmd_operator(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    # Imported here only: judgequeue.core never imports Kubernetes at module import time.
    try:
        module = importlib.import_module("judgequeue.controllers.operator")
    except ModuleNotFoundError as exc:
        if exc.name == "judgequeue.controllers.operator":
            raise Failure("judgequeue operator is not available in this build yet") from None
        raise
    run_operator = getattr(module, "run_operator", None)
    if run_operator is None:
        raise Failure("judgequeue operator is not available in this build yet (no run_operator)")
    options = module.OperatorOptions(
        namespaces=None if args.all_namespaces else args.namespace,
        liveness_port=args.liveness_port,
        liveness_address=args.liveness_address,
        peering=args.peering,
        kubeconfig=args.kubeconfig,
    )
    if args.interval is not None:
        options = dataclasses.replace(options, config=dataclasses.replace(options.config, interval=args.interval))
    try:
        result = run_operator(options, log_level=env.get("JUDGEQUEUE_LOG_LEVEL", "INFO"))
    except Exception as exc:
        if type(exc).__module__.startswith("kubernetes.config"):
            raise Failure(f"cannot load the Kubernetes configuration: {exc}") from None
        raise
    return int(result or 0)


def add(commands: Commands) -> None:
    p = commands.add("operator", "run the Kubernetes operator (Kopf) for JudgeQueue resources")
    p.add_argument("--namespace", action="append", help="watch this namespace (repeatable)")
    p.add_argument("--all-namespaces", action="store_true", help="watch every namespace (default without --namespace)")
    p.add_argument("--liveness-port", type=int, help="serve the operator's /healthz on this port")
    p.add_argument("--liveness-address", default="0.0.0.0",
                   help="the address /healthz binds to (default 0.0.0.0: every interface of the pod, where the"
                        " kubelet probes; 127.0.0.1 keeps it local)")
    p.add_argument("--peering", help="Kopf peering name, for several operator replicas (default: standalone)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--interval", type=parse_duration, default=10.0,
                   help="time between timer ticks: autoscaling, status refresh, retries (default 10s)")
    p.set_defaults(handler=cmd_operator)
