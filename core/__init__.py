"""judgequeue core: the Postgres outbox, the Redis Streams transport and the dispatcher, worker and reaper roles.

This package never imports Kubernetes; the operator in ``judgequeue.controllers`` builds on it.
"""
