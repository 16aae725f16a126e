"""The engine release a measured start-up sizes for when the caller names none.

Sizing rules change between engine releases (vLLM 0.29.0 started allocating the whole KV cache
as one backing buffer, ``vllm/v1/worker/utils.py`` ``allocate_kv_cache``, where 0.28 and
earlier made one allocation per layer; the default request, block size and graph accounting
moved too: ``docs/engine-rules.md``). A start-up runs inside the engine's own process, so the
engine installed there is the release it runs: :func:`installed_release` reads it from the
interpreter's package metadata (``vllm`` first, then ``sglang``), and :func:`start_up
<memplan.engine.start_up>` sizes for it where ``engine_release`` is left ``None``. Where
neither is installed (a custom engine), the newest vLLM release memplan knows applies, as on
the command line.

The dry run (:func:`memplan.plan`, ``memplan plan``) does not look: it plans for whatever
machine and release its flags name, often not the one it runs on.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Optional, Tuple

__all__ = ["installed_release", "ENGINE_DISTRIBUTIONS"]

#: The engines whose installed release a start-up follows, in the order they are looked up
#: (PyPI distribution name, memplan's engine name).
ENGINE_DISTRIBUTIONS: Tuple[Tuple[str, str], ...] = (("vllm", "vllm"), ("sglang", "sglang"))

# The release part of a PEP 440 version: up to three numeric components ("0.28.1" of
# "0.28.1+cu126", "0.29.0" of "0.29.0rc1" or "0.29.0.dev12+g1234"; "0.10.1" of "0.10.1.1").
_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+){0,2})")


def _version_of(distribution: str) -> Optional[str]:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_release() -> Optional[Tuple[str, str]]:
    """The engine release installed in this interpreter, as ``(release, version)``:
    ``("vllm@0.28.1", "0.28.1+cu126")`` (``engine_release`` spelling, then the installed
    version as its metadata gives it), or ``None`` where neither vLLM nor SGLang is installed.

    A version whose release part cannot be read (metadata that is no version) is given as
    ``(name, version)`` with no ``@``: the start-up then refuses it, naming it, rather than
    sizing for a release it could not read.
    """
    for distribution, engine in ENGINE_DISTRIBUTIONS:
        version = _version_of(distribution)
        if version is None:
            continue
        m = _RELEASE.match(version)
        if m is None:
            return engine, version
        return f"{engine}@{m.group(1)}", version
    return None
