"""``python -m streammem.cli``: the ``streammem`` command."""
from . import console_main

console_main()
