#!/usr/bin/env python3
"""Throughput and latency of `specdecode serve`, one process against N replicas on Ray, in one run.

    .venv/bin/python scripts/bench_serve.py                       # smollm2-135m, 1 vs 2 replicas, 1/2/4 clients
    .venv/bin/python scripts/bench_serve.py --replicas 1,2,4 --concurrency 1,4,8 --out bench-out/serve.json

Each configuration starts the real command (`serve`, or `serve --replicas N --threads-per-replica cores/N`, so
every configuration uses all cores), waits until it is ready, sends one warm-up request, then for each client
count runs that many clients, each sending its requests one after another (distinct prompts, greedy, no
streaming). It reports requests per minute and the p50 / p95 of the request latency, as a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, replicas: int, cores: int, ctx: int, log_path: str):
    port = free_port()
    command = [sys.executable, "-m", "specdecode.cli", "serve", "--model", model, "--ctx", str(ctx),
               "--port", str(port), "--queue-size", "64"]
    if replicas > 1:
        command += ["--replicas", str(replicas), "--threads-per-replica", str(max(1, cores // replicas))]
    else:
        command += ["--threads", str(cores)]
    log = open(log_path, "w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "SPECDECODE_API_KEY": ""})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited; see {log_path}")
        try:
            health = httpx.get(base + "/health", timeout=2).json()
            if health.get("status") == "ok" and health.get("replicas_ready", 1) >= replicas:
                return proc, base
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server did not get ready; see {log_path}")


def stop_server(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def completed_by_replica(base: str) -> dict[str, int]:
    health = httpx.get(base + "/health", timeout=10).json()
    states = health.get("replica_states") or {"local": {"completed": health["completed"]}}
    return {replica: state["completed"] for replica, state in states.items()}


def run_clients(base: str, model: str, clients: int, per_client: int, max_tokens: int, tag: str) -> dict:
    latencies: list[float] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(timeout=600) as http:
            for n in range(per_client):
                body = {"model": model, "prompt": f"[{tag} client {index} request {n}] Write a Python function that",
                        "max_tokens": max_tokens, "temperature": 0, "user": f"client-{index}"}
                started = time.perf_counter()
                response = http.post(base + "/v1/completions", json=body)
                response.raise_for_status()
                with lock:
                    latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {"clients": clients, "requests": len(latencies), "seconds": elapsed,
            "requests_per_minute": 60 * len(latencies) / elapsed,
            "p50_s": statistics.median(latencies),
            "p95_s": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts (1: the one-process server)")
    parser.add_argument("--concurrency", default="1,2,4", help="comma-separated client counts")
    parser.add_argument("--requests-per-client", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="threads shared by the replicas")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    for replicas in [int(r) for r in args.replicas.split(",")]:
        print(f"bench-serve: starting {replicas} replica(s)", file=sys.stderr, flush=True)
        proc, base = start_server(args.model, replicas, args.cores, args.ctx, f"/tmp/bench_serve_{replicas}.log")
        try:
            run_clients(base, args.model, 1, 1, args.max_tokens, "warm-up")
            for clients in [int(c) for c in args.concurrency.split(",")]:
                before = completed_by_replica(base)
                row = {"replicas": replicas, **run_clients(base, args.model, clients, args.requests_per_client,
                                                           args.max_tokens, f"r{replicas}c{clients}")}
                time.sleep(1.5 if replicas > 1 else 0)  # replicas post their counts every second
                after = completed_by_replica(base)
                row["served_by_replica"] = sorted(after[r] - before.get(r, 0) for r in after)
                rows.append(row)
                print(f"bench-serve: {row}", file=sys.stderr, flush=True)
        finally:
            stop_server(proc)
    print("| replicas | threads each | clients | requests | requests/min | p50 latency | p95 latency |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        threads = args.cores if row["replicas"] == 1 else max(1, args.cores // row["replicas"])
        print(f"| {row['replicas']} | {threads} | {row['clients']} | {row['requests']} | {row['requests_per_minute']:.1f}"
              f" | {row['p50_s']:.2f} s | {row['p95_s']:.2f} s |")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "max_tokens": args.max_tokens, "cores": args.cores, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
