"""``python -m anchordiv.experiments PROTOCOL ...``: the ``eval`` command on its own."""

from .cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
