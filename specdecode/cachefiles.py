"""Files in the model cache that several processes share: locks, temporary names, and what a killed process left.

    with locked(lock_path("converted", folder.name)):   # one converter per folder; others wait, then reuse
        tmp = Path(tempfile.mkdtemp(dir=..., prefix=temp_prefix(".convert")))

A lock is an flock, so it dies with its process (a SIGKILL leaves no lock behind). A temporary is named with
its owner (pid and the pid space it lives in), so a later process can tell a temporary whose owner is gone
from one still being written; `sweep` removes those, and any older than STALE_AFTER_S.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# A temporary untouched this long is dead whoever owns it (a pull writes its file continuously, a conversion
# takes a minute or two).
STALE_AFTER_S = 3600.0
# The temporaries of the cache: pulls and conversions (folders), blocks files written into a converted folder.
TEMP_PATTERNS = (".pull-*", ".convert*", ".gguf_blocks-*.tmp", ".matrices.safetensors~*.tmp")
_OWNER = re.compile(r"~(\d+)@([0-9a-f]{8})~")


def _pid_space() -> str:
    """Which processes a pid names: the same host, kernel boot and pid namespace give the same value."""
    parts = [socket.gethostname()]
    for source in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(os.readlink(source) if source.endswith("/pid") else Path(source).read_text().strip())
        except OSError:
            parts.append("?")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:8]


PID_SPACE = _pid_space()


def temp_prefix(kind: str) -> str:
    """A temporary's name prefix, carrying its owner: '.convert~1234@0a1b2c3d~'."""
    return f"{kind}~{os.getpid()}@{PID_SPACE}~"


def cache_dir() -> Path:
    """Where assembled models, converted folders and compiled kernels live; SPECDECODE_CACHE overrides the default."""
    root = os.environ.get("SPECDECODE_CACHE") or Path.home() / ".cache" / "specdecode"
    return Path(root)


def lock_path(*names: str) -> Path:
    """The lock file for one cached thing (locks live apart, so cache folders list only models)."""
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


def _owner_alive(name: str) -> bool | None:
    """Whether the process that named this temporary runs; None when the name does not tell (an older format,
    or a process of another host or pid namespace)."""
    match = _OWNER.search(name)
    if match is None or match.group(2) != PID_SPACE:
        return None
    pid = int(match.group(1))
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _last_touched(path: Path) -> float:
    """The newest mtime of a temporary and, for a folder, of what it holds (a pull's file grows inside it)."""
    try:
        times = [path.lstat().st_mtime]
        if path.is_dir() and not path.is_symlink():
            times += [child.lstat().st_mtime for child in path.iterdir()]
        return max(times)
    except OSError:  # vanished meanwhile (its owner finished)
        return time.time()


def is_stale(path: Path, now: float | None = None) -> bool:
    alive = _owner_alive(path.name)
    if alive is False:
        return True
    return (now or time.time()) - _last_touched(path) > STALE_AFTER_S


def sweep(folder: Path, patterns=TEMP_PATTERNS) -> list[Path]:
    """Remove the stale temporaries directly inside `folder`; returns what was removed."""
    removed = []
    if not folder.is_dir():
        return removed
    now = time.time()
    for pattern in patterns:
        for path in folder.glob(pattern):
            if not is_stale(path, now):
                continue
            try:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.append(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                print(f"specdecode: could not remove the stale temporary {path} ({exc})", file=sys.stderr)
    return removed


def remove_quietly(path: Path) -> None:
    """Cleanup in a `finally`: a temporary file or folder, gone or not."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass
