"""Reconcile latency: from a JudgeQueue spec change to the Deployment patched, against kmock.

Runs the real operator (Kopf in its own thread) against the StrictEmulator from the test suite, a
throwaway migrated Postgres database and the local Redis, changes ``spec.dispatcher.batchSize``
``--changes`` times and prints p50/p99 of the time from the API accepting the CR patch to the API
accepting the dispatcher Deployment's patch. Target: p50 <= 200 ms.

    .venv/bin/python -m bench.reconcile_bench --changes 50
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import kmock

from bench.common import REDIS_URL, create_database, drop_database
from judgequeue.controllers.state import OperatorConfig
from tests.support.kmock_emulator import DEPLOYMENTS, JQ, SECRETS, OperatorThread, StrictEmulator, eventually, secret
from tests.support.kmock_emulator import write_kubeconfig as kubeconfig_for

NS = "bench"


def _batch_size(emulator: StrictEmulator) -> str | None:
    dep = emulator.current(DEPLOYMENTS, NS, "bench-dispatcher")
    if dep is None:
        return None
    env = dep["spec"]["template"]["spec"]["containers"][0]["env"]
    return next((e.get("value") for e in env if e["name"] == "JUDGEQUEUE_BATCH_SIZE"), None)


async def run(changes: int) -> dict[str, float]:
    dsn = await create_database("jq_reconcile_bench")
    try:
        async with StrictEmulator() as emulator, kmock.Server(emulator):
            emulator.declare()
            emulator.put_object(SECRETS, NS, secret("db", dsn=dsn))
            emulator.put_object(SECRETS, NS, secret("rd", url=REDIS_URL))
            with tempfile.TemporaryDirectory() as tmp:
                kubeconfig = kubeconfig_for(Path(tmp) / "kubeconfig", str(emulator.url))
                operator = OperatorThread(kubeconfig, [NS], OperatorConfig(interval=60))
                operator.start()
                await operator.wait_ready()
                spec: dict[str, Any] = {
                    "image": "judgequeue:bench",
                    "queue": "bench",
                    "postgres": {"secretKeyRef": {"name": "db", "key": "dsn"}},
                    "redis": {"secretKeyRef": {"name": "rd", "key": "url"}},
                }
                emulator.put_object(JQ, NS, {"metadata": {"name": "bench"}, "spec": spec})
                await eventually(lambda: _batch_size(emulator) == "100", what="created")
                path = f"/apis/judgequeue.dev/v1alpha1/namespaces/{NS}/judgequeues/bench"
                samples: list[float] = []
                for i in range(changes):
                    size = str(200 + i)
                    started = time.perf_counter()
                    async with emulator.patch(
                        path,
                        json={"spec": {"dispatcher": {"batchSize": int(size)}}},
                        headers={"Content-Type": "application/merge-patch+json"},
                    ) as resp:
                        assert resp.status == 200
                    async with asyncio.timeout(10):
                        while _batch_size(emulator) != size:
                            await emulator.next_write()
                    samples.append(time.perf_counter() - started)
                await operator.stop()
                emulator.close_watches()
    finally:
        await drop_database(dsn)
    ordered = sorted(samples)
    return {
        "changes": float(len(samples)),
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--changes", type=int, default=50)
    args = parser.parse_args()
    result = asyncio.run(run(args.changes))
    print(
        f"reconcile latency (CR patch -> Deployment patched), {int(result['changes'])} changes: "
        f"p50 {result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, max {result['max_ms']:.1f} ms "
        f"(target p50 <= 200 ms)"
    )


if __name__ == "__main__":
    main()
