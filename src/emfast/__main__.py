"""``python -m emfast``: the same as the ``emfast`` command."""
import sys

from .cli import main

sys.exit(main())
