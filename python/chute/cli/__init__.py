"""The ``chute`` command line (``chute.cli:main``, also ``python -m chute``):
one module per command, argument parsing in ``main``."""

from chute.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
