"""Matplotlib plumbing shared by the benchmark plots: an optional headless pyplot and saving a figure."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def headless_pyplot(progress: Callable[[str], None]) -> Any | None:
    """``matplotlib.pyplot`` on the Agg backend, or None (after saying so) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        progress("matplotlib not installed (pip install '.[bench]'): no plot")
        return None
    return plt


def save(plt: Any, fig: Any, path: Path) -> str:
    """Lay out, write ``fig`` to ``path`` (creating its directory), close it; returns the path."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
