"""A bad piece of input, as plain data: domain functions yield it without importing Beam."""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rejected:
    """A bad piece of input, reported by a stage function without failing the rest.

    The stage that ran the function turns it into a dead-letter row with this reason, unless
    `transient` says the producer gave up on a fault that is not the input's (an endpoint that
    stayed unreachable through its own retries): the stage then raises, so the runner retries the
    bundle instead of losing the input (transforms/io/transient.py).
    """

    reason: str
    excerpt: Any
    error_type: str = "Rejected"
    transient: bool = False


@dataclass(frozen=True)
class Skipped:
    """An input a stage chose to make nothing of, for a reason worth counting but no error (a page
    with too few links for a task, a task that needs a backend the run does not have).

    The stage counts it per reason in the manifest (`stages.NAME.skipped`); it is neither output
    nor a dead letter, so it does not count towards --max-error-rate.
    """

    reason: str
    count: int = 1


def describe(exc: BaseException) -> str:
    """A dead letter's reason for an exception: its message and where it was raised."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame else ""
    return f"{exc}{where}"


def rejected(exc: BaseException, element: Any) -> Rejected:
    """The Rejected a stage makes of an input whose function raised `exc`."""
    return Rejected(describe(exc), element, type(exc).__name__)
