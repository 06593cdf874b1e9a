#!/usr/bin/env python3
"""Serving benchmark: `specdecode serve` (batched, speculative and plain) against llama.cpp's `llama-server`
with as many slots as clients, plain and with its n-gram speculation, in one run on one machine.

    .venv/bin/python scripts/bench_serving.py --suite humaneval --concurrency 1,2,4,8 --out bench-out/serving-he
    .venv/bin/python scripts/bench_serving.py --suite specbench --repeat   # every request sends the same prompt

N clients each send `--requests-per-client` chat requests one after another (greedy, `--max-tokens` new
tokens, a different prompt for every request unless --repeat), all clients at once. Per system and client
count: aggregate completion tokens/s (all tokens over the wall time), and the p50 / p95 request latency.
Before the timed runs, specdecode answers every prompt alone with plain decoding (one request at a time):
each timed specdecode answer must be token for token that solo answer (`identical`). llama-server is built
by scripts/build_llamacpp.sh and started per client count with `-np N` and N times the context; its
answers are not expected to equal ours (another implementation's arithmetic).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from specdecode import registry
from specdecode.bench.peers import NGRAM_SIZE_N, find_llamacpp_bin
from specdecode.bench.prompts import find_bench_dir, load_suite

sys.path.insert(0, str(Path(__file__).parent))
from bench_serve import free_port, stop_server as stop  # noqa: E402  (scripts/ sits beside this file)

LLAMA_SPEC = {"ngram-simple": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NGRAM_SIZE_N),
                               "--spec-ngram-simple-size-m", "8"]}


def wait_ready(proc, base: str, log_path: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited; see {log_path}")
        try:
            response = httpx.get(base + "/health", timeout=2)
            if response.status_code == 200 and response.json().get("status") in ("ok", None):
                return
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server did not get ready; see {log_path}")


def start(command: list[str], log_path: str, base: str, env=None):
    log = open(log_path, "w")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    wait_ready(proc, base, log_path)
    return proc


MODEL_IDS: dict[str, str] = {}


def model_id(base: str) -> str:
    """The name the server serves its model under (both servers list it at /v1/models)."""
    if base not in MODEL_IDS:
        MODEL_IDS[base] = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
    return MODEL_IDS[base]


def chat(http: httpx.Client, base: str, prompt: str, max_tokens: int, user: str, extra: dict) -> dict:
    body = {"model": model_id(base), "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "user": user, **extra}
    started = time.perf_counter()
    response = http.post(base + "/v1/chat/completions", json=body)
    response.raise_for_status()
    data = response.json()
    return {"seconds": time.perf_counter() - started, "tokens": data["usage"]["completion_tokens"],
            "ids": (data.get("specdecode") or {}).get("tokens"), "text": data["choices"][0]["message"]["content"]}


def run_clients(base: str, prompts: list[str], clients: int, per_client: int, max_tokens: int, extra: dict) -> dict:
    """Every client sends its requests one after another; all clients at once. Returns the level's figures."""
    answers: dict[int, dict] = {}
    lock = threading.Lock()

    def client(index: int) -> None:
        with httpx.Client(timeout=1800) as http:
            for n in range(per_client):
                slot = index * per_client + n
                answer = chat(http, base, prompts[slot % len(prompts)], max_tokens, f"client-{index}", extra)
                with lock:
                    answers[slot] = answer

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    elapsed = time.perf_counter() - started
    latencies = sorted(a["seconds"] for a in answers.values())
    tokens = sum(a["tokens"] for a in answers.values())
    return {"clients": clients, "requests": len(answers), "seconds": elapsed, "tokens": tokens,
            "tokens_per_s": tokens / elapsed, "p50_s": statistics.median(latencies),
            "p95_s": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))], "answers": answers}


def specdecode_command(args, port: int) -> list[str]:
    return [sys.executable, "-m", "specdecode.cli", "serve", "--model", args.model, "--ctx", str(args.ctx),
            "--port", str(port), "--queue-size", "64", "--max-batch", str(args.max_batch), "--threads", str(args.threads)]


def llama_command(args, binary: Path, gguf: str, port: int, clients: int, spec: str | None) -> list[str]:
    command = [str(binary), "-m", gguf, "-t", str(args.threads), "-tb", str(args.threads), "-c", str(args.ctx * clients),
               "-np", str(clients), "--host", "127.0.0.1", "--port", str(port), "-fa", "auto"]
    return command + (LLAMA_SPEC[spec] if spec else [])


def bench_specdecode(args, prompts, levels) -> list[dict]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start(specdecode_command(args, port), "/tmp/bench_serving_specdecode.log", base, {"SPECDECODE_API_KEY": ""})
    rows = []
    try:
        plain = {"speculative": {"drafter": "none"}}
        with httpx.Client(timeout=1800) as http:
            chat(http, base, "Say hi.", 8, "warm-up", {})
            needed = min(len(prompts), max(levels) * args.requests_per_client)
            print(f"bench-serving: specdecode solo plain answers for {needed} prompts", file=sys.stderr, flush=True)
            solo = [chat(http, base, prompts[i], args.max_tokens, f"solo-{i}", plain) for i in range(needed)]
        solo_tps = sum(a["tokens"] for a in solo) / sum(a["seconds"] for a in solo)
        rows.append({"system": "specdecode plain, one request at a time", "clients": 1, "requests": len(solo),
                     "tokens_per_s": solo_tps, "p50_s": statistics.median(a["seconds"] for a in solo),
                     "p95_s": sorted(a["seconds"] for a in solo)[min(len(solo) - 1, round(0.95 * (len(solo) - 1)))]})
        for clients in levels:
            for label, extra in (("specdecode batched plain", plain), ("specdecode batched auto", {})):
                row = run_clients(base, prompts, clients, args.requests_per_client, args.max_tokens, extra)
                answers = row.pop("answers")
                row["identical"] = sum(a["ids"] == solo[slot % len(prompts)]["ids"] for slot, a in answers.items())
                rows.append({"system": label, **row})
                print(f"bench-serving: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        stop(proc)
    return rows


def bench_llama(args, prompts, levels) -> list[dict]:
    folder, why = find_llamacpp_bin(args.llamacpp_bin)
    binary = folder / "llama-server" if folder else None
    if binary is None or not binary.is_file():
        print(f"bench-serving: no llama-server ({why}); run scripts/build_llamacpp.sh", file=sys.stderr)
        return []
    gguf = args.gguf or str(registry.resolve(args.model))
    rows = []
    for spec in [None] + [s for s in args.llama_spec.split(",") if s]:
        for clients in levels:
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            proc = start(llama_command(args, binary, gguf, port, clients, spec), "/tmp/bench_serving_llama.log", base)
            try:
                with httpx.Client(timeout=600) as http:
                    chat(http, base, "Say hi.", 8, "warm-up", {})
                row = run_clients(base, prompts, clients, args.requests_per_client, args.max_tokens, {})
                row.pop("answers")
                rows.append({"system": f"llama-server -np {clients}" + (f" --spec-type {spec}" if spec else ""), **row})
                print(f"bench-serving: {rows[-1]}", file=sys.stderr, flush=True)
            finally:
                stop(proc)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| system | clients | requests | aggregate tok/s | p50 latency | p95 latency | identical to solo plain |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        same = f"{r['identical']}/{r['requests']}" if "identical" in r else "-"
        lines.append(f"| {r['system']} | {r['clients']} | {r['requests']} | {r['tokens_per_s']:.1f} | {r['p50_s']:.2f} s"
                     f" | {r['p95_s']:.2f} s | {same} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=registry.DEFAULT_TARGET)
    parser.add_argument("--gguf", default=None, help="the GGUF file llama-server loads (default: the registry's file)")
    parser.add_argument("--suite", default="humaneval", choices=["humaneval", "specbench"])
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--repeat", action="store_true", help="every request sends the suite's first prompt")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--llama-spec", default="ngram-simple", help="llama-server --spec-type values to run besides plain")
    parser.add_argument("--llamacpp-bin", default=None)
    parser.add_argument("--skip-llama", action="store_true")
    parser.add_argument("--bench-dir", default=None)
    parser.add_argument("--out", default=None, help="a folder for results.json and report.md")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    suite = load_suite(args.suite, find_bench_dir(args.bench_dir), None, offset=args.offset)
    prompts = [p.turns[0] for p in suite][: max(levels) * args.requests_per_client]
    if args.repeat:
        prompts = prompts[:1]
    rows = bench_specdecode(args, prompts, levels)
    if not args.skip_llama:
        rows += bench_llama(args, prompts, levels)
    report = table(rows)
    command = "scripts/bench_serving.py " + " ".join(sys.argv[1:])
    print(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
        (out / "report.md").write_text(f"`{command}`\n\n{report}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
