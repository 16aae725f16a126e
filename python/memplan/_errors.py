"""Exceptions raised by memplan: one base class, one subclass per exit class.

Every failure the command line reports under ``--json`` as an error envelope
(``{"schema": "memplan.error/1", "error": {"kind": ..., "message": ...}}``) is raised here as
a :class:`MemplanError` carrying that envelope. A Rust panic never crosses into Python: the
native module catches it and reports it as kind ``"internal"``.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "MemplanError",
    "UsageError",
    "ArgumentTypeError",
    "MeasurementError",
    "DoesNotFitError",
    "OutOfMemoryError",
    "InternalError",
    "ClusterError",
    "from_envelope",
]


class MemplanError(Exception):
    """A failure reported by memplan.

    Attributes:
        kind: the error's kind as the CLI's JSON error envelope names it (``"usage"``,
            ``"does_not_fit"``, ``"unavailable"``, ``"measurement"``, ``"invalid_file"``,
            ``"did_not_start"``, ...).
        message: the one-line message the CLI prints.
        exit_code: the exit code the command line gives for it (2 usage, 1 other failures).
        envelope: the whole JSON error envelope as a dict.
        help: what still helps, from the envelope (e.g. ``max_model_len_fit``, the longest
            ``max_model_len`` that fits; the presets of an unknown model); may be empty.
    """

    kind: str
    message: str
    exit_code: int
    envelope: Dict[str, Any]

    def __init__(
        self,
        message: str,
        kind: str = "error",
        exit_code: int = 1,
        envelope: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.exit_code = exit_code
        self.envelope = dict(envelope) if envelope is not None else {
            "error": {"kind": kind, "message": message}
        }

    @property
    def help(self) -> Dict[str, Any]:
        err = self.envelope.get("error")
        h = err.get("help") if isinstance(err, dict) else None
        return dict(h) if isinstance(h, dict) else {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, message={self.message!r})"


class UsageError(MemplanError, ValueError):
    """Bad input: a flag value out of range, an unknown dtype, model or device, a missing
    required argument, an unknown keyword (the CLI's exit code 2). Also a ``ValueError``."""


class ArgumentTypeError(UsageError, TypeError):
    """An argument of the wrong Python type: a dict where a number goes, a bool for a count,
    an object that is no engine. A :class:`UsageError` (exit code 2) and a ``TypeError``."""


class MeasurementError(MemplanError):
    """The device could not be read or driven: a backend that is unavailable here, a driver
    call that failed, a reading that could not be taken, out of device memory."""


class DoesNotFitError(MemplanError):
    """The model does not fit the requested memory (not even one KV block, or the weights
    alone exceed the budget). ``envelope["error"]`` says what still helps."""


class OutOfMemoryError(DoesNotFitError, MeasurementError):
    """The device ran out of memory during a step of a measured start-up: the message names
    the step and what the device and the engine's allocator held; ``help`` has ``step`` and
    ``requested_bytes``. A :class:`DoesNotFitError` (what a dry run of the same settings
    raises when it sees the model cannot fit; when the dry run refuses too, the start-up
    raises that refusal instead) and a :class:`MeasurementError`."""


class InternalError(MemplanError):
    """A bug in memplan (a Rust panic caught at the boundary, unreadable output). Please
    report it with the message."""


class ClusterError(MemplanError):
    """A cluster could not be used: Ray is not installed (kind ``ray_not_installed``), no
    cluster answers at the address (``cluster_unreachable``), or the cluster could not place
    or run the probe tasks in time (``placement_timeout``, ``cluster``)."""


# The CLI's failure kinds (crates/memplan-cli: the output contract) that mean the device or
# its backend could not be read or driven.
_MEASUREMENT_KINDS = (
    "measurement",
    "unavailable",
    "device",
    "driver",
    "out-of-memory",
)


def _class_for(kind: str, exit_code: int) -> Type[MemplanError]:
    k = kind.lower().replace("_", "-")
    if k in ("internal", "panic", "bug"):
        return InternalError
    if k == "type":
        return ArgumentTypeError
    if exit_code == 2 or k in ("usage", "unknown-device"):
        return UsageError
    if k == "out-of-memory":
        return OutOfMemoryError
    if "fit" in k:
        return DoesNotFitError
    if any(m in k for m in _MEASUREMENT_KINDS):
        return MeasurementError
    return MemplanError


def from_envelope(exit_code: int, envelope: Any) -> MemplanError:
    """The exception for one error envelope the CLI printed with the given exit code."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("error"), dict):
        return InternalError(
            f"memplan exited {exit_code} without a JSON error envelope: {envelope!r}",
            kind="internal",
            exit_code=exit_code,
        )
    err = envelope["error"]
    kind = str(err.get("kind", "error"))
    message = str(err.get("message", "")) or kind
    cls = _class_for(kind, exit_code)
    return cls(message, kind=kind, exit_code=exit_code, envelope=envelope)


def a_type(value: object) -> str:
    """The type of ``value`` with its article, as messages say it: ``"a str"``, ``"an int"``,
    ``"an object"``. ``an`` before a vowel sound: a name that starts with a, e, i or o, or with
    a u not said "you" (``uni``, ``use``, ``usu``, ``uti``, ``uu`` are)."""
    name = type(value).__name__
    low = name.lower()
    you = low.startswith(("uni", "use", "usu", "uti", "uu"))
    vowel = low[:1] in ("a", "e", "i", "o") or (low[:1] == "u" and not you)
    return f"{'an' if vowel else 'a'} {name}"
