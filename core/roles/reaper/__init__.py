"""The reaper role: rescue idle stream entries and expired leases, prune, refresh gauges (docs/design.md §1).

Its work is done by maintainers, one file each with its own interval, which a small loop
(:mod:`.loop`) runs every ``interval``, each guarded on its own, in this order; their names are the
ones the sweep's report and the logs use:

- **stream**, **shadow_stream** (:mod:`.stream_rescue`): entries idle longer than
  ``visibilityTimeout`` are requeued, or dead-lettered at ``maxDeliveries`` (Postgres first, then
  the DLQ; a shadow entry becomes a ``SYSTEM_ERROR`` shadow verdict);
- **leases**, **shadow_leases** (:mod:`.lease_rescue`): expired leases get a new generation (or are
  sent to the shadow stream again), until ``maxRetries``;
- **prune** (:mod:`.retention`): rows past ``retention``, and waiters and offers crashed processes left;
- **analyse** (:mod:`.statistics`): on a new database, ANALYZE the tables direct intake reads;
- **shadow_trim**, **consumers** (:mod:`.stream_upkeep`): old shadow entries, idle consumers;
- **stranded** (:mod:`.stranded`): deliveries Redis lost are sent again, every quarter of
  ``redispatchAfter``;
- **gauges**, and once a minute **counts** (:mod:`.gauges`): the queue's figures for ``/metrics``.

Several reapers may run against one queue: every step acts only on what its own consumer claimed,
and every write is idempotent or fenced. :class:`~.role.Reaper` holds one reaper's maintainers.
"""

from __future__ import annotations

from .loop import SweepReport, backoff_delay
from .role import Reaper, run
from .stream_rescue import ClaimedEntry, Decision, StreamSweep, decide

__all__ = ["ClaimedEntry", "Decision", "Reaper", "StreamSweep", "SweepReport", "backoff_delay", "decide", "run"]
