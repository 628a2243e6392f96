"""The history a path names: a SQLite file (database.History) or an s3:// prefix (s3_bucket.S3History),
both with add(records) -> None or why not, and records(host=, instance_type=, limit=)."""
from __future__ import annotations

from typing import Any, Callable

from ddp_doctor.history.database import History
from ddp_doctor.history.s3_bucket import S3History


def open_history(where: str, stop: Callable[[float], Any] | None = None) -> Any:
    """`stop(s)`: a wait for a stop signal (SignalCatcher.wait_new) that cuts an S3 history's
    bounded write or read short; a local file's are short and local, and take none."""
    return S3History(where, stop=stop) if where.startswith("s3://") else History(where)
