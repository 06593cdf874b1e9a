"""What the `serve` flags say beyond the engine: the model's name, API keys, exposure, uvicorn's settings.
Shared by the one-process server (serve_command.py) and the Ray replicas (cluster.py)."""
from __future__ import annotations

import os
import sys

from ..errors import InputError
from .exposure import LOOPBACK, ApiKeys, default_allowed_hosts, load_api_keys, parse_api_keys


def served_model_name(args) -> str:
    return os.path.basename(str(args.model).rstrip("/")) if os.path.exists(str(args.model)) else args.model


def api_keys_from_args(args) -> ApiKeys:
    """The keys the API accepts: --api-key (id "default"), the `id:key` lines of the --api-keys file and the
    entries of $SPECDECODE_API_KEYS."""
    keys = ApiKeys.of(getattr(args, "api_key", None))
    if getattr(args, "api_keys", None):
        keys = keys.merged(load_api_keys(args.api_keys))
    if os.environ.get("SPECDECODE_API_KEYS", "").strip():
        keys = keys.merged(parse_api_keys(os.environ["SPECDECODE_API_KEYS"], "$SPECDECODE_API_KEYS", commas=True))
    return keys


def exposure_options(args) -> set[str] | None:
    """The Host names to answer (None: any), after warning about a keyless server others can reach."""
    allowed_hosts = default_allowed_hosts(args.host)
    if args.allowed_hosts:
        allowed_hosts = (allowed_hosts or set()) | {h.strip() for h in args.allowed_hosts.split(",") if h.strip()} | {args.host}
    keys = api_keys_from_args(args)
    if args.host.strip("[]").lower() not in LOOPBACK and not keys:
        print(f"specdecode: warning: serving on {args.host} without an API key: anyone who can reach this address can"
              " use the model (set SPECDECODE_API_KEY or --api-key, or --api-keys FILE)", file=sys.stderr, flush=True)
    if len(keys.entries) > 1 and not getattr(args, "metrics_key", None):
        print("specdecode: note: /metrics sums up all tenants' requests, so with several API keys it is closed"
              " until --metrics-key gives the operator a key of its own", file=sys.stderr, flush=True)
    return allowed_hosts


def uvicorn_config(app, *, host: str = "127.0.0.1", port: int = 8000, forwarded_allow_ips: str | None = None,
                   **options):
    """uvicorn's settings for this server. X-Forwarded-For names the client only when it comes from a proxy named
    in `forwarded_allow_ips` (--forwarded-allow-ips); uvicorn's default believes it from any local process, which
    could then claim any address and with it another client's namespace and queue lane."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, proxy_headers=bool(forwarded_allow_ips),
                          forwarded_allow_ips=forwarded_allow_ips or "", **options)


def check_serve_args(args) -> bool:
    """Range and combination checks of the flags, before anything loads; True when replicas are asked for."""
    if args.queue_size < 1:
        raise InputError(f"--queue-size must be at least 1, got {args.queue_size}")
    if getattr(args, "max_batch", 8) < 1:
        raise InputError(f"--max-batch must be at least 1, got {args.max_batch}")
    for flag in ("header_timeout", "body_timeout"):
        seconds = getattr(args, flag, 1.0)
        if not 0 < seconds < float("inf"):
            raise InputError(f"--{flag.replace('_', '-')} must be a positive number of seconds, got {seconds}")
    if getattr(args, "limit_concurrency", 1) < 1:
        raise InputError(f"--limit-concurrency must be at least 1, got {args.limit_concurrency}")
    replicas = getattr(args, "replicas", None)
    if replicas is not None and replicas < 1:
        raise InputError(f"--replicas must be at least 1, got {replicas}")
    threads = getattr(args, "threads_per_replica", None)
    if threads is not None and threads < 1:
        raise InputError(f"--threads-per-replica must be at least 1, got {threads}")
    if (replicas or 1) == 1 and (getattr(args, "ray_address", None) or threads is not None):
        raise InputError("--ray-address and --threads-per-replica apply with --replicas 2 or more"
                         " (one replica is the one-process server; use --threads)")
    if (replicas or 1) > 1 and getattr(args, "threads", None):
        raise InputError("with --replicas, give each replica its threads with --threads-per-replica")
    return (replicas or 1) > 1
