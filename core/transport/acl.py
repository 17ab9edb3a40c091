"""Least privilege in Redis: the ACL rules of each component's user, per queue.

Every key of a queue shares the ``jq:{<queue>}:`` prefix (:mod:`.streams`), so a user is given the
pattern ``~jq:{<queue>}:*`` of each queue it serves and nothing else. The scripts run as Redis
functions (``FCALL``), so no component needs ``EVAL``; what a function runs is checked against the
calling user's rules, so each user holds the commands its functions call too. No component gets
``FLUSH*``, ``CONFIG``, ``KEYS``, ``FUNCTION`` or any ``@admin`` or ``@dangerous`` command: loading the
functions (``FUNCTION LOAD``) is the migrator's (or a quick start's superuser).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from ..base.names import validate_queue_name

_PING = ("ping",)

#: The commands each component runs, itself and inside the functions it calls.
COMMANDS: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        # enqueue_batch: SET NX, XADD, DEL; the consumer group made at start
        "dispatcher": (*_PING, "fcall", "set", "xadd", "del", "xgroup|create"),
        # XREADGROUP; ack: XACK, XDEL, DEL; ack_pending: XPENDING; a poison entry dead-lettered: XADD;
        # /readyz: XINFO GROUPS (is the group there); the endpoints' slots (endpoint_acquire, _renew,
        # _release): the holders' sorted set, the rate's bucket, the server's clock
        "worker": (
            *_PING, "fcall", "xreadgroup", "xack", "xdel", "del", "xpending", "xadd", "xgroup|create",
            "xinfo|groups", "time", "zadd", "zrem", "zcard", "zscore", "zrange", "zremrangebyscore", "hmget",
            "hset", "pexpire", "get", "set",
        ),
        # claim: XPENDING, XAUTOCLAIM, XACK; requeue: XADD, XACK, XDEL; idle consumers: XINFO,
        # XGROUP DELCONSUMER; trims (the shadow stream's by Redis's clock: TIME), gauges, stranded markers
        "reaper": (
            *_PING,
            "time",
            "fcall",
            "xpending",
            "xautoclaim",
            "xack",
            "xadd",
            "xdel",
            "del",
            "xlen",
            "xtrim",
            "xrange",
            "xinfo|groups",
            "xinfo|consumers",
            "xinfo|stream",
            "xgroup|create",
            "xgroup|delconsumer",
        ),
        # backlog figures in status
        "operator": (*_PING, "xlen", "xinfo|groups", "xinfo|stream", "xpending", "xgroup|create"),
    }
)


def acl_rules(component: str, queues: Iterable[str]) -> list[str]:
    """The ``ACL SETUSER`` rules (after the user's name, password and ``on``) of ``component`` for ``queues``."""
    if component not in COMMANDS:
        raise ValueError(f"component must be one of {', '.join(COMMANDS)}, got {component!r}")
    names = list(queues)
    for name in names:
        validate_queue_name(name)
    return [
        "resetkeys",
        "resetchannels",
        "-@all",
        *(f"~jq:{{{name}}}:*" for name in names),
        *(f"+{command}" for command in COMMANDS[component]),
    ]


def acl_command(component: str, user: str, queues: Iterable[str]) -> str:
    """One ``ACL SETUSER`` line for ``redis-cli`` (the password left for the administrator to add)."""
    return " ".join(["ACL SETUSER", user, "on", ">PASSWORD", *acl_rules(component, queues)])
