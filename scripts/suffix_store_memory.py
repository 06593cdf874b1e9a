"""The suffix store stays under its token cap through many requests to a real server.

Starts `specdecode serve` on the tiny model with a small store cap, sends N completions with the default
drafter (auto) from several clients (distinct `user` fields, so distinct store namespaces) with distinct
prompts, and every 100 requests reads the store's size from /metrics and the server's resident memory from
/proc. Exits non-zero if the store ever exceeds its cap.

    .venv/bin/python scripts/suffix_store_memory.py --requests 1000 --cap 20000
"""
from __future__ import annotations

import argparse
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

WORDS = ("alpha beta gamma delta merge sort list value index count table river stone cloud light "
         "number string return print window shadow garden market bridge").split()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gauge(metrics: str, name: str) -> float:
    return float(re.search(rf"^{name} (\S+)$", metrics, re.M).group(1))


def resident_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--cap", type=int, default=20_000, help="suffix store size in tokens")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--clients", type=int, default=7)
    args = parser.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "specdecode.cli", "serve", "--model", "smollm2-135m",
                               "--port", str(port), "--ctx", "1024", "--suffix-store-tokens", str(args.cap)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=2).json().get("status") == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        rng = random.Random(0)
        peak, started = 0.0, time.perf_counter()
        print("| requests | store tokens | peak | cap | server RSS MB |\n|---|---|---|---|---|")
        with httpx.Client(base_url=base, timeout=120) as client:
            for i in range(args.requests):
                prompt = "Repeat and continue: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
                response = client.post("/v1/completions", json={
                    "model": "smollm2-135m", "prompt": prompt, "max_tokens": args.max_new_tokens, "temperature": 0,
                    "user": f"client-{i % args.clients}"})
                response.raise_for_status()
                metrics = client.get("/metrics").text
                tokens = gauge(metrics, "specdecode_suffix_store_tokens")
                peak = max(peak, tokens)
                if tokens > args.cap:
                    raise SystemExit(f"the store holds {tokens:.0f} tokens, over its cap of {args.cap}")
                if (i + 1) % 100 == 0:
                    print(f"| {i + 1} | {tokens:.0f} | {peak:.0f} | {args.cap} | {resident_mb(server.pid):.0f} |", flush=True)
        print(f"{args.requests} requests in {time.perf_counter() - started:.0f} s; the store never exceeded its cap")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
