"""Every Prometheus metric judgequeue exports, defined once so all roles agree on names and labels.

Names start with ``judgequeue_``. Gauges describing the queue's health are refreshed by the reaper
(and by ``judgequeue status``); counters and histograms are updated on the hot paths.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram, Info

from .agreement import OUTCOMES
from .states import VERDICTS as VERDICT_STATUSES
from .version import VERSION

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_JUDGE_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)

# --- build ----------------------------------------------------------------------------------------
#: ``judgequeue_build_info{version="..."} 1`` in every process that serves /metrics (every role):
#: which release is running, to join on in queries (``* on (pod) group_left(version)``) and to see a
#: rollout's progress. Always 1; the version is the label.
BUILD_INFO = Info("judgequeue_build", "The judgequeue release this process runs (the value is always 1).")
BUILD_INFO.info({"version": VERSION})

# --- outbox / dispatcher -------------------------------------------------------------------------
OUTBOX_ROWS = Gauge("judgequeue_outbox_rows", "Outbox rows by state.", ["queue", "state"])
OUTBOX_OLDEST_PENDING_AGE = Gauge(
    "judgequeue_outbox_oldest_pending_age_seconds", "Age of the oldest outbox row not yet sent.", ["queue"]
)
CLASS_BACKLOG = Gauge(
    "judgequeue_class_backlog", "Outbox rows waiting per priority class of a queue.", ["queue", "class"]
)
CLASS_OLDEST_PENDING_AGE = Gauge(
    "judgequeue_class_oldest_pending_age_seconds",
    "Age of the oldest waiting outbox row per priority class of a queue.",
    ["queue", "class"],
)
DISPATCH_RESULTS = Counter(
    "judgequeue_dispatch_results_total",
    "Outbox rows handled by dispatchers (sent, duplicate, shadow_sent, skipped, retry, dead) and taken by "
    "direct-intake workers (direct, skipped), by result.",
    ["queue", "result"],
)
COMMIT_TO_ENQUEUE = Histogram(
    "judgequeue_commit_to_enqueue_seconds",
    "From outbox row creation (DB clock) to its append to the stream.",
    ["queue"],
    buckets=_LATENCY_BUCKETS,
)

# --- stream (refreshed by the reaper) --------------------------------------------------------------
STREAM_LENGTH = Gauge("judgequeue_stream_length", "XLEN of the work stream.", ["queue"])
STREAM_LAG = Gauge("judgequeue_stream_lag", "Entries not yet delivered to the worker group.", ["queue"])
PEL_SIZE = Gauge("judgequeue_pel_size", "Entries delivered but not acked (pending entries list).", ["queue"])
PEL_OLDEST_IDLE = Gauge("judgequeue_pel_oldest_idle_seconds", "Idle time of the oldest pending entry.", ["queue"])
DLQ_LENGTH = Gauge("judgequeue_dlq_length", "Entries in the dead-letter stream.", ["queue"])
SHADOW_LENGTH = Gauge("judgequeue_shadow_stream_length", "Entries in the shadow stream.", ["queue"])
NOTIFY_QUEUE_USAGE = Gauge(
    "judgequeue_notify_queue_usage",
    "Fraction of Postgres's notification queue in use (pg_notification_queue_usage); at 1 every NOTIFY"
    " fails, submits that fill offers or wake workers included. A listener that stops reading holds it.",
)
CONSUMERS = Gauge("judgequeue_consumers", "Consumers registered in the worker group.", ["queue"])

# --- reaper ----------------------------------------------------------------------------------------
RECLAIMS = Counter("judgequeue_reclaims_total", "Idle pending entries re-delivered by the reaper.", ["queue"])
DEAD_LETTERS = Counter("judgequeue_dead_letters_total", "Entries moved to the dead-letter stream.", ["queue"])
LEASE_EXPIRIES = Counter(
    "judgequeue_lease_expiries_total", "Judging leases that expired and were rescued by the reaper.", ["queue"]
)
RESENT_STRANDED = Counter(
    "judgequeue_resent_stranded_total",
    "Deliveries re-sent because they were never leased long after sending (stream data lost).",
    ["queue"],
)
PRUNED_ROWS = Counter("judgequeue_pruned_outbox_rows_total", "Terminal outbox rows deleted by retention.", ["queue"])
PRUNED_SUBMISSIONS = Counter(
    "judgequeue_pruned_submissions_total", "Terminal submissions deleted by retention.", ["queue"]
)
WEBHOOK_DELIVERIES = Counter(
    "judgequeue_webhook_deliveries_total",
    "Webhook POSTs by outcome (delivered, retry, refused).", ["queue", "endpoint", "outcome"],
)
WEBHOOK_LATENCY = Histogram(
    "judgequeue_webhook_latency_seconds",
    "From a verdict's commit (DB clock) to its webhook delivery accepted.", ["queue", "endpoint"],
    buckets=_LATENCY_BUCKETS,
)
WEBHOOK_PENDING = Gauge("judgequeue_webhook_pending", "Webhook deliveries waiting to be sent.", ["queue", "endpoint"])
WEBHOOK_DEAD = Gauge("judgequeue_webhook_dead", "Dead-lettered webhook deliveries.", ["queue", "endpoint"])
WEBHOOK_OLDEST_PENDING_AGE = Gauge(
    "judgequeue_webhook_oldest_pending_age_seconds", "Age of the oldest webhook delivery waiting.",
    ["queue", "endpoint"],
)
WEBHOOK_CONFIG_ERROR = Gauge(
    "judgequeue_webhook_config_error",
    "1 while a webhook endpoint (or JUDGEQUEUE_WEBHOOKS as a whole: endpoint *) is misconfigured and not called.",
    ["queue", "endpoint"],
)
PRUNED_EVENTS = Counter(
    "judgequeue_pruned_verdict_events_total", "Verdict events deleted by retention.", ["queue"]
)
PRUNED_HISTORY = Counter(
    "judgequeue_pruned_verdict_history_total", "Verdict history rows deleted by retention.", ["queue"]
)

# --- worker ----------------------------------------------------------------------------------------
JOBS_CANCELLED = Counter(
    "judgequeue_jobs_cancelled_total",
    "Running jobs a worker stopped because their submission was cancelled (judgequeue.cancel()).",
    ["queue"],
)
VERDICTS = Counter(
    "judgequeue_verdicts_total",
    "Verdicts written, by status (one of judgequeue.core.base.states.VERDICTS; PRESENTATION_ERROR only from checkers).",
    ["queue", "status"],
)


def verdict_series(queue: str) -> dict[str, Any]:
    """One ``judgequeue_verdicts_total`` child per verdict of the queue, created at zero, so a rate or an
    alert on a status that has not happened yet (a first PRESENTATION_ERROR) sees a series, not nothing."""
    return {status: VERDICTS.labels(queue, status) for status in VERDICT_STATUSES}


PROBLEM_CACHE = Counter(
    "judgequeue_problem_cache_total",
    "Problem package lookups in the worker's local cache, by result (hit, miss: copied from Postgres, eviction).",
    ["result"],
)
JUDGE_DURATION = Histogram(
    "judgequeue_judge_duration_seconds", "Time spent in the judge per job.", ["queue"], buckets=_JUDGE_BUCKETS
)
END_TO_END = Histogram(
    "judgequeue_end_to_end_seconds",
    "From submission creation to its verdict (DB clock).",
    ["queue"],
    buckets=_LATENCY_BUCKETS,
)
STALE_RESULTS_DROPPED = Counter(
    "judgequeue_stale_results_dropped_total",
    "Results or envelopes dropped by the generation/attempt fence.",
    ["queue", "reason"],
)
JOBS_DEFERRED = Counter(
    "judgequeue_jobs_deferred_total",
    "Jobs a judge gave back to be tried again later without a slot (kind: failed, a failed try; waited,"
    " its endpoint was at its bound and the job could not wait for it).",
    ["queue", "kind"],
)
ENDPOINT_WAITING = Gauge(
    "judgequeue_endpoint_waiting",
    "http-call jobs of this worker waiting in their slots for one of their endpoint's fleet-wide call slots.",
    ["queue", "endpoint"],
)
ENDPOINT_WAIT = Histogram(
    "judgequeue_endpoint_wait_seconds",
    "How long an http-call job waited for its endpoint's call slot before calling (0: at once).",
    ["queue", "endpoint"],
    buckets=_LATENCY_BUCKETS,
)
LEASE_RENEW_FAILURES = Counter(
    "judgequeue_lease_renew_failures_total", "Lease heartbeats that failed or found the lease lost.", ["queue"]
)
MALFORMED_ENTRIES = Counter(
    "judgequeue_malformed_entries_total",
    "Stream entries that are not judgequeue envelopes, left pending for the reaper to dead-letter.",
    ["queue"],
)
JOBS_IN_FLIGHT = Gauge("judgequeue_jobs_in_flight", "Jobs this worker is judging now.", ["queue"])

# --- shadow judging (docs/gitops.md) -------------------------------------------------------------------
SHADOW_VERDICTS = Counter(
    "judgequeue_shadow_verdicts_total",
    "Shadow verdicts written by shadow workers (never a submission's verdict), by status.",
    ["queue", "status"],
)
SHADOW_COMPARED = Gauge(
    "judgequeue_shadow_submissions",
    "Submissions of a queue by how their legacy and shadow verdicts compare (outcome: matched, mismatched,"
    " legacy_only, shadow_only) and verdict class (the legacy verdict, else the shadow one); refreshed by"
    " the reaper over what retention keeps.",
    ["queue", "verdict", "outcome"],
)
SHADOW_AGREEMENT = Gauge(
    "judgequeue_shadow_agreement_ratio",
    "Matched / (matched + mismatched) over a queue's compared submissions; NaN before any was compared.",
    ["queue"],
)
SHADOW_SAMPLES = Gauge(
    "judgequeue_shadow_compared_submissions", "Submissions both the legacy and the shadow judge judged.", ["queue"]
)
SHADOW_RESENT = Counter(
    "judgequeue_shadow_resent_total",
    "Shadow entries sent again by the reaper after a shadow worker's lease expired.",
    ["queue"],
)
PRUNED_SHADOW = Counter(
    "judgequeue_pruned_shadow_verdicts_total", "Shadow and legacy verdicts deleted by retention.", ["queue", "side"]
)


def shadow_series(queue: str) -> dict[tuple[str, str], Any]:
    """Every ``judgequeue_shadow_submissions`` child of a queue (each verdict class and outcome), so a
    class that has no submission reads 0 rather than nothing."""
    return {(v, o): SHADOW_COMPARED.labels(queue, v, o) for v in VERDICT_STATUSES for o in OUTCOMES}
