"""`python -m tokenwire.engines.embedded CONFIG_JSON`: the engine process (core.py)."""

import sys

from .core import main

sys.exit(main())
