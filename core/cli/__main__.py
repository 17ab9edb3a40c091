"""``python -m judgequeue.core.cli``: the ``judgequeue`` command."""

import sys

from . import main

sys.exit(main())
