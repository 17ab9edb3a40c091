"""README.md's "Install on Kubernetes" section, read as a user reads it: its commands and manifests.

The tier runs what the README says, changing only what a user must change (the image they built,
their database's and Redis's addresses and passwords), so the README cannot drift from what works.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

from tests.kube.cluster import ROOT

README = ROOT / "README.md"


def section(title: str = "## Install on Kubernetes") -> str:
    text = README.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end >= 0 else None]


def blocks(language: str) -> list[str]:
    """The fenced code blocks of that language in the section, in order."""
    return re.findall(rf"```{language}\n(.*?)```", section(), flags=re.S)


def commands() -> list[list[str]]:
    """Each shell command of the section (continuation lines joined, comments dropped), split into words."""
    found = []
    for block in blocks("sh"):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if words:
                found.append(words)
    return found


def command(program: str, verb: str) -> list[str]:
    """The first command of the section that runs ``program verb``."""
    for words in commands():
        if len(words) > 1 and words[0] == program and words[1] == verb:
            return words
    raise LookupError(f"README's Kubernetes section has no `{program} {verb}` command")


def manifests() -> list[dict[str, Any]]:
    """The YAML documents of the section (the Secrets and the JudgeQueue)."""
    docs: list[dict[str, Any]] = []
    for block in blocks("yaml"):
        docs += [d for d in yaml.safe_load_all(block) if d]
    return docs


def set_value(words: list[str], key: str, value: str) -> list[str]:
    """``words`` with ``--set key=...`` replaced (or added) by ``--set key=value``."""
    out: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word == "--set" and i + 1 < len(words) and words[i + 1].startswith(f"{key}="):
            skip = True
            continue
        out.append(word)
    return [*out, "--set", f"{key}={value}"]
