"""The ``judgequeue`` command: one entry point for every role and tool."""


def main(argv: list[str] | None = None) -> int:
    return 0
