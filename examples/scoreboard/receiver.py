"""A scoreboard that updates itself from judgequeue's verdict webhooks (docs/events.md).

Run it, and point a webhook at it (locally: the reaper's ``JUDGEQUEUE_WEBHOOKS``; on Kubernetes:
``spec.events.webhooks`` of the JudgeQueue)::

    SCOREBOARD_SECRET=whsec-... python examples/scoreboard/receiver.py --port 8400 --db board.sqlite
    export JUDGEQUEUE_WEBHOOKS='{"board": {"url": "http://127.0.0.1:8400/hook", "secret": "whsec-..."}}'

and open http://127.0.0.1:8400/ (it refreshes itself) or read ``/board.json``.

What a receiver must do, and this one does, in one SQLite transaction per delivery:

- check ``Judgequeue-Signature`` (``t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` under the
  shared secret) and refuse anything else with 401;
- apply each ``Idempotency-Key`` (``queue:submission:generation``) once: delivery is at least once,
  so the same event may come again (after a timeout, a restarted sender); a repeat is answered 200
  and changes nothing;
- fence on the generation: a submission's row only moves to a higher generation, so an old
  verdict (a rejudge's predecessor, replayed from the dead-letter list) never overwrites a newer one;
- answer 2xx only once the effect is durable (commit, then answer); 503 or 429 with
  ``Retry-After`` asks the sender to wait; any other 4xx dead-letters the delivery.

Standard library only, so it runs anywhere Python does.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import html
import json
import os
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: Seconds a signature's timestamp may be off from this clock (replayed or very late requests are refused).
TOLERANCE = 300
SCHEMA = """
CREATE TABLE IF NOT EXISTS applied (key TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS board (
    queue TEXT NOT NULL, submission INTEGER NOT NULL, generation INTEGER NOT NULL,
    status TEXT NOT NULL, score TEXT, updated REAL NOT NULL,
    PRIMARY KEY (queue, submission)
);
"""


def verified(secret: bytes, header: str, body: bytes, now: float) -> bool:
    """True when ``header`` signs ``body`` under ``secret`` within :data:`TOLERANCE` of ``now``."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    stamp = parts.get("t", "")
    if not stamp.isdigit() or abs(now - int(stamp)) > TOLERANCE:
        return False
    expected = hmac.new(secret, stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts.get("v1", ""))


class Board:
    """The scoreboard's state in SQLite: what was applied, and each submission's latest verdict."""

    def __init__(self, path: str) -> None:
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()

    def apply(self, key: str, event: dict[str, object]) -> bool:
        """Apply one event once; False when ``key`` was applied before (a repeat)."""
        with self.lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                if self.db.execute("SELECT 1 FROM applied WHERE key = ?", (key,)).fetchone():
                    self.db.execute("ROLLBACK")
                    return False
                self.db.execute("INSERT INTO applied (key, at) VALUES (?, ?)", (key, time.time()))
                self.db.execute(
                    "INSERT INTO board (queue, submission, generation, status, score, updated)"
                    " VALUES (?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (queue, submission) DO UPDATE SET generation = excluded.generation,"
                    " status = excluded.status, score = excluded.score, updated = excluded.updated"
                    " WHERE excluded.generation > board.generation",
                    (event["queue"], event["submission"], event["generation"], event["status"],
                     json.dumps(event.get("score")), time.time()),
                )  # fmt: skip
                self.db.execute("COMMIT")
                return True
            except BaseException:
                self.db.execute("ROLLBACK")
                raise

    def rows(self) -> list[dict[str, object]]:
        with self.lock:
            cursor = self.db.execute(
                "SELECT queue, submission, generation, status, score FROM board ORDER BY queue, submission"
            )
            return [{"queue": q, "submission": s, "generation": g, "status": st, "score": json.loads(sc)}
                    for q, s, g, st, sc in cursor.fetchall()]  # fmt: skip


def handler(board: Board, secret: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def _send(self, status: int, body: bytes, kind: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/hook":
                return self._send(404, b"no such path")
            if not verified(secret, self.headers.get("Judgequeue-Signature", ""), body, time.time()):
                return self._send(401, b"bad signature")
            try:
                event = json.loads(body)
                key = self.headers["Idempotency-Key"]
            except (ValueError, KeyError):
                return self._send(400, b"not an event")
            if key != f"{event['queue']}:{event['submission']}:{event['generation']}":
                return self._send(400, b"Idempotency-Key does not name the event")
            self._send(200, b"applied" if board.apply(key, event) else b"repeat")

        def do_GET(self) -> None:
            rows = board.rows()
            if self.path == "/board.json":
                return self._send(200, json.dumps(rows).encode(), "application/json")
            cells = "".join(
                f"<tr><td>{html.escape(str(r['queue']))}</td><td>{r['submission']}</td><td>{r['generation']}</td>"
                f"<td>{html.escape(str(r['status']))}</td><td>{html.escape(json.dumps(r['score']))}</td></tr>"
                for r in rows
            )
            page = ("<!doctype html><meta http-equiv=refresh content=2><title>scoreboard</title>"
                    "<table border=1><tr><th>queue<th>submission<th>generation<th>verdict<th>score"
                    f"{cells}</table>")  # fmt: skip
            self._send(200, page.encode(), "text/html; charset=utf-8")

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", default="scoreboard.sqlite", help="SQLite file: what was applied survives restarts")
    args = parser.parse_args()
    secret = os.environ.get("SCOREBOARD_SECRET", "")
    if not secret:
        parser.error("set SCOREBOARD_SECRET to the webhook's signing key")
    server = ThreadingHTTPServer((args.host, args.port), handler(Board(args.db), secret.encode()))
    print(f"scoreboard on http://{args.host}:{server.server_address[1]}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
