"""``python -m decomposer IN OUT``: the command line, see :mod:`decomposer.cli`."""

from decomposer.cli import console_main

console_main()
