"""`specdecode serve`: load the engine as the flags say, serve until SIGINT / SIGTERM, exit 0 on SIGTERM.
With --replicas N > 1 the engines run as replicas on a Ray cluster (cluster.py); Ray is imported only then."""
from __future__ import annotations

import signal
import threading
import time

from ..build import build_engine, freeze_loaded_objects
from ..errors import require_extra
from .app import create_app
from .http_parts import connection_options
from .scheduler import Scheduler
from .serve_options import api_keys_from_args, check_serve_args, exposure_options, served_model_name, uvicorn_config


def draining_server(scheduler: Scheduler, grace: float, config):
    """A uvicorn server that on SIGTERM/SIGINT keeps listening but answers new requests 503 + Retry-After, finishes
    the running and queued generations, then stops; past `grace` seconds it cuts what still runs (finish_reason
    "length", queued requests get a 503 error) and stops. A second signal stops at once."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        draining = False

        def handle_exit(self, sig, frame):
            if self.draining:
                scheduler.begin_shutdown_threadsafe()
                return super().handle_exit(sig, frame)
            self.draining = True
            scheduler.begin_drain()  # a flag the event loop reads: safe from the signal handler
            threading.Thread(target=self._exit_when_drained, args=(sig, frame), daemon=True).start()

        def _exit_when_drained(self, sig, frame):
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and not scheduler.idle():
                time.sleep(0.05)
            if not scheduler.idle():
                scheduler.begin_shutdown_threadsafe()  # the running generation ends at its next step
                while time.monotonic() < deadline + 10 and not scheduler.idle():
                    time.sleep(0.05)
            super().handle_exit(sig, frame)  # uvicorn then lets open responses finish sending

    return DrainingServer(config)


def server_config(app, args):
    """uvicorn's settings for `specdecode serve`: the address, and bounds on what connections may hold (a deadline on
    each request's headers and body, a connection limit: http_parts.connection_options)."""
    return uvicorn_config(app, host=args.host, port=args.port, forwarded_allow_ips=getattr(args, "forwarded_allow_ips", None),
                          log_level="info", timeout_graceful_shutdown=15,
                          **connection_options(args.header_timeout, args.limit_concurrency))


def run_server(args) -> int:
    if check_serve_args(args):
        require_extra("cluster", "ray")
        from .cluster import run_cluster_server

        return run_cluster_server(args)
    api_keys = api_keys_from_args(args)  # a bad key file fails before the model loads
    allowed_hosts = exposure_options(args)
    engine, drafter = build_engine(args)
    model_name = served_model_name(args)
    app = create_app(engine, drafter, model_name, api_key=api_keys, queue_size=args.queue_size, warmup=True,
                     allowed_hosts=allowed_hosts, cors_origins=args.cors_origin or [], max_batch=args.max_batch,
                     metrics_key=getattr(args, "metrics_key", None), expose_timings=getattr(args, "expose_timings", False))
    app.state.body_timeout = args.body_timeout
    config = server_config(app, args)
    server = draining_server(app.state.scheduler, max(0.0, float(args.shutdown_grace)), config)
    freeze_loaded_objects()
    # uvicorn re-raises the caught signal after its graceful shutdown; for SIGTERM that would end the
    # process with status -15. This handler (restored by uvicorn before re-raising) swallows it: exit 0.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    print(f"specdecode: serving {model_name} (default drafter: {drafter}) on http://{args.host}:{args.port}/"
          f" (playground), API under /v1{', API key required' if api_keys else ''}", flush=True)
    server.run()
    return 0
