"""The package formats and the problem kinds the program judge knows, declared once: the archive
readers write them into a stored manifest and the judge reads them back from it."""

#: Whose verdict rules a package's submissions are judged by: judgequeue's own, ICPC/Kattis
#: (problemtools' rules) or Polygon (testlib's).
FORMATS = ("judgequeue", "kattis", "polygon")
#: How a submission meets a test: its program run on the input (batch), its program talking to the
#: problem's interactor, or an output submitted for each test (output-only).
KINDS = ("batch", "interactive", "output-only")
