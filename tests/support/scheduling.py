"""How the whole suite is spread over pytest-xdist workers, and what each test waits to be built.

scripts/test runs the whole suite on several workers while the heavy tiers' artefacts build beside
it. A work unit is what one worker runs in one go: the heavy tiers together are one unit (a control
plane, a real node and a VM each take most of the machine's two cores: side by side they only slow
each other and the timing bounds of their tests), and any other module is one unit (its
module-scoped fixtures are set up once).
Units go out in collection order, one at a time, and tests/conftest.py orders them: the heavy unit
first, so it takes a worker of its own and waits there only for the artefacts each test needs (each
built artefact is announced on its own), while the other workers run the tests that need nothing
built. Within the heavy unit the tiers go in the order a cold build finishes their artefacts (the VM
disk, then the control plane, then the node and image), and the tests that need the oldest API
server, built last, run last.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

#: The tiers that need more than Postgres and Redis, one folder each under tests/, in the order a
#: cold build makes their artefacts ready.
TIERS = ("vm", "kube", "node")
#: The one work unit every heavy tier's tests belong to.
HEAVY_UNIT = "tests/{" + ",".join(TIERS) + "}"
#: What scripts/test builds beside the suite, each announced by its own lock and exit-code file.
ARTEFACTS = ("control-plane", "oldest", "node", "image", "vm")
#: What a tier's tests wait for unless a ``builds(...)`` marker names otherwise.
TIER_NEEDS = {"kube": ("control-plane",), "node": ("control-plane", "node", "image"), "vm": ("vm",)}
#: Light folders in the order their modules go out (the long ones first, so the short ones fill the end).
LIGHT_ORDER = ("process", "integration", "unit")


def tier_of(path: Path, tests_root: Path) -> str | None:
    return next((tier for tier in TIERS if tests_root / tier in path.parents), None)


def needs(item: pytest.Item, tests_root: Path) -> tuple[str, ...]:
    """The artefacts ``item`` needs built: its ``builds(...)`` marker's, else its tier's."""
    marker = item.get_closest_marker("builds")
    if marker is not None:
        named = tuple(marker.args) or ("control-plane",)
        unknown = [name for name in named if name not in ARTEFACTS]
        if unknown:
            raise pytest.UsageError(f"{item.nodeid}: builds() names {unknown}, not one of {ARTEFACTS}")
        return named
    tier = tier_of(Path(str(item.fspath)), tests_root)
    return TIER_NEEDS[tier] if tier else ()


def order_key(item: pytest.Item, tests_root: Path, parallel: bool) -> tuple[int, int, int]:
    """Sort key for the collection. Serially the tests that need nothing built run first (they run
    while the build does); on workers the heavy unit goes out first, to a worker of its own. Among
    the heavy tests, those that need the oldest API server (built last) run last."""
    path = Path(str(item.fspath))
    tier = tier_of(path, tests_root)
    pieces = needs(item, tests_root)
    oldest = int("oldest" in pieces)
    if tier is not None:
        return (0 if parallel else 2, oldest, TIERS.index(tier))
    if pieces:
        return (3, 0, oldest)
    folder = path.relative_to(tests_root).parts[0] if path.is_relative_to(tests_root) else ""
    light = LIGHT_ORDER.index(folder) if folder in LIGHT_ORDER else len(LIGHT_ORDER)
    return (1, light, 0)


def wait_for(folder: Path, artefact: str) -> str:
    """Block until ``artefact`` is built (its builder holds its lock until then); "" when it was, else
    why not, with the end of the build's log."""
    with open(folder / f"{artefact}.lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
    rc = folder / f"{artefact}.rc"
    code = rc.read_text().strip() if rc.exists() else "none"
    if code == "0":
        return ""
    log = (folder / "log").read_text(errors="replace") if (folder / "log").exists() else ""
    return f"building {artefact} beside the tests failed (exit {code}):\n{log[-6000:]}"


class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """xdist's load-by-scope scheduling with this suite's units, in collection order."""

    def __init__(self, config: pytest.Config, log: object | None = None) -> None:
        super().__init__(config, log)
        # Keep the order tests/conftest.py gave the collection (xdist sorts units by size otherwise).
        config.option.loadscopereorder = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def unit_of(nodeid: str) -> str:
    """The work unit of a test: the heavy unit for any heavy tier's test, else its module."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS:
        return HEAVY_UNIT
    return path

