"""``python -m router.cli``: the ``feedrouter`` command."""

import sys

from . import main

sys.exit(main())
