"""The process group a preflight creates, as the `group` stage's checks see it."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any


@dataclass
class Group:
    rank: int
    world_size: int
    backend: str
    device: str                 # "cpu" or "cuda:N": where collective tensors live
    timeout: float              # seconds; every collective a check issues is bounded by it
    # Checks append their figures here (e.g. measurements["all_reduce"]); merged across ranks.
    measurements: dict[str, Any] = field(default_factory=dict)

    def wait(self, work: Any) -> None:
        """Wait for an async collective, bounded by the group timeout."""
        work.wait(timedelta(seconds=self.timeout))
