"""What the entry point and every replica of `serve --replicas` are told: one record, pickled to each."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClusterSettings:
    engine_options: dict  # the `serve` flags build_engine reads (model, draft, precision, ctx, ...)
    model_name: str
    replicas: int = 2
    threads_per_replica: int = 1
    queue_size: int = 16
    max_batch: int = 8
    api_key: object = None  # exposure.ApiKeys, one key, or None (an open API)
    metrics_key: str | None = None  # None: the API key
    expose_timings: bool = False
    allowed_hosts: set[str] | None = None
    cors_origins: list[str] = field(default_factory=list)
    shutdown_grace_s: float = 30.0
    routing: dict = field(default_factory=dict)  # PrefixRouter's knobs: block_chars, min_prefix_chars, max_imbalance
