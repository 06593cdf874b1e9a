#!/usr/bin/env bash
# CMake flags, one a line, for a CUDA build (llama.cpp's, scripts/gpu_peer.sh) on a machine whose toolkit lacks
# what CMake's FindCUDAToolkit looks for; nothing where the toolkit has it all. Two gaps are filled:
# - cuBLAS: where nvcc's toolkit has no cublas_v2.h, pip's nvidia-cublas (PyTorch's CUDA wheels pull it in:
#   nvidia/cu13/{include,lib} for CUDA 13, nvidia/cublas/{include,lib} for 12) in python3's site-packages;
# - the driver library: where no unversioned libcuda.so (the toolkit's stub or the driver's link) is there, the
#   driver's libcuda.so.1 itself (containers mount only that).
# pip's and the driver's libraries are versioned only (libcublas.so.13), which CMake's search for libcublas.so never
# finds: each is named to CMake by its path. The last line, where pip's cuBLAS is used, is "LD_LIBRARY_PATH=DIR"
# (for the built programs' runs), not a flag. Exits 1 where no cuBLAS is found at all.
set -uo pipefail
nvcc=$(command -v nvcc) || { echo "cuda_build_flags: no nvcc" >&2; exit 1; }
# the toolkit's root as nvcc itself says it (nvcc may be a wrapper script elsewhere, as /usr/local/bin/nvcc is)
here=$(nvcc --dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)
root=$(dirname "${here:-$(dirname "$(readlink -f "$nvcc")")}")
first() { for path in "$@"; do [ -e "$path" ] && { echo "$path"; return 0; }; done; return 1; }

if ! first "$root"/include/cublas_v2.h "$root"/targets/*/include/cublas_v2.h >/dev/null; then
  cublas=$(python3 - <<'PY'
import glob
import os
import site
import sys

for root in dict.fromkeys(sys.path + site.getsitepackages() + [site.getusersitepackages()]):  # import order
    for header in sorted(glob.glob(os.path.join(root, "nvidia", "*", "include", "cublas_v2.h"))):
        base = os.path.dirname(os.path.dirname(header))
        if glob.glob(os.path.join(base, "lib", "libcublas.so*")):
            print(base)
            sys.exit(0)
sys.exit(1)
PY
  ) || { echo "cuda_build_flags: no cuBLAS (neither the toolkit's nor pip's nvidia-cublas)" >&2; exit 1; }
  echo "-DCUDA_cublas_LIBRARY=$(first "$cublas"/lib/libcublas.so*)"
  echo "-DCUDA_cublasLt_LIBRARY=$(first "$cublas"/lib/libcublasLt.so*)"
  echo "-DCMAKE_CUDA_FLAGS=-I$cublas/include"
  echo "-DCMAKE_CXX_FLAGS=-I$cublas/include"
fi
libdirs=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/nvidia/lib64 /usr/lib/wsl/lib)
if ! first "$root"/lib64/stubs/libcuda.so "$root"/lib/stubs/libcuda.so "$root"/targets/*/lib/stubs/libcuda.so \
    "$root"/lib64/libcuda.so "${libdirs[@]/%//libcuda.so}" >/dev/null; then
  driver=$(first "${libdirs[@]/%//libcuda.so.1}" || ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')
  [ -n "$driver" ] && echo "-DCUDA_cuda_driver_LIBRARY=$driver"
fi
[ -n "${cublas:-}" ] && echo "LD_LIBRARY_PATH=$cublas/lib"
exit 0
