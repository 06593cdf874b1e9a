"""`specdecode serve` as the command runs it without Ray (--replicas N on a local Ray cluster: test_cluster.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import MODEL

NO_RAY = f"""
import sys
import uvicorn
uvicorn.Server.run = lambda self, *args, **kwargs: None  # build the whole server, serve nothing
from specdecode.cli import main
for replicas in ([], ["--replicas", "1"]):
    assert main(["serve", "--model", "{MODEL}", "--draft", "none", "--ctx", "256", "--threads", "1", *replicas]) == 0
assert "ray" not in sys.modules, sorted(m for m in sys.modules if m.startswith("ray"))
print("no ray")
"""


@pytest.mark.parametrize("flags, message", [
    (["--replicas", "0"], "--replicas must be at least 1"),
    (["--ray-address", "auto"], "apply with --replicas 2 or more"),
    (["--replicas", "1", "--threads-per-replica", "2"], "apply with --replicas 2 or more"),
    (["--replicas", "2", "--threads-per-replica", "0"], "--threads-per-replica must be at least 1"),
    (["--replicas", "2", "--threads", "2"], "--threads-per-replica"),
    (["--header-timeout", "0"], "--header-timeout must be a positive number of seconds"),
    (["--body-timeout", "nan"], "--body-timeout must be a positive number of seconds"),
    (["--limit-concurrency", "0"], "--limit-concurrency must be at least 1"),
])
def test_bad_replica_flags_are_refused_before_loading_anything(flags, message, capsys):
    from specdecode.cli import main

    assert main(["serve", *flags]) == 2
    assert message in capsys.readouterr().err


def test_one_replica_is_the_one_process_server_without_ray():
    done = subprocess.run([sys.executable, "-c", NO_RAY], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "no ray" in done.stdout, done.stdout + done.stderr
