"""The base layer: what every other layer stands on, and that imports nothing of judgequeue but itself.

Errors, statuses, JSON logs, metrics, failpoints, queue names, the version, the shadow agreement's
rules. Nothing here opens a connection.
"""
