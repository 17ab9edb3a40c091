"""The runtime layer: what every role runs on.

A role as a process (:mod:`.process`: logs, signals, the health/metrics port of :mod:`.http`), what
every role does around its work (:mod:`.lifecycle`: patient connections, waits, closing in time),
and the wake-up the dispatcher and a direct-intake worker share (:mod:`.wakeup`).
"""
