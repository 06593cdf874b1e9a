"""One kernel build per machine: a second process of any entry point imports the library the first one built.

On a first-generation Zen the kernels were compiled three times on one clone (the demo, then `specdecode
generate`, then the test set-up), each a minute or two of both cores: PyTorch's loader runs ninja, which rebuilds
when a command line changes (a compiler wrapper such as ccache found on PATH is written into it) or when a header is
newer than an object (a venv made again holds new torch headers). The test gives a copy of this machine's finished
build both causes at once (objects dated 1970, a `ccache` on PATH that logs every compile), then starts each entry
point the way users start it: none may compile.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdecode import kernels
from specdecode.cachefiles import cache_dir
from testlib import SMOLLM2

ROOT = Path(__file__).resolve().parents[1]
DEMO_AND_TEST_SETUP = "from specdecode import kernels; assert kernels.load_kernel() is not None, kernels.kernel_status()"
PYTHON_API = f"""
from specdecode.build import EngineOptions, build_engine
engine, _ = build_engine(EngineOptions(model={SMOLLM2!r}, draft="none"))
assert engine.generate("Hello", max_new_tokens=2).token_ids
"""
ENTRY_POINTS = {
    "demo and test set-up": [sys.executable, "-c", DEMO_AND_TEST_SETUP],
    "cli generate": [sys.executable, "-m", "specdecode.cli", "generate", "--model", SMOLLM2, "--draft", "none",
                     "--max-new-tokens", "2", "Hello"],
    "python api": [sys.executable, "-c", PYTHON_API],
}


@pytest.fixture
def copied_build(tmp_path):
    """(environment, the build folder): a cache folder whose kernel build is a copy of this machine's (file times
    kept), every other part of the cache shared."""
    if kernels.load_kernel() is None:
        pytest.skip(f"the CPU kernel is unavailable ({kernels.kernel_status()})")
    real, cache = cache_dir(), tmp_path / "cache"
    cache.mkdir()
    for entry in real.iterdir():
        if entry.name != "kernels":
            (cache / entry.name).symlink_to(entry)
    build = cache / "kernels" / kernels.kernel_build_dir().name
    shutil.copytree(kernels.kernel_build_dir(), build, ignore=shutil.ignore_patterns("*.flock", "lock"))
    return {**os.environ, "SPECDECODE_CACHE": str(cache)}, build


@pytest.fixture
def machine_with_one_build(copied_build, tmp_path):
    """The copied build given both causes of a rebuild: objects dated 1970, and a PATH whose `ccache` (which
    PyTorch writes into the compile commands) logs each call and runs the compiler."""
    env, build = copied_build
    for obj in build.glob("*.o"):
        os.utime(obj, (0, 0))
    wrappers = tmp_path / "bin"
    wrappers.mkdir()
    ccache = wrappers / "ccache"
    ccache.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "compiles.log"}\nexec "$@"\n')
    ccache.chmod(0o755)
    return {**env, "PATH": f"{wrappers}:{env['PATH']}"}, build


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_second_process_compiles_nothing(machine_with_one_build, entry, tmp_path):
    env, build = machine_with_one_build
    library = build / "specdecode_skinny_linear.so"
    before = library.stat()
    result = subprocess.run(ENTRY_POINTS[entry], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    compiles = tmp_path / "compiles.log"
    assert not compiles.exists(), f"{entry} compiled:\n{compiles.read_text()[:2000]}"
    assert "compiling the CPU kernels" not in result.stderr, result.stderr[-2000:]
    after = library.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_folder_without_a_whole_mark_is_built_again_under_the_lock(machine_with_one_build, monkeypatch):
    """A build killed before it finished leaves no mark, and a damaged mark names no identity: the next process
    builds (under the folder's flock) instead of importing what lies there."""
    env, build = machine_with_one_build
    monkeypatch.setattr(kernels.native, "kernel_build_dir", lambda: build)
    built = []
    monkeypatch.setattr(kernels.native, "_build", lambda folder: built.append(folder) or "rebuilt")
    assert kernels.native._load_or_build() is not None and not built  # marked: imported
    mark = build / kernels.native.BUILT_MARK
    for damage in (lambda: mark.write_text('{"identity": "another build"}'), mark.unlink):
        damage()
        assert kernels.native._load_or_build() == "rebuilt"
    assert built == [build, build]


def test_a_build_killed_mid_way_is_finished_by_the_next_process(copied_build):
    """A killed build leaves PyTorch's plain lock file (every later load through PyTorch waited on it forever) and no
    mark: the next process, holding the folder's flock, removes the lock, builds (here ninja finds the copied objects
    up to date) and marks the build."""
    env, build = copied_build
    (build / kernels.native.BUILT_MARK).unlink()
    (build / "lock").touch()
    result = subprocess.run(ENTRY_POINTS["demo and test set-up"], cwd=ROOT, capture_output=True, text=True, timeout=240,
                            env={**env, "TORCH_NO_COMPILER_WRAPPER": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (build / "lock").exists() and (build / kernels.native.BUILT_MARK).is_file()
