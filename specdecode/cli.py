"""Command line: specdecode generate | bench | tune | serve | models."""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import registry
from .bench.prompts import SUITES
from .build import build_engine, parse_k
from .errors import SpecDecodeError, require_extra
from .server.connection_limits import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, LIMIT_CONCURRENCY

# accepted: copied from text (green) or proposed by a draft model (magenta); the target's own tokens after
COLOURS = {"accepted": "\033[32m", "accepted (draft model)": "\033[35m", "recovered": "\033[33m", "bonus": "\033[36m",
           "plain": ""}
COPY_SOURCES = frozenset({"lookup", "store", "suffix"})
RESET = "\033[0m"


def _add_model_args(p: argparse.ArgumentParser, with_draft: bool = True) -> None:
    p.add_argument("--model", default=registry.DEFAULT_TARGET, help="target: registry name, .gguf file or HF folder")
    if with_draft:
        p.add_argument(
            "--draft",
            default=None,
            help="a drafter: 'auto' (default: per step, copy from this or earlier requests, else the draft model"
                 f" where it pays; {registry.DEFAULT_DRAFT} is loaded for the default target at --precision float32"
                 " or on a GPU), 'lookup' (prompt lookup), 'suffix' (lookup that also copies from earlier requests),"
                 " 'none' (plain decoding); or a draft model by name or path",
        )
        p.add_argument("--draft-dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8"],
                       help="draft weights precision (does not change outputs: the target decides); auto: int8"
                            " through the CPU kernel, else bfloat16")
    p.add_argument("--precision", "--dtype", dest="precision", default="int8",
                   choices=["int8", "q8_0", "float32", "bfloat16"],
                   help="target arithmetic. int8 (default): the GGUF blocks times int8 activations, as llama.cpp computes"
                        " the model on a CPU (refused where a matrix has blocks the int8 kernel does not read: F16, BF16,"
                        " F32, Hugging Face folders); q8_0: int8, those matrices quantized to Q8_0 at load; float32: the"
                        " dequantized weights in float32, the reference that matches transformers. Greedy speculative"
                        " output equals plain output within each")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--ctx", type=int, default=4096, help="context length to allocate (tokens)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--allow-inexact", action="store_true",
                   help="run even where the CPU kernel is unavailable: blocks then round differently from single"
                        " steps, and speculative output may differ from plain decoding at near-ties")
    p.add_argument("--launch-ahead", action="store_true",
                   help="GPU path, plain decoding (drafter none): launch each pass from the tokens the device chose"
                        " before reading the pass before (the same tokens; hides the host's work behind the device's;"
                        " not yet timed on a GPU)")


def _add_decoding_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--k", default="auto", help="draft length per step, or 'auto' (chosen from measured costs)")
    p.add_argument("--max-k", type=int, default=None,
                   help="largest K the auto policy may pick, 1..64 (default: 8 for a draft model, 15 for prompt lookup)")
    p.add_argument("--min-confidence", type=float, default=None,
                   help="stop drafting when the draft's top probability falls below this (greedy only)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=256)


def cmd_generate(args) -> int:
    from .sampling import SamplingParams

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    k = parse_k(args.k)
    engine, drafter = build_engine(args)
    colour = args.show_drafts
    stream = engine.stream(
        prompt,
        drafter=drafter,
        k=k,
        sampling=sampling,
        max_new_tokens=args.max_new_tokens,
        stop=args.stop or (),
        chat=args.chat,
        min_confidence=args.min_confidence if args.min_confidence is not None else 0.0,
        max_k=args.max_k,
    )
    stats = None
    out = sys.stdout
    for event in stream:
        stats = event.stats
        if colour:
            for piece, origin, source in zip(event.pieces, event.origins, event.sources):
                kind = "accepted (draft model)" if origin == "accepted" and source not in COPY_SOURCES else origin
                out.write(f"{COLOURS[kind]}{piece}{RESET}")
        else:
            out.write(event.text)
        out.flush()
    out.write("\n")
    if colour:
        print("legend: " + " ".join(f"{code}{kind}{RESET}" for kind, code in COLOURS.items()), file=sys.stderr)
    if args.stats or args.profile:
        for line in stats.summary_lines():
            print(line, file=sys.stderr)
    else:
        print(f"[{stats.generated_tokens} tokens, {stats.tokens_per_s:.2f} tok/s"
              + (f", alpha {stats.alpha:.2f}, tau {stats.tau:.2f}" if stats.drafted else "") + "]", file=sys.stderr)
    if args.profile:
        from .profile import profile_report

        print(profile_report(engine, stats), file=sys.stderr)
    if args.json_stats:
        print(json.dumps(stats.to_dict(), indent=1), file=sys.stderr)
    return 0


def cmd_models(args) -> int:
    if args.action == "list":
        print(f"cache: {registry.cache_dir()}")
        for entry in registry.REGISTRY.values():
            state = "cached" if registry.is_cached(entry.name) else "not cached"
            print(f"{entry.name:22s} {entry.size / 1e6:8.0f} MB  {state:10s}  {entry.description}")
        return 0
    if args.action == "inspect":
        from .models.inspect import inspect_model

        if not args.names:
            raise SpecDecodeError("models inspect needs a registry name, a .gguf file or a Hugging Face folder")
        for index, name in enumerate(args.names):
            print(("\n" if index else "") + "\n".join(inspect_model(name)))
        return 0
    if args.action == "pull":
        from .models.loader import convert_gguf

        for name in args.names or [registry.DEFAULT_TARGET, registry.DEFAULT_DRAFT]:
            was_cached = registry.is_cached(name)
            path = registry.pull(name)
            if args.verify and not registry.verify_file(name):
                raise SpecDecodeError(f"{name}: cached file fails its sha256 check; delete {path} and pull again")
            convert_gguf(path)
            print(f"{name}: {'already cached' if was_cached else 'pulled'} at {path}")
        return 0
    raise SpecDecodeError(f"unknown action {args.action}")


def cmd_bench(args) -> int:
    require_extra("bench", "matplotlib")
    from .bench.runner import run_bench_cli

    return run_bench_cli(args)


def cmd_bench_merge(args) -> int:
    from .bench.merge import merge_cli

    return merge_cli(args)


def cmd_tune(args) -> int:
    require_extra("bench", "matplotlib")
    from .bench.tune import run_tune_cli

    return run_tune_cli(args)


def cmd_serve(args) -> int:
    require_extra("serve", "fastapi", "uvicorn", "prometheus_client")
    from .server.serve_command import run_server

    return run_server(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdecode", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="generate text (speculatively when a drafter is given)")
    g.add_argument("prompt", help="the prompt, or - to read it from stdin")
    _add_model_args(g)
    _add_decoding_args(g)
    g.add_argument("--chat", dest="chat", action="store_true", default=None, help="apply the chat template")
    g.add_argument("--no-chat", dest="chat", action="store_false", help="use the prompt as raw text")
    g.add_argument("--stop", action="append", help="stop string (repeatable)")
    g.add_argument("--stats", action="store_true", help="print speculation statistics to stderr")
    g.add_argument("--json-stats", action="store_true", help="print statistics as JSON to stderr")
    g.add_argument("--show-drafts", action="store_true", help="colour tokens by origin (accepted copy / accepted from the draft model / recovered / bonus / plain)")
    g.add_argument("--profile", action="store_true", help="time per phase and the measured cost of verify blocks")
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("models", help="list or pull the named default models; inspect a model's file or folder")
    m.add_argument("action", choices=["list", "pull", "inspect"])
    m.add_argument("names", nargs="*")
    m.add_argument("--verify", action="store_true", help="re-check the sha256 of cached files")
    m.set_defaults(func=cmd_models)

    b = sub.add_parser("bench", help="plain vs speculative decoding on public prompt sets, same process")
    _add_model_args(b)
    _add_decoding_args(b)
    b.add_argument("--suite", default="humaneval", choices=list(SUITES),
                   help="humaneval, specbench, copy-heavy workloads built from HumanEval: codeedit (edit a"
                        " given function), codeedit-own (edit a function the default target wrote), chat3"
                        " (three-turn chats restating the function), or short (everyday short answers: chat,"
                        " math, translation, extraction, lists, other languages, SQL, JSON, summaries)")
    b.add_argument("--limit", type=int, default=10, help="prompts (per category for specbench and short)")
    b.add_argument("--offset", type=int, default=0, help="skip this many prompts (per category) first, to continue an earlier run")
    b.add_argument("--categories", default=None, help="comma-separated categories (specbench, short)")
    b.add_argument("--drafters", default=None, help="comma-separated methods: ar,draft,lookup,auto,... (default: ar + the --draft one); "
                   "DRAFTER:nostore runs that drafter without the cross-request store (e.g. auto:nostore)")
    b.add_argument("--bench-dir", default=None, help="folder with humaneval.jsonl / specbench.jsonl (default: the sets shipped in specdecode/data/bench)")
    b.add_argument("--repeats", type=int, default=1,
                   help="time each prompt this many times per method and keep the median (the faster of two):"
                        " per-prompt ratios of short answers need it")
    b.add_argument("--out", default="bench-out", help="folder for results.json, report.md and plots")
    b.add_argument("--peers", nargs="?", const="all", default=None, choices=["all", "llama.cpp", "transformers"],
                   help="also run peers on the first turns: llama.cpp's own binaries and/or transformers (default: all)")
    b.add_argument("--llamacpp-bin", default=None,
                   help="folder with llama.cpp's binaries for --peers (default: $LLAMACPP_BIN, else <cache>/llama.cpp/bin)")
    b.set_defaults(func=cmd_bench)

    bm = sub.add_parser("bench-merge", help="join the rows of bench runs over different prompts into one report")
    bm.add_argument("folders", nargs="+", help="--out folders of earlier bench runs (each with results.json)")
    bm.add_argument("--out", required=True, help="folder for the merged results.json, report.md and plot")
    bm.add_argument("--replace", action="store_true",
                    help="a category a later folder measured again replaces that category of the earlier folders")
    bm.set_defaults(func=cmd_bench_merge)

    t = sub.add_parser("tune", help="measure alpha and costs on sample prompts; print the best drafter and K")
    _add_model_args(t)
    t.add_argument("--suite", default="humaneval", choices=list(SUITES))
    t.add_argument("--limit", type=int, default=3)
    t.add_argument("--max-new-tokens", type=int, default=64)
    t.add_argument("--bench-dir", default=None)
    t.add_argument("--out", default=None, help="folder for tune.json and the alpha-against-K plot")
    t.set_defaults(func=cmd_tune)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server with a playground page")
    _add_model_args(s)
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    s.add_argument("--api-key", default=os.environ.get("SPECDECODE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (default: $SPECDECODE_API_KEY, which keeps the key out of ps)")
    s.add_argument("--api-keys", default=None, metavar="FILE",
                   help="several API keys, one 'id:key' line each (one per tenant; also $SPECDECODE_API_KEYS, entries"
                        " separated by commas or newlines): a request's namespace and its turn in the queue follow the"
                        " key id and the client's address; its `user` field only splits the namespace within them")
    s.add_argument("--forwarded-allow-ips", default=None,
                   help="comma-separated addresses of reverse proxies whose X-Forwarded-For names the client (default:"
                        " none; the client is the peer address, which no header can change)")
    s.add_argument("--metrics-key", default=os.environ.get("SPECDECODE_METRICS_KEY"),
                   help="require 'Authorization: Bearer KEY' for /metrics, whose counters sum up every client's requests"
                        " (default: $SPECDECODE_METRICS_KEY, else the API key)")
    s.add_argument("--expose-timings", action="store_true",
                   help="put each request's timings (prefill, draft, verify seconds, tokens/s, cost notes) in its"
                        " response; off by default: they tell a client what was cached and how busy the server is")
    s.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host names to answer besides the bound one (a loopback bind answers to loopback"
                        " names only, against DNS rebinding)")
    s.add_argument("--cors-origin", action="append", default=None,
                   help="a browser origin (e.g. https://app.example) allowed to call the API; repeatable. Other origins get 403")
    s.add_argument("--max-batch", type=int, default=8,
                   help="requests generated at once, in one target pass (default 8); each gets the tokens it gets alone")
    s.add_argument("--queue-size", type=int, default=16,
                   help="requests that may wait for a place in the batch (default 16); beyond it 429 with Retry-After")
    s.add_argument("--suffix-store-tokens", type=int, default=262_144,
                   help="tokens of earlier requests the 'auto' and 'suffix' drafters keep to copy from, per engine"
                        " (default 262144); each client's requests are kept apart")
    s.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT_S,
                   help=f"seconds a connection may take to send a request's headers (default {HEADER_TIMEOUT_S:g});"
                        " slower ones are closed")
    s.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT_S,
                   help=f"seconds a request may take to send its whole body (default {BODY_TIMEOUT_S:g}); then 408")
    s.add_argument("--limit-concurrency", type=int, default=LIMIT_CONCURRENCY,
                   help=f"open connections at most (default {LIMIT_CONCURRENCY}); past it new ones get 503")
    s.add_argument("--shutdown-grace", type=float, default=30.0,
                   help="seconds a SIGTERM waits for running and queued requests before cutting them (default 30)")
    s.add_argument("--replicas", type=int, default=None,
                   help="run N engine replicas on Ray Serve behind one entry point, with prefix-aware routing (needs"
                        " the 'cluster' extra: pip install -e .[cluster]); default: one engine in this process, no Ray")
    s.add_argument("--ray-address", default=None,
                   help="with --replicas: join this Ray cluster ('auto' for the one `ray start` runs here); default:"
                        " start a local Ray instance")
    s.add_argument("--threads-per-replica", type=int, default=None,
                   help="with --replicas: CPU threads (and Ray CPUs) per replica (default: this machine's cores / N)")
    s.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SpecDecodeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
