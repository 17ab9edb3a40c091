"""Fixtures of the process tier."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def as_root() -> None:
    """The sandbox tests run untrusted programs under their own uids: they need root, as CI has.

    Not a skip: a run without root would pass without ever testing the sandbox.
    """
    if os.geteuid() != 0:
        pytest.fail("the sandbox tests need root (CI and scripts/install run as root); run the suite as root")
