"""The version of judgequeue that is running: pyproject.toml's ``version``, the one source.

It is read from the installed distribution's metadata, so ``judgequeue --version``, the
``judgequeue_build_info`` metric and the image's label all say what was installed. An editable
install records the version when it is installed: after a bump (``scripts/release``) install again.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

#: The distribution whose metadata carries the version.
DISTRIBUTION = "judgequeue"


def installed_version() -> str:
    """The installed distribution's version, or ``"unknown"`` when judgequeue runs uninstalled."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


VERSION = installed_version()
