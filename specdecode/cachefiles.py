"""Files in the model cache that several processes share: one lock per cached thing.

    with locked(lock_path("converted", folder.name)):   # one converter per folder; others wait, then reuse

A lock is an flock, so it dies with its process (a SIGKILL leaves no lock behind).
"""
from __future__ import annotations

import fcntl
import sys
from contextlib import contextmanager
from pathlib import Path


def lock_path(*names: str) -> Path:
    """The lock file for one cached thing (locks live apart, so cache folders list only models)."""
    from .registry import cache_dir

    return cache_dir() / "locks" / ("-".join(names) + ".lock")


@contextmanager
def locked(path: Path, waiting_message: str | None = None):
    """Hold an exclusive flock on `path` (created if missing) for the block. Prints `waiting_message` to stderr
    when another process holds it. The file stays: removing a lock file others may have opened breaks the lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting_message:
                print(waiting_message, file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
