"""Direct intake's tuning values, each in one place with why it is what it is.

The figures behind them are in docs/performance.md; the wake-up's own values, which the dispatcher
shares, are :mod:`judgequeue.core.runtime.wakeup`'s (``BUSY_STREAK``, ``OTHERS_SERVE_EXCESS``,
``WAITER_REFRESH``). Read them as ``tuning.NAME`` at the point of use, so one assignment (a test's,
say) changes them everywhere.
"""

from __future__ import annotations

# --- takes ---------------------------------------------------------------------------------------

#: Seconds between takes while work flows fast (see :func:`~judgequeue.core.roles.worker.direct.takes.pace_takes`):
#: at 2,800 jobs/s a take at once brought 2.1 rows for 128 µs of server time; end to end rose from
#: 65-70% to 80% of pgbench with this pause (docs/performance.md). Short enough to be lost in a
#: judge's own time.
TAKE_PACE = 0.002

#: Rows a second a busy streak's takes must find before they are paced: above the rate at which
#: offers stop (:data:`OFFER_MAX_FILL_RATE`), so where offers fall back to takes at latency-bound
#: rates (a cool-down, a burst's edge) each take still goes at once.
PACE_TAKES_ABOVE = 1500.0

#: Seconds over which a busy streak's take rate is measured before its count starts again: long
#: enough to hold a few hundred takes at the rates that are paced (so one slow take does not swing
#: it), short enough that a load that falls off stops being paced within half a second.
TAKE_RATE_WINDOW = 0.5

#: Seconds a worker stays unregistered when others take what it is woken for
#: (``wakeup.OTHERS_SERVE_EXCESS``), then registers again: long enough that the submits stop paying
#: a NOTIFY each for it for a while, short enough that a job would barely notice if the others
#: stopped serving meanwhile.
OTHERS_SERVE_STEP_BACK = 0.05

# --- offers --------------------------------------------------------------------------------------

#: Seconds an offer stays fillable without a refresh: how long a dead worker's offers can still
#: take jobs (each then waits for its lease to expire and be rescued). Three refreshes
#: (:data:`OFFER_REFRESH`): a live worker's offers survive two late or failed syncs.
OFFER_VALIDITY = 3.0

#: Seconds between refreshes of a waiting worker's offers: a third of :data:`OFFER_VALIDITY` (see
#: there), at one statement a second per waiting worker.
OFFER_REFRESH = 1.0

#: Fills per second (over :data:`OFFER_RATE_WINDOW`) above which a worker stops offering for
#: :data:`OFFER_COOLDOWN`. Every fill is a NOTIFY in the submit's commit, and Postgres serialises
#: notifying commits (with their WAL flush): on the project's machines that caps the submits near
#: 1,200-1,500 a second once every commit fills an offer, where plain commits reach 4,000-5,000, and
#: the cap hides the demand (fills never come faster than it). So the limit sits just under the cap.
#: At such rates the takes batch anyway (several rows each) and the submits commit without a NOTIFY
#: each.
OFFER_MAX_FILL_RATE = 1100.0

#: Seconds over which fills are counted against :data:`OFFER_MAX_FILL_RATE`: long enough that a
#: paced load's jitter at 1,000 a second does not cross the limit, short enough to see a burst
#: within a few hundred of its submits.
OFFER_RATE_WINDOW = 0.4

#: Seconds a worker makes no offers after its fills came too fast (or a take found a burst,
#: :data:`OFFER_BURST_ROWS`): long against the window (a burst is usually over before offers come
#: back), short enough that a load that falls back to a trickle is served by offers again within
#: seconds.
OFFER_COOLDOWN = 3.0

#: Rows one take finds while the worker offers that show the submits outrun the offers (they were
#: all filled when these came): a burst, whose NOTIFYs would cap the submits; stop for
#: :data:`OFFER_COOLDOWN`. A trickle's stragglers (a fill racing a top-up) come one or two at a time.
OFFER_BURST_ROWS = 8

#: Seconds an attempt whose job was started from a filled offer is remembered, so a notification
#: arriving after the sync that reported it (or the other way round) does not start it twice: many
#: times the longest a notification and a sync can be apart (a sync every :data:`OFFER_REFRESH`,
#: retried with backoff), while the memory stays a minute of fills.
OFFER_FILL_MEMORY = 60.0

#: Takes in a row that filled their room before a worker keeps its reserved offers open: a backlog
#: drains behind them (see :func:`~judgequeue.core.roles.worker.direct.offers.backlog_seen`). A single
#: full take is no evidence: a worker keeping up with a flood of submits finds, now and then, as many
#: rows as a few freed slots had room for, and the next take finds fewer. Opening and closing the
#: reserve on each such take cost an offers sync per 33 jobs in ``bench.priority``'s throughput
#: phase; three in a row, a drain reaches in a few milliseconds and the flood seldom.
BACKLOG_TAKES = 3

#: Seconds after a take that filled its room, with no take finding fewer since, before a worker keeps
#: its reserved offers open all the same: its slots are held by jobs that have not ended (long
#: judges), so no take comes to make the streak, and a first-class arrival would wait for one of them.
#: Longer than the flood's gaps between takes (milliseconds), short next to a judge.
BACKLOG_WAIT = 0.05
