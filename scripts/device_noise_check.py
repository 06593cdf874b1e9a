"""Device check of sampling's race on the GPU (gpu/noise_kernel.py), the parts the interpreter cannot show:
- the compiled kernel's draws are the host's bits (PositionNoise.exponentials) over rows of Qwen's vocabulary, and
  the same kernel compiled with fused multiply-adds allowed is not (why every launch turns fusion off);
- its PTX divides with div.rn.f64 and holds no fma.rn.f64 (and the fused compile does);
- what a race costs: choose_rows on 1..64 rows of 151,936 tokens next to the host's choose of one row.
Prints one report; exits 1 when an exactness line fails. `--tiny` tries the script on a CPU (Triton's interpreter,
small vocabulary, no PTX, no timing). The tests (tests/gpu/test_device_noise.py) run beside it on the device.

    python scripts/device_noise_check.py            # on the device: ~1 minute
"""
from __future__ import annotations

import os
import sys
import time

if "--tiny" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import torch
import triton
import triton.language as tl

from specdecode.gpu import noise_kernel
from specdecode.sampling import PositionNoise, choose_rows

TINY = "--tiny" in sys.argv
DEVICE = "cpu" if TINY else "cuda"
VOCAB = 1000 if TINY else 151_936
SEEDS = (0, 1, 12345, 2**63 - 1)
POSITIONS = (0, 7, 2**40)


@triton.jit
def _draws_kernel(keys_ptr, positions_ptr, out_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    ids = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
    position = tl.load(positions_ptr + row).to(tl.uint64, bitcast=True)
    tl.store(out_ptr + row * vocab + ids, noise_kernel.exponentials(key, position, ids.to(tl.uint64)),
             mask=ids < vocab)


def draws(fusion: bool):
    """E of every token for each (seed, position), from the device with or without fused multiply-adds."""
    pairs = [(seed, position) for seed in SEEDS for position in POSITIONS]
    keys = torch.tensor([PositionNoise(seed).key_bits for seed, _ in pairs], device=DEVICE)
    positions = torch.tensor([position for _, position in pairs], device=DEVICE)
    out = torch.empty(len(pairs), VOCAB, dtype=torch.float64, device=DEVICE)
    kernel = _draws_kernel[(len(pairs), triton.cdiv(VOCAB, 1024))](keys, positions, out, VOCAB, BLOCK=1024,
                                                                   enable_fp_fusion=fusion)
    host = np.stack([PositionNoise(seed).exponentials(position, np.arange(VOCAB)) for seed, position in pairs])
    return int(np.sum(out.cpu().numpy() != host)), host.size, kernel


def ptx_of(kernel) -> str:
    return "" if TINY else kernel.asm["ptx"]


def timed(function, repeats=50) -> float:
    """Milliseconds a call, the device's time (CUDA events around `repeats` calls after a warm-up call)."""
    function()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        function()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> int:
    ok = True
    unfused, total, kernel = draws(fusion=False)
    print(f"draws differing from the host's, fusion off: {unfused} of {total}")
    ok &= unfused == 0
    if not TINY:
        fused, _, fused_kernel = draws(fusion=True)
        print(f"draws differing from the host's, fusion on (the broken twin): {fused} of {total}")
        ptx, fused_ptx = ptx_of(kernel), ptx_of(fused_kernel)
        print(f"PTX, fusion off: div.rn.f64 {ptx.count('div.rn.f64')}, fma.rn.f64 {ptx.count('fma.rn.f64')}; "
              f"fusion on: fma.rn.f64 {fused_ptx.count('fma.rn.f64')}")
        ok &= ptx.count("fma.rn.f64") == 0
    probs = torch.softmax(torch.randn(64, VOCAB, device=DEVICE) * 3, -1)
    noises = [PositionNoise(seed) for seed in range(64)]
    positions = list(range(1000, 1064))
    device = choose_rows(probs, positions, noises, device_kernel=True).tolist()
    host = choose_rows(probs.cpu(), positions, noises, device_kernel=False).tolist()
    print(f"tokens of 64 rows, device == host: {device == host}")
    ok &= device == host
    if not TINY:
        for rows in (1, 5, 16, 64):
            ms = timed(lambda: choose_rows(probs[:rows], positions[:rows], noises[:rows]))
            print(f"choose_rows, {rows} rows of {VOCAB}: {ms * 1000:.0f} us a call (CUDA events, host work included)")
        row = probs[0].cpu()
        start = time.perf_counter()
        for _ in range(10):
            noises[0].choose(row, 5)
        print(f"host choose, 1 row of {VOCAB} (copy excluded): {(time.perf_counter() - start) * 100:.1f} ms")
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
