"""``python -m gpufold``: the same as the ``gpufold`` console script."""

import sys

from gpufold.cli import main

sys.exit(main())
