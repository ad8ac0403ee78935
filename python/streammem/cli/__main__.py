"""``python -m streammem.cli``: the ``streammem`` command."""
import sys

from . import main

sys.exit(main())
