"""`specdecode serve --replicas N`: N engine replicas on a Ray cluster behind one OpenAI-compatible entry point.

    HTTP ─► Ray Serve proxy ─► EntryPoint (app.py's routes over a ClusterBackend)        cluster_entry.py
                                   │ DeploymentHandle, streamed, routed by PrefixAffinityRouter
                                   ▼
                 EngineReplica × N (each: its own engine, caches, threads,                   cluster_replica.py
                                   │ Scheduler with a bounded queue)
                                   │ every second: status + Prometheus page
                                   ▼
                 ReplicaBoard (what /health and /metrics of the entry point read)            cluster_replica.py

Ray Serve places the replicas on the cluster's nodes, restarts one that dies and streams the events.
The entry point keeps what the one-process server does (parsing, exposure checks, errors, SSE) by running
the same app; only the backend differs. Routing keeps a conversation on the replica that holds its prefix
(routing.py); the entry point admits at most (queue size + 1) requests per ready replica and answers 429
beyond, and a request whose replica dies before its generation started is sent again.

Imported only in cluster mode: the one-process server never imports Ray.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from dataclasses import fields

from ray import serve

from ..build import EngineOptions, prepare_model_files
from .cluster_entry import EntryPoint
from .cluster_replica import EngineReplica, PrefixAffinityRouter, ReplicaBoard
from .cluster_settings import ClusterSettings
from .serve_options import api_keys_from_args, exposure_options, served_model_name

APP_NAME = "specdecode"


def build_application(settings: ClusterSettings):
    """The Serve application: the board, N engine replicas with the prefix-aware router, the entry point."""
    from ray.serve.config import RequestRouterConfig

    board = serve.deployment(ReplicaBoard, name="ReplicaBoard", num_replicas=1, max_ongoing_requests=1000,
                             ray_actor_options={"num_cpus": 0}).bind()
    engines = serve.deployment(
        EngineReplica, name="EngineReplica", num_replicas=settings.replicas,
        ray_actor_options={"num_cpus": settings.threads_per_replica},
        # Ray sends a replica no more than its Scheduler holds (max_batch running, queue_size waiting) ...
        max_ongoing_requests=settings.queue_size + settings.max_batch,
        graceful_shutdown_timeout_s=settings.shutdown_grace_s,
        request_router_config=RequestRouterConfig(request_router_class=PrefixAffinityRouter,
                                                  request_router_kwargs=dict(settings.routing)),
    ).bind(settings, board)
    entry = serve.deployment(serve.ingress()(EntryPoint), name="EntryPoint", num_replicas=1,
                             max_ongoing_requests=10_000,  # ... and the entry point admits (429) for all of them
                             ray_actor_options={"num_cpus": 0}).bind(engines, board, settings)
    return entry


def deploy(settings: ClusterSettings, host: str, port: int) -> None:
    """Pull and convert the models here, once, then start Serve's HTTP proxy on host:port and the application;
    returns once every replica is ready. (Replicas starting on a fresh machine would otherwise each download
    and convert the same files at once.)"""
    from ray.serve.schema import LoggingConfig

    prepare_model_files(settings.engine_options)

    quiet = LoggingConfig(log_level="WARNING", enable_access_log=False)  # a line per request and board post otherwise
    serve.start(http_options={"host": host, "port": port}, proxy_location="HeadOnly", logging_config=quiet)
    serve.run(build_application(settings), name=APP_NAME, route_prefix="/", blocking=False, logging_config=quiet)


# The `serve` flags that build an engine (EngineOptions), less threads: each replica gets its own count.
ENGINE_FLAGS = {f.name for f in fields(EngineOptions)} - {"threads"}


def settings_from_args(args, model_name: str, allowed_hosts) -> ClusterSettings:
    options = {k: v for k, v in vars(args).items() if k in ENGINE_FLAGS}
    threads = args.threads_per_replica or max(1, (os.cpu_count() or 1) // args.replicas)
    return ClusterSettings(options, model_name, replicas=args.replicas, threads_per_replica=threads,
                           queue_size=args.queue_size, max_batch=args.max_batch, api_key=api_keys_from_args(args),
                           allowed_hosts=allowed_hosts,
                           cors_origins=list(args.cors_origin or []), shutdown_grace_s=float(args.shutdown_grace),
                           metrics_key=getattr(args, "metrics_key", None),
                           expose_timings=getattr(args, "expose_timings", False))


def run_cluster_server(args) -> int:
    """Join (--ray-address) or start a Ray instance, deploy, serve until SIGINT / SIGTERM, then take the application
    down (replicas finish their requests within --shutdown-grace) and exit 0. A joined cluster keeps running."""
    import ray

    settings = settings_from_args(args, served_model_name(args), exposure_options(args))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Serve's HTTP proxy runs uvicorn with its defaults, which believe X-Forwarded-For from any local process
    # (serve_options.uvicorn_config says why not); it reads this variable, which a Ray instance started here inherits.
    os.environ["FORWARDED_ALLOW_IPS"] = getattr(args, "forwarded_allow_ips", None) or ""
    if args.ray_address:
        print("specdecode: note: the joined cluster's Serve proxy believes X-Forwarded-For from the addresses in its"
              " own FORWARDED_ALLOW_IPS (uvicorn's default: loopback); set it to '' there unless a proxy fronts it",
              file=sys.stderr, flush=True)
        ray.init(address=args.ray_address, logging_level=logging.WARNING)
    else:
        cores = os.cpu_count() or 1
        wanted = settings.replicas * settings.threads_per_replica
        if wanted > cores:
            print(f"specdecode: warning: {settings.replicas} replicas x {settings.threads_per_replica} threads on"
                  f" {cores} cores: they will compete for them", file=sys.stderr, flush=True)
        # A private instance for replicas on this machine: its services listen on loopback only (Ray's default is
        # the node's address, where anyone on the network could submit work to it; Ray 2.59+ also sets a token).
        ray.init(num_cpus=wanted, include_dashboard=False, object_store_memory=100 * 1024**2,
                 logging_level=logging.WARNING, _node_ip_address="127.0.0.1")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        print(f"specdecode: starting {settings.replicas} replicas of {settings.model_name} on Ray"
              f" ({settings.threads_per_replica} threads each)", flush=True)
        deploy(settings, args.host, args.port)
        print(f"specdecode: serving {settings.model_name} with {settings.replicas} replicas on"
              f" http://{args.host}:{args.port}/ (playground), API under /v1"
              f"{', API key required' if settings.api_key else ''}", flush=True)
        while not stop.wait(0.5):
            pass
        print("specdecode: shutting down (finishing running requests)", flush=True)
        if args.ray_address:
            serve.delete(APP_NAME)  # other Serve applications on a shared cluster keep running
        else:
            serve.shutdown()
    finally:
        ray.shutdown()
    return 0
