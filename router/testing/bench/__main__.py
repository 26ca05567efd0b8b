"""``python -m router.testing.bench``."""

import sys

from .report import main

sys.exit(main())
