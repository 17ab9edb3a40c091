"""README.md's "Install on Kubernetes" section, read as a user reads it: its commands and manifests.

The tier runs what the README says, changing only what a user must change (the image they built,
their database's and Redis's addresses and passwords), so the README cannot drift from what works.
Every reader takes the README of another tree too (``readme=``): a release's own instructions, for
installing that release (tests/support/revisions.py extracts its tree).
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from tests.kube.cluster import ROOT

README = ROOT / "README.md"


def section(title: str = "## Install on Kubernetes", *, readme: Path = README) -> str:
    text = readme.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end >= 0 else None]


def blocks(language: str, *, readme: Path = README) -> list[str]:
    """The fenced code blocks of that language in the section, in order."""
    return re.findall(rf"```{language}\n(.*?)```", section(readme=readme), flags=re.S)


def commands(*, readme: Path = README) -> list[list[str]]:
    """Each shell command of the section (continuation lines joined, comments dropped), split into
    words; a word naming a file of the README's tree (``charts/judgequeue``, ``crds/...``) is made
    absolute, as the user runs it from their checkout."""
    found = []
    for block in blocks("sh", readme=readme):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command, comments=True)
            if words:
                found.append([str(readme.parent / w) if _in_tree(readme.parent, w) else w for w in words])
    return found


def _in_tree(tree: Path, word: str) -> bool:
    return "/" in word and not word.startswith(("-", "/")) and "=" not in word and (tree / word).exists()


def command(program: str, verb: str, *, readme: Path = README) -> list[str]:
    """The first command of the section that runs ``program verb``."""
    for words in commands(readme=readme):
        if len(words) > 1 and words[0] == program and words[1] == verb:
            return words
    raise LookupError(f"{readme}'s Kubernetes section has no `{program} {verb}` command")


def find(*words: str, readme: Path = README) -> list[str]:
    """The first command of the section holding ``words`` in that order (not necessarily adjacent):
    ``find("kubectl", "create", "secret")`` for ``kubectl -n ns create secret ...``."""
    for command_words in commands(readme=readme):
        rest = iter(command_words)
        if all(word in rest for word in words):
            return command_words
    raise LookupError(f"{readme}'s Kubernetes section has no command with {' '.join(words)!r}")


def manifests(*, readme: Path = README) -> list[dict[str, Any]]:
    """The YAML documents of the section (the Secrets and the JudgeQueue)."""
    docs: list[dict[str, Any]] = []
    for block in blocks("yaml", readme=readme):
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


def helm_install(image: str, *, readme: Path = README) -> list[str]:
    """The section's ``helm install``, its chart in the README's tree, with the user's image."""
    repository, tag = image.rsplit(":", 1)
    return set_value(set_value(command("helm", "install", readme=readme), "image.repository", repository),
                     "image.tag", tag)


def helm_upgrade(image: str, *, readme: Path = README) -> list[str]:
    """The section's ``helm upgrade`` with the user's image; where it shows none, its ``helm install``
    run as ``helm upgrade`` (a release is upgraded with the values it was installed with)."""
    try:
        words = command("helm", "upgrade", readme=readme)
    except LookupError:
        words = ["helm", "upgrade", *command("helm", "install", readme=readme)[2:]]
    repository, tag = image.rsplit(":", 1)
    return set_value(set_value(words, "image.repository", repository), "image.tag", tag)


def uninstall(*, readme: Path = README) -> list[list[str]]:
    """The section's uninstall commands, in order: ``kubectl delete`` of the JudgeQueues, ``helm
    uninstall``, ``kubectl delete`` of the CRDs."""
    return [w for w in commands(readme=readme) if w[:2] in (["kubectl", "delete"], ["helm", "uninstall"])]


def migrate_run(image: str, dsn: str, *, readme: Path = README) -> list[str]:
    """The section's ``kubectl run ... migrate`` (the one-off pod), with the user's image and DSN."""
    words = command("kubectl", "run", readme=readme)
    words = [f"--image={image}" if w.startswith("--image=") else w for w in words]
    return [dsn if w.startswith("postgresql://") else w for w in words]


def user_manifests(image: str, dsn: str, redis_url: str, *, readme: Path = README) -> list[dict[str, Any]]:
    """The section's Namespace, Secrets and JudgeQueue, with the user's image and connection strings."""
    docs = copy.deepcopy(manifests(readme=readme))
    kinds = [d["kind"] for d in docs]
    assert kinds == ["Namespace", "Secret", "Secret", "JudgeQueue"], kinds
    for doc in docs:
        if doc["kind"] == "Secret" and "dsn" in doc["stringData"]:
            doc["stringData"]["dsn"] = dsn
        elif doc["kind"] == "Secret":
            doc["stringData"]["url"] = redis_url
        elif doc["kind"] == "JudgeQueue":
            doc["spec"]["image"] = image
    return docs
