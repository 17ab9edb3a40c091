"""The transport layer: the doors to the two servers.

How connections to Postgres and Redis are made (:mod:`.connect`, :mod:`.redis_url`), and the Redis
Streams transport (:mod:`.streams`, the thin :mod:`.envelope`, the stream figures of
:mod:`.stream_stats`). It stands on the base layer only.
"""
