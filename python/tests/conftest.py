"""Shared fixtures: the installed wheel's `memplan` script, and the Rust binary to compare
with (``MEMPLAN_CLI``, set by ``cargo xtask python``; absent when pytest runs by hand)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, List, Optional, Tuple

import pytest

# Ray in these tests stays on the loopback: with cluster mode off, every Ray process resolves
# its node address to 127.0.0.1 (ray/_private/services.py get_node_ip_address) instead of the
# machine's interface. Read when Ray is imported, so it is set before any test imports it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

MODEL = "qwen2.5-1.5b-instruct"
DEVICE = "sim:rtx4090"


@pytest.fixture(autouse=True)
def no_installed_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs as if neither vLLM nor SGLang were installed here, whatever this
    interpreter holds: a start-up that names no release would otherwise size for the
    installed one (memplan._release). Tests of that rule patch `_version_of` themselves."""
    monkeypatch.setattr("memplan._release._version_of", lambda _dist: None)


def _script() -> Optional[str]:
    here = Path(sys.executable).parent
    return shutil.which("memplan", path=str(here)) or shutil.which("memplan")


@pytest.fixture(scope="session")
def script() -> str:
    """The `memplan` console script the wheel installed next to this interpreter."""
    path = _script()
    if path is None:
        pytest.fail("the wheel's `memplan` script is not installed next to this interpreter")
    return path


def run(cmd: List[str]) -> Tuple[int, Any, str]:
    """Run a command; return its exit code, its stdout as JSON (or text), its stderr."""
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    try:
        out: Any = json.loads(p.stdout)
    except ValueError:
        out = p.stdout
    return p.returncode, out, p.stderr


@pytest.fixture(scope="session")
def clis(script: str) -> List[str]:
    """Every command line to compare the API with: the wheel's script, and the Rust binary
    when ``MEMPLAN_CLI`` names one (``cargo xtask python`` sets it; required under CI)."""
    out = [script]
    binary = os.environ.get("MEMPLAN_CLI")
    if binary:
        assert Path(binary).is_file(), f"MEMPLAN_CLI={binary} does not exist"
        out.append(binary)
    elif os.environ.get("CI"):
        pytest.fail("CI must set MEMPLAN_CLI to the Rust `memplan` binary")
    return out
