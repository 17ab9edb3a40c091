"""The store layer: judgequeue's tables, and the records it keeps in Redis beside them.

Every SQL statement (:mod:`.sql`), the schema's history (``migrations/``, applied by
:mod:`.migrate`), and one module a table or record: queues, submissions, the outbox, leases and
the fence, the DLQ and giving up on an entry, shadow verdicts, problem packages, the backlog read.
It stands on base, transport, the settings and the judges; it runs no loop of its own.
"""
