"""A bad piece of input, as plain data: domain functions yield it without importing Beam."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rejected:
    """A bad piece of input, reported by a stage function without failing the rest.

    The stage that ran the function turns it into a dead-letter row with this reason.
    """

    reason: str
    excerpt: Any
    error_type: str = "Rejected"
