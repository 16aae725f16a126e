"""The ``memplan`` console script of the wheel: the CLI's own main, in-process."""

from __future__ import annotations

import sys


def main() -> None:
    """Entry point of the ``memplan`` script: exits with the CLI's exit code."""
    from . import main as run

    sys.exit(run())


if __name__ == "__main__":
    main()
