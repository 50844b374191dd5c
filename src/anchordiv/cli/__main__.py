"""``python -m anchordiv.cli``."""

from . import main

main()
