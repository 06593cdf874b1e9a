"""Prometheus metrics of the server, each app with its own registry (several apps may share a process)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..stats import GenerationStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60)
# A prompt that found at least this many of its tokens in the engine's cache counts as a prefix hit: more
# than a chat template's fixed header, which every chat prompt shares.
PREFIX_HIT_MIN_TOKENS = 32
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("specdecode_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter("specdecode_errors", "Error responses by kind (the OpenAI error code or type)",
                              ["kind"], registry=r)
        self.cancelled = Counter("specdecode_cancelled", "Generations stopped early, by reason",
                                 ["reason"], registry=r)
        self.prompt_tokens = Counter("specdecode_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generated_tokens = Counter("specdecode_generated_tokens", "Tokens generated", ["drafter"], registry=r)
        self.drafted_tokens = Counter("specdecode_drafted_tokens", "Draft tokens proposed", ["drafter"], registry=r)
        self.accepted_tokens = Counter("specdecode_accepted_tokens", "Draft tokens accepted", ["drafter"], registry=r)
        self.target_passes = Counter("specdecode_target_passes", "Target forward passes while decoding",
                                     ["drafter"], registry=r)
        self.acceptance_rate = Gauge("specdecode_acceptance_rate",
                                     "Acceptance rate alpha = accepted / drafted, since start", ["drafter"], registry=r)
        self.tokens_per_pass = Gauge("specdecode_tokens_per_target_pass",
                                     "tau = generated tokens / target passes, since start", ["drafter"], registry=r)
        self.ttft = Histogram("specdecode_time_to_first_token_seconds",
                              "Request arrival to first generated token (queue wait included)",
                              buckets=TTFT_BUCKETS, registry=r)
        self.token_latency = Histogram("specdecode_inter_token_latency_seconds",
                                       "Time per generated token after the first", buckets=LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("specdecode_queue_wait_seconds", "Time a request waited for the engine",
                                    buckets=TTFT_BUCKETS, registry=r)
        self.request_duration = Histogram("specdecode_generation_duration_seconds",
                                          "Request arrival to last token", buckets=TTFT_BUCKETS, registry=r)
        self.decode_speed = Histogram("specdecode_decode_tokens_per_second",
                                      "Generated tokens per second of decoding (prompt prefill left out), per generation",
                                      ["drafter"], buckets=(1, 2, 5, 10, 15, 20, 30, 40, 60, 80, 120, 200, 400), registry=r)
        self.prefix_hits = Counter("specdecode_prefix_hits",
                                   f"Requests that found at least {PREFIX_HIT_MIN_TOKENS} prompt tokens in the engine's cache",
                                   registry=r)
        self.prefix_reused_tokens = Counter("specdecode_prefix_reused_tokens",
                                            "Prompt tokens whose keys and values came from the engine's cache", registry=r)
        self.queue_depth = Gauge("specdecode_queue_depth", "Requests waiting for the engine", registry=r)
        self.running = Gauge("specdecode_requests_running", "Requests being generated (the batch's size)", registry=r)
        self.batch_size = Histogram("specdecode_batch_size", "Requests in each target pass",
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32), registry=r)
        self.rows_per_pass = Histogram("specdecode_rows_per_pass", "Rows (tokens) in each target pass",
                                       buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024), registry=r)
        self.store_tokens = Gauge("specdecode_suffix_store_tokens",
                                  "Tokens of earlier requests the suffix drafter may copy from (all clients)", registry=r)
        self.store_max_tokens = Gauge("specdecode_suffix_store_max_tokens", "The store's cap (--suffix-store-tokens)",
                                      registry=r)
        info = Gauge("specdecode_model_info", "The served model", ["model"], registry=r)
        info.labels(model=model_name).set(1)
        self._totals: dict[str, list[int]] = {}  # drafter -> [drafted, accepted, decoded, passes]

    def record_generation(self, stats: GenerationStats) -> None:
        drafter = stats.drafter
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generated_tokens.labels(drafter).inc(stats.generated_tokens)
        self.drafted_tokens.labels(drafter).inc(stats.drafted)
        self.accepted_tokens.labels(drafter).inc(stats.accepted)
        self.target_passes.labels(drafter).inc(stats.target_passes)
        decode_seconds = stats.time_total - stats.time_prefill
        if stats.generated_tokens and decode_seconds > 0:
            self.decode_speed.labels(drafter).observe(stats.generated_tokens / decode_seconds)
        totals = self._totals.setdefault(drafter, [0, 0, 0, 0])
        for i, value in enumerate((stats.drafted, stats.accepted, stats.decoded_tokens, stats.target_passes)):
            totals[i] += value
        drafted, accepted, decoded, passes = totals
        if drafted:
            self.acceptance_rate.labels(drafter).set(accepted / drafted)
        if passes:
            self.tokens_per_pass.labels(drafter).set(decoded / passes)

    def record_store(self, store) -> None:
        """The cross-request store's size after a generation added to it (and evicted the oldest past its cap)."""
        self.store_tokens.set(store.tokens)
        self.store_max_tokens.set(store.max_tokens)

    def record_prefix_reuse(self, reused_tokens: int) -> None:
        self.prefix_reused_tokens.inc(reused_tokens)
        if reused_tokens >= PREFIX_HIT_MIN_TOKENS:
            self.prefix_hits.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Families:
    """A collector that hands out ready-made metric families (merged from other processes' exposition text)."""

    def __init__(self, families):
        self.families = list(families)

    def collect(self):
        return self.families


def merge_replica_metrics(entry_text: bytes, entry_families: set[str], replica_texts: dict[str, bytes],
                          extra_families=()) -> bytes:
    """One Prometheus page from an entry point's own families (HTTP requests, errors) and every replica's
    page, each replica's samples labelled replica="<id>"; families of the same name are merged."""
    from prometheus_client.metrics_core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    merged: dict[str, Metric] = {}

    def add(text: bytes, keep, replica: str | None) -> None:
        for family in text_string_to_metric_families(text.decode("utf-8")):
            if not keep(family.name):
                continue
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labels = dict(sample.labels) if replica is None else {**sample.labels, "replica": replica}
                target.samples.append(sample._replace(labels=labels))

    add(entry_text, lambda name: name in entry_families, None)
    for replica, text in sorted(replica_texts.items()):
        add(text, lambda name: name not in entry_families, replica)
    registry = CollectorRegistry()
    registry.register(_Families([*merged.values(), *extra_families]))
    return generate_latest(registry)
