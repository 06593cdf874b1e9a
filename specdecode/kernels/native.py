"""Compiling and loading the native CPU kernels (one PyTorch C++ extension), once per machine.

The extension is built by the first process that needs it into a folder keyed by what the library depends on
(sources, flags, torch and Python versions), under a file lock that dies with its process; every later process on
the machine imports that library without running a compiler or ninja. Without a compiler or AVX2/FMA the
kernels are unavailable and every product falls back to torch (same outputs per path, slower).
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import platform
import sys
import threading
import time
from pathlib import Path

import torch

from . import options

_lock = threading.Lock()
_kernel = None  # the loaded extension module; None until loaded, or where unavailable
_kernel_failed: str | None = None
KERNEL_MODULE = "specdecode_skinny_linear"
BUILT_MARK = "built.json"  # written after a build finishes: what was built, and how long it took


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _cpu_has_avx2_fma() -> bool:
    return {"avx2", "fma", "f16c"} <= _cpu_flags()


def isa_build_flags() -> list[str]:
    """The int8 kernel's faster paths (AVX-512 VNNI, AMX) compiled only where this CPU runs them: a first build on
    an AVX2-only CPU compiles one copy of the kernel instead of three. SPECDECODE_KERNEL_ISAS=all compiles every
    path (a build for other machines). Every path gives the same bits; the flags only decide which exist."""
    flags = _cpu_flags()
    every = options.OPTIONS.build_every_isa
    vnni = every or {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags
    amx = every or (vnni and {"amx_tile", "amx_int8"} <= flags)
    return [f"-DQD_BUILD_VNNI={int(vnni)}", f"-DQD_BUILD_AMX={int(amx)}"]


_HERE = Path(__file__).parent
# Longest compiles first (the three instruction-set paths of the int8 product, most of the build's CPU, then
# bindings.cpp): ninja starts them in this order, so on two cores the others fill in around them instead of a long
# one starting last and running alone.
KERNEL_SOURCES = [_HERE / name for name in ("quant_dot_amx.cpp", "quant_dot_vnni.cpp", "quant_dot.cpp", "bindings.cpp", "skinny_linear.cpp",
                                            "gguf_linear.cpp", "int8_layer.cpp", "block_attention.cpp")]
KERNEL_HEADERS = [_HERE / name for name in ("avx2_math.h", "kernels.h", "quant_dot_impl.h", "quant_dot_paths.h")]
KERNEL_CFLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp"]
# GCC frees the memory of its parse trees by garbage collection, tuned for machines far smaller than today's: it
# collects each time its heap grows by a small step. Collecting only past 1 GB (the longest file peaks at ~1.4 GB)
# took ~15% off a first build's CPU, with object files byte for byte the same. GCC's own flag: clang would refuse it.
GCC_HEAP_FLAGS = ["--param", "ggc-min-expand=400", "--param", "ggc-min-heapsize=1048576"]


@functools.cache
def _compiler_is_gcc() -> bool:
    """Whether the compiler PyTorch builds the extension with ($CXX, else c++) is GCC, as PyTorch itself tells."""
    from torch.utils.cpp_extension import check_compiler_is_gcc, get_cxx_compiler

    return check_compiler_is_gcc(get_cxx_compiler())


def kernel_cflags() -> list[str]:
    return KERNEL_CFLAGS + (GCC_HEAP_FLAGS if _compiler_is_gcc() else []) + isa_build_flags()


def _build_identity() -> bytes:
    """Everything the compiled library depends on: the sources' and headers' content, the flags, the torch version
    and the Python ABI (the library links against both). Not the checkout's path, the venv's path, the files'
    times or GCC's memory settings (same objects): two clones of the same sources, or a venv made again, use one
    build, and finding it runs no compiler."""
    parts = [*KERNEL_CFLAGS, *isa_build_flags(), torch.__version__, sys.implementation.cache_tag, platform.machine()]
    digest = hashlib.sha256("\n".join(parts).encode())
    for path in [*KERNEL_SOURCES, *KERNEL_HEADERS]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest().encode()


def kernel_build_dir() -> Path:
    """One build folder per machine and build identity (_build_identity), under the cache folder."""
    from ..registry import cache_dir

    return cache_dir() / "kernels" / _build_identity().decode()[:16]


def _import_built(build_dir: Path):
    """The library a finished build left in build_dir, imported as is: no compiler and no ninja run. None where
    no build there has finished (its mark is written last, after the library)."""
    mark, library = build_dir / BUILT_MARK, build_dir / f"{KERNEL_MODULE}.so"
    if not (mark.is_file() and library.is_file()):
        return None
    try:
        if json.loads(mark.read_text()).get("identity") != _build_identity().decode():
            return None
        spec = importlib.util.spec_from_file_location(KERNEL_MODULE, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except (OSError, ValueError, ImportError) as exc:  # a damaged folder is built again, not trusted
        print(f"specdecode: the compiled kernel in {build_dir} does not load ({exc}); building it again", file=sys.stderr)
        mark.unlink(missing_ok=True)
        return None


def _build(build_dir: Path):
    """Compile the extension into build_dir (the caller holds the folder's flock) and mark the build finished.

    PyTorch's loader runs ninja, which decides what to rebuild from command lines (a compiler wrapper such as
    ccache found on PATH changes them) and file times (a venv made again holds newer torch headers): either made
    a second process compile everything again. So only the first build goes through it; later processes import
    the finished library (_import_built)."""
    from torch.utils.cpp_extension import load

    print("specdecode: compiling the CPU kernels for this CPU (once per machine, about a minute on two cores) ...", file=sys.stderr)
    started = time.perf_counter()
    # PyTorch's own build lock is a plain file: a build killed mid-way (SIGTERM, SIGKILL) leaves it behind and
    # every later load waits on it forever. Under our flock no other build of ours runs, so a leftover goes.
    (build_dir / "lock").unlink(missing_ok=True)
    module = load(name=KERNEL_MODULE, sources=[str(path) for path in KERNEL_SOURCES], extra_cflags=kernel_cflags(),
                  extra_ldflags=["-fopenmp"], build_directory=str(build_dir), verbose=False)
    record = {"identity": _build_identity().decode(), "seconds": round(time.perf_counter() - started, 1)}
    partial = build_dir / f"{BUILT_MARK}.partial"
    partial.write_text(json.dumps(record))
    partial.replace(build_dir / BUILT_MARK)  # atomic: a reader sees no mark or a whole one
    return module


def _load_or_build():
    build_dir = kernel_build_dir()
    module = _import_built(build_dir)
    if module is not None:
        return module
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / "build.flock", "w") as guard:  # an flock dies with its process
        fcntl.flock(guard, fcntl.LOCK_EX)
        return _import_built(build_dir) or _build(build_dir)  # another process may have finished it meanwhile


def load_kernel():
    """The extension, compiled the first time any process on this machine asks (cached on disk), or None with a
    reason kept."""
    global _kernel, _kernel_failed
    if _kernel is not None or _kernel_failed is not None:
        return _kernel
    with _lock:
        if _kernel is not None or _kernel_failed is not None:
            return _kernel
        if options.OPTIONS.disabled:
            _kernel_failed = "disabled by SPECDECODE_NO_KERNEL"
            return None
        if not _cpu_has_avx2_fma():
            _kernel_failed = "CPU lacks AVX2/FMA"
            return None
        try:
            _kernel = _load_or_build()
        except Exception as exc:  # a missing compiler must not stop inference, only slow it
            _kernel_failed = f"{type(exc).__name__}: {exc}"
            print(f"specdecode: CPU kernel unavailable, using torch matmul ({_kernel_failed})", file=sys.stderr)
            _kernel = None
        return _kernel


def kernel_status() -> str:
    if _kernel is not None:
        return "skinny-avx2"
    return f"torch ({_kernel_failed})" if _kernel_failed else "not loaded"
