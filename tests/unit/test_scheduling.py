"""How the suite is ordered and cut into work units (tests/support/scheduling.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from tests.support import scheduling

ROOT = Path("/repo/tests")


@dataclass
class Marker:
    args: tuple[str, ...]


@dataclass
class Item:
    """The two things the ordering reads from a pytest item."""

    fspath: str
    builds: tuple[str, ...] | None = None

    @property
    def nodeid(self) -> str:
        return self.fspath

    def get_closest_marker(self, name: str) -> Marker | None:
        return Marker(self.builds) if name == "builds" and self.builds is not None else None


def ordered(items: list[Item], parallel: bool) -> list[str]:
    def key(item: Item) -> tuple[int, int, int]:
        return scheduling.order_key(cast(pytest.Item, item), ROOT, parallel)

    return [f"{Path(i.fspath).relative_to(ROOT)}{'+oldest' if i.builds and 'oldest' in i.builds else ''}"
            for i in sorted(items, key=key)]


SUITE = [
    Item(str(ROOT / "unit/test_a.py")),
    Item(str(ROOT / "kube/test_crd.py"), ("control-plane", "oldest")),
    Item(str(ROOT / "node/test_user.py")),
    Item(str(ROOT / "kube/test_crd.py")),
    Item(str(ROOT / "process/test_chaos.py")),
    Item(str(ROOT / "vm/test_v2.py")),
    Item(str(ROOT / "integration/test_outbox.py")),
]


def test_serially_what_needs_nothing_built_runs_first_and_the_oldest_api_server_last() -> None:
    assert ordered(SUITE, parallel=False) == [
        "process/test_chaos.py", "integration/test_outbox.py", "unit/test_a.py",
        "vm/test_v2.py", "kube/test_crd.py", "node/test_user.py", "kube/test_crd.py+oldest"]


def test_on_workers_the_heavy_unit_goes_out_first() -> None:
    assert ordered(SUITE, parallel=True) == [
        "vm/test_v2.py", "kube/test_crd.py", "node/test_user.py", "kube/test_crd.py+oldest",
        "process/test_chaos.py", "integration/test_outbox.py", "unit/test_a.py"]


@pytest.mark.parametrize(("nodeid", "unit"), [
    ("tests/kube/test_crd.py::test_x[a]", scheduling.HEAVY_UNIT),
    ("tests/node/test_user_path_real.py::test_y", scheduling.HEAVY_UNIT),
    ("tests/vm/test_cgroup_v2.py::test_z", scheduling.HEAVY_UNIT),
    ("tests/process/test_chaos.py::test_w", "tests/process/test_chaos.py"),
    ("tests/unit/test_kube_words.py::test_v", "tests/unit/test_kube_words.py"),
])
def test_every_heavy_tier_is_one_unit_and_any_other_module_its_own(nodeid: str, unit: str) -> None:
    assert scheduling.unit_of(nodeid) == unit


def test_a_builds_marker_naming_an_unknown_artefact_is_a_usage_error() -> None:
    with pytest.raises(pytest.UsageError, match="not one of"):
        scheduling.needs(cast(Any, Item(str(ROOT / "kube/test_crd.py"), ("kubelet",))), ROOT)
