"""A small tool server for trying the ``http-call`` judge: loopback only, slow, sometimes failing,
and counting its effects by idempotency key.

POST any path with a JSON body and an ``Idempotency-Key`` header: the server "applies an effect"
(it sleeps ``--delay`` seconds, then records it) once per key. A call repeating a key whose effect
is applied gets the stored result again; one arriving while the first is still applying waits
for it. Failures happen before any effect: ``--fail-rate`` answers that share of calls 429 or 503
(with ``Retry-After: 1``), ``--fail-first N`` the first N calls of each key; ``--storm`` answers
every call 429/503 and ``--hang`` never answers. ``GET /effects`` shows ``{"applied": {key: n},
"calls": {key: n}}``: an ``applied`` count above 1 would be a duplicated effect.

    python examples/agent/tool_server.py --port 8765 --delay 2 --fail-rate 0.3

Only the standard library; it prints ``listening on http://127.0.0.1:<port>`` once it serves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Tool:
    """The effects, by idempotency key (thread-safe)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.lock = threading.Lock()
        self.applied: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.key_locks: dict[str, threading.Lock] = {}
        self.random = random.Random(args.seed)

    def call(self, key: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.calls[key] = self.calls.get(key, 0) + 1
            nth = self.calls[key]
            fail = self.args.storm or nth <= self.args.fail_first or self.random.random() < self.args.fail_rate
            key_lock = self.key_locks.setdefault(key, threading.Lock())
        if self.args.hang:
            threading.Event().wait()
        if fail:
            return self.random.choice((429, 503)), {"error": "busy, try again later"}
        with key_lock:  # a repeat arriving mid-effect waits for the first and gets its result
            if key in self.results:
                return 200, self.results[key]
            time.sleep(self.args.delay)
            result = {"effect": "applied", "key": key, "echo": body}
            with self.lock:
                self.applied[key] = self.applied.get(key, 0) + 1
                self.results[key] = result
            return 200, result


def handler(tool: Tool) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, doc: Any) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status in (429, 503):
                self.send_header("Retry-After", "1")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            with tool.lock:
                self._send(200, {"applied": dict(tool.applied), "calls": dict(tool.calls)})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            key = self.headers.get("Idempotency-Key")
            if not key:
                self._send(400, {"error": "an Idempotency-Key header is required"})
                return
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(400, {"error": "the body is not JSON"})
                return
            if isinstance(body, dict) and body.get("reject"):
                self._send(422, {"error": f"rejected: {body['reject']}"})
                return
            self._send(*tool.call(key, body))

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the counts at GET /effects say what happened

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8765, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds each effect takes")
    parser.add_argument("--fail-rate", type=float, default=0.0, help="share of calls answered 429/503")
    parser.add_argument("--fail-first", type=int, default=0, help="answer the first N calls of each key 429/503")
    parser.add_argument("--storm", action="store_true", help="answer every call 429/503")
    parser.add_argument("--hang", action="store_true", help="never answer")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(Tool(args)))
    server.daemon_threads = True
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
