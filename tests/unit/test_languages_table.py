"""The languages table's pure parts: the class a JVM runs, the C/C++ standard a payload chooses,
languages refused with their reason, placeholders, and what a worker without a toolchain says."""

from __future__ import annotations

from pathlib import Path

import pytest

from judgequeue.core.judges.program import InvalidProgramPayload, parse_payload
from judgequeue.core.judges.program.builds import build_key
from judgequeue.core.judges.program.languages import (
    LANGUAGES,
    UNAVAILABLE,
    VALUES,
    expand,
    java_entry,
    missing_toolchain,
    scala_entry,
    template_values,
)
from tests.support.language_programs import PROGRAMS
from tests.support.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent.parent
TESTS = [{"output": ""}]


def test_java_runs_the_public_class_whatever_its_name() -> None:
    assert java_entry("public class Solution { public static void main(String[] a) {} }") == "Solution"
    # The public one, not the first; nested classes, comments and strings do not count.
    source = """
        // public class Commented {}
        class Helper { static class Inner {} String s = "public class InString {"; }
        /* public class Block {} */
        public final class Answer { class Nested {} public static void main(String[] a) {} }
    """
    assert java_entry(source) == "Answer"
    assert java_entry("class Only { public static void main(String[] a) {} }") == "Only"
    assert java_entry("") == "Main" and java_entry("public class " + "X" * 500 + " {}") == "Main"
    assert java_entry("package contest.a;\npublic class Sol {}") == "contest.a.Sol"
    assert java_entry("public record Point(int x, int y) {}") == "Point"
    values = template_values(LANGUAGES["java"], "package p;\npublic class Sol {}", None, 256)
    assert (values["entry"], values["entry_path"], values["class"]) == ("p.Sol", "p/Sol", "Sol")
    assert expand((LANGUAGES["java"].source,), "/box", {}, values) == ["Sol.java"]
    run = expand(LANGUAGES["java"].run, "/box", {"ld.so": "/ld", "jdk": "/jdk"}, values)
    assert run[-3:] == ["-cp", "/box", "p.Sol"] and "-Xmx256m" in run


def test_scala_runs_its_main_object_or_main_method() -> None:
    assert scala_entry("object Sum {\n def main(args: Array[String]): Unit = ()\n}") == "Sum"
    assert scala_entry("@main def solve(): Unit = println(1)") == "solve"
    assert scala_entry("class A { object Inner }\nobject Outer") == "Outer"


def test_the_standard_is_chosen_per_submission_and_validated() -> None:
    assert parse_payload({"language": "c", "source": "", "tests": TESTS}).std is None
    assert parse_payload({"language": "cpp", "source": "", "tests": TESTS, "std": "c++20"}).std == "c++20"
    assert template_values(LANGUAGES["c"], "", None, 64)["std"] == "gnu17"
    assert template_values(LANGUAGES["cpp"], "", None, 64)["std"] == "gnu++17"
    assert template_values(LANGUAGES["cpp"], "", "c++23", 64)["std"] == "c++23"
    with pytest.raises(InvalidProgramPayload, match=r"std must be one of c\+\+11, .*gnu\+\+23 for cpp, got 'c17'"):
        parse_payload({"language": "cpp", "source": "", "tests": TESTS, "std": "c17"})
    with pytest.raises(InvalidProgramPayload, match=r"std: python has no standard to choose \(only c, cpp do\), got 3"):
        parse_payload({"language": "python", "source": "", "tests": TESTS, "std": 3})
    package = {"problem": "p", "version": 1, "language": "c", "source": "", "std": "c11"}
    assert parse_payload(package).std == "c11"


def test_languages_contests_offer_that_cannot_run_here_are_refused_with_the_reason() -> None:
    for name, why in UNAVAILABLE.items():
        assert name not in LANGUAGES
        with pytest.raises(InvalidProgramPayload, match=f"language '{name}' is not offered here: "):
            parse_payload({"language": name, "source": "", "tests": TESTS})
        assert why
    with pytest.raises(InvalidProgramPayload, match="language must be one of c, cpp, java, "):
        parse_payload({"language": "cobol", "source": "", "tests": TESTS})


def test_every_template_names_only_tools_and_submission_values() -> None:
    for name, lang in LANGUAGES.items():
        assert not lang.tools() & VALUES, name
        # A build depends on the source and the standard, never on the test's limits: kept builds
        # (core/judges/program/builds.py) are shared by submissions with different limits.
        assert not any("{memory_mb}" in part or "{stack_kb}" in part for part in lang.compile or ()), name
        assert lang.title and lang.notes and (lang.toolchain.debian or lang.toolchain.maven or name == "java")
        assert (lang.default_standard in lang.standards) if lang.standards else lang.default_standard is None


def test_a_worker_without_a_toolchain_says_what_is_missing_and_where_it_comes_from() -> None:
    assert missing_toolchain(LANGUAGES["rust"], {"rustc": "/usr/bin/rustc", "gcc": "/usr/bin/gcc"}) is None
    why = missing_toolchain(LANGUAGES["rust"], {"gcc": "/usr/bin/gcc"})
    assert why == (
        "no rust toolchain on this worker: rustc missing "
        "(install Debian packages rustc-web: scripts/install --languages=rust)"
    )
    kotlin = missing_toolchain(LANGUAGES["kotlin"], {})
    assert kotlin is not None and "Maven Central org.jetbrains.kotlin:kotlin-compiler-embeddable:" in kotlin


def test_the_docs_languages_table_is_generated_from_the_code() -> None:
    """docs/judges.md's table is scripts/gen_language_table.py's output: a language changed in the
    code and not in the doc (or the other way round) fails here."""
    module = load_script("gen_language_table")
    doc = (ROOT / "docs" / "judges.md").read_text()
    assert module.render(doc) == doc, "docs/judges.md is stale: run .venv/bin/python scripts/gen_language_table.py"
    for name in (*LANGUAGES, *UNAVAILABLE):
        assert f"| `{name}` |" in doc
    # Every row is judged for real by tests/process/test_languages.py, from these programs.
    assert set(PROGRAMS) == set(LANGUAGES)


def test_a_kept_build_is_keyed_by_the_files_beside_the_source_too() -> None:
    """Two submissions with the same main source and other files (a header it includes, a module it
    imports) are two builds; the files' order in the payload does not matter."""
    argv, tools = ["/usr/bin/g++", "-std=gnu++17", "main.cpp"], {"g++": "/usr/bin/g++"}
    one = build_key("cpp", argv, "int main() {}", tools, ["g++"], [("k.h", b"#define K 1\n")])
    two = build_key("cpp", argv, "int main() {}", tools, ["g++"], [("k.h", b"#define K 2\n")])
    assert one != two != build_key("cpp", argv, "int main() {}", tools, ["g++"])
    both = [("a.h", b"a"), ("b.h", b"b")]
    assert build_key("cpp", argv, "", tools, [], both) == build_key("cpp", argv, "", tools, [], both[::-1])
