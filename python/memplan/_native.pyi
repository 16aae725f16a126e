"""Type stubs of the native module (PyO3). Use the functions of :mod:`memplan` instead."""

from typing import Sequence, Tuple

__version__: str

def run_json(argv: Sequence[str]) -> Tuple[int, str]:
    """Run ``memplan <argv>`` (which must ask for ``--json``) in this process; return its
    exit code and the JSON it would print (the answer, or the error envelope). Never raises
    for a failure of the command: a caught panic is an ``internal`` error envelope."""

def main(argv: Sequence[str]) -> int:
    """Run ``memplan <argv>`` exactly as the binary does (printing to this process's stdout
    and stderr) and return its exit code."""

def _panic_for_test(message: str) -> Tuple[int, str]:
    """Panic inside the wrapper every call runs in; returns the ``internal`` envelope."""

