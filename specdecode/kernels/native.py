"""Compiling and loading the native CPU kernels (one PyTorch C++ extension), once per machine.

The extension is built on first use into a folder keyed by the sources' content, the flags and the
torch version, under a file lock that dies with its process. Without a compiler or AVX2/FMA the
kernels are unavailable and every product falls back to torch (same outputs per path, slower).
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import sys
import threading
from pathlib import Path

import torch

from . import options

_lock = threading.Lock()
_kernel = None  # the loaded extension module; None until loaded, or where unavailable
_kernel_failed: str | None = None


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
# Longest compile first (quant_dot.cpp, about half the CPU of the build, then bindings.cpp): ninja starts them in this
# order, so on two cores the others fill in around them instead of quant_dot.cpp starting last and running alone.
KERNEL_SOURCES = [_HERE / name for name in ("quant_dot.cpp", "bindings.cpp", "skinny_linear.cpp", "gguf_linear.cpp", "int8_layer.cpp", "block_attention.cpp")]
KERNEL_HEADERS = [_HERE / name for name in ("avx2_math.h", "kernels.h", "quant_dot_impl.h")]
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


def kernel_build_dir() -> Path:
    """One build folder per checkout and content of the sources, header, flags and torch version.

    PyTorch rebuilds when a source, its path or a flag changes (not a header): two checkouts sharing one
    folder would rebuild over each other's library, possibly while the other process loads it.
    """
    from ..registry import cache_dir

    digest = hashlib.sha256(" ".join(kernel_cflags() + [torch.__version__, str(_HERE)]).encode())
    for path in [*KERNEL_SOURCES, *KERNEL_HEADERS]:
        digest.update(path.read_bytes())
    return cache_dir() / "kernels" / digest.hexdigest()[:16]


def load_kernel():
    """Compile (once, cached on disk by PyTorch) and return the extension, or None with a reason kept."""
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
            from torch.utils.cpp_extension import load

            build_dir = kernel_build_dir()
            build_dir.mkdir(parents=True, exist_ok=True)
            if not list(build_dir.glob("specdecode_skinny_linear*.so")):
                print("specdecode: compiling the CPU kernels for this CPU (first use only, about a minute on two cores) ...", file=sys.stderr)
            # PyTorch's own build lock is a plain file: a build killed mid-way (SIGTERM, SIGKILL) leaves it
            # behind and every later load waits on it forever. An flock dies with its process, so whoever holds
            # it knows no other build of ours is running and removes a leftover file first.
            with open(build_dir / "build.flock", "w") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                (build_dir / "lock").unlink(missing_ok=True)
                _kernel = load(
                    name="specdecode_skinny_linear",
                    sources=[str(path) for path in KERNEL_SOURCES],
                    extra_cflags=kernel_cflags(),
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(build_dir),
                    verbose=False,
                )
        except Exception as exc:  # a missing compiler must not stop inference, only slow it
            _kernel_failed = f"{type(exc).__name__}: {exc}"
            print(f"specdecode: CPU kernel unavailable, using torch matmul ({_kernel_failed})", file=sys.stderr)
            _kernel = None
        return _kernel


def kernel_status() -> str:
    if _kernel is not None:
        return "skinny-avx2"
    return f"torch ({_kernel_failed})" if _kernel_failed else "not loaded"
