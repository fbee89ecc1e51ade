"""``python -m arrowload``: the same as the ``arrowload`` command."""

import sys

from .cli import main

sys.exit(main())
