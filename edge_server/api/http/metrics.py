"""GET /metrics: Prometheus text format through prometheus-client.

Counters and histograms are fed from two places: an ASGI middleware (requests by
endpoint and status) and the engine's per-request report (tokens, TTFT, per-token
latency). Gauges (queue depth, busy sequences, KV cache use) are read at scrape time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge_server.api.http.guards.admission import Admission
from edge_server.api.http.guards.auth import require_admin
from edge_server.api.http.guards.draining import Drain
from edge_server.api.http.memory_account import memory_account
from edge_server.api.http.send_buffers import SendBuffers
from edge_server.catalogue.pool import ModelPool
from edge_server.engine.sched.scheduler import JobStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
_TOKEN_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("edge_server_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("edge_server_prompt_tokens", "prompt tokens processed",
                                     ["model"], registry=r)
        self.cached_tokens = Counter("edge_server_prompt_cached_tokens",
                                     "prompt tokens reused from the KV cache", ["model"],
                                     registry=r)
        self.completion_tokens = Counter("edge_server_completion_tokens",
                                         "completion tokens generated", ["model"], registry=r)
        self.ttft = Histogram("edge_server_time_to_first_token_seconds",
                              "submit to first token", ["model"], buckets=_LATENCY_BUCKETS,
                              registry=r)
        self.per_token = Histogram("edge_server_time_per_output_token_seconds",
                                   "decode time per generated token after the first",
                                   ["model"], buckets=_TOKEN_BUCKETS, registry=r)
        self.queue_wait = Histogram("edge_server_queue_wait_seconds",
                                    "submit to admission into a slot", ["model"],
                                    buckets=_LATENCY_BUCKETS, registry=r)

    def observe_job(self, model_id: str, stats: JobStats) -> None:
        """Called on the engine thread; prometheus-client is thread-safe."""
        self.prompt_tokens.labels(model_id).inc(stats.prompt_tokens)
        self.cached_tokens.labels(model_id).inc(stats.cached_tokens)
        self.completion_tokens.labels(model_id).inc(stats.completion_tokens)
        self.queue_wait.labels(model_id).observe(stats.queued_s)
        if stats.first_token_s is not None:
            self.ttft.labels(model_id).observe(stats.first_token_s)
        if stats.completion_tokens > 1:
            self.per_token.labels(model_id).observe(
                stats.decode_s / (stats.completion_tokens - 1))

    def watch_pool(self, pool: ModelPool) -> None:
        self.registry.register(_PoolCollector(pool))

    def watch_drain(self, drain: Drain) -> None:
        """Requests in flight, and whether SIGTERM's drain is on: how a stop is watched."""
        Gauge("edge_server_requests_in_flight", "HTTP requests being served (not /health "
              "or /metrics)", registry=self.registry).set_function(lambda: drain.in_flight)
        Gauge("edge_server_draining", "1 while draining after SIGTERM",
              registry=self.registry).set_function(lambda: float(drain.draining))


    def watch_send_buffers(self, buffers: SendBuffers) -> None:
        """Answers waiting for their readers, and the connections closed for them."""
        r = self.registry
        Gauge("edge_server_send_buffer_bytes", "bytes of answers waiting for their "
              "readers, all connections", registry=r).set_function(lambda: buffers.held)
        Gauge("edge_server_send_buffer_connections_behind", "connections whose readers "
              "have not taken all that was written", registry=r
              ).set_function(lambda: buffers.behind)
        Gauge("edge_server_send_buffer_closed_over_limit_total", "connections closed "
              "because all answers waiting held more than --send-buffer-mb", registry=r
              ).set_function(lambda: buffers.closed_over_limit)
        Gauge("edge_server_send_timeout_closed_total", "connections closed after being "
              "behind for --send-timeout", registry=r
              ).set_function(lambda: buffers.closed_behind)

    def watch_admission(self, admission: Admission) -> None:
        """Generation requests admitted, and those refused unread (cheap refusal)."""
        Gauge("edge_server_requests_admitted", "generation requests admitted whose engine "
              "work is not yet done", registry=self.registry
              ).set_function(lambda: admission.admitted)
        Gauge("edge_server_requests_refused_unread_total", "generation requests refused "
              "with a 429 before their body was read", registry=self.registry
              ).set_function(lambda: admission.refused)


class _PoolCollector:
    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "waiting": GaugeMetricFamily("edge_server_queue_depth",
                                         "requests waiting for a slot", labels=["model"]),
            "busy_sequences": GaugeMetricFamily("edge_server_busy_sequences",
                                                "sequences being generated", labels=["model"]),
            "busy_slots": GaugeMetricFamily("edge_server_busy_slots", "slots serving a request",
                                            labels=["model"]),
            "kv_tokens": GaugeMetricFamily("edge_server_kv_cache_tokens",
                                           "tokens held in the KV cache", labels=["model"]),
            "kv_capacity": GaugeMetricFamily("edge_server_kv_cache_capacity_tokens",
                                             "KV cache size in tokens", labels=["model"]),
            "prompt_store_bytes": GaugeMetricFamily(
                "edge_server_prompt_cache_bytes",
                "prompt prefixes kept in host RAM beyond the KV cache", labels=["model"]),
        }
        for model_id, stats in self.pool.stats().items():
            for key, gauge in gauges.items():
                gauge.add_metric([model_id], stats[key])
        yield from gauges.values()
        yield from self._engine_counters()
        loaded = GaugeMetricFamily("edge_server_model_loaded", "1 if the model is loaded",
                                   labels=["model"])
        load_time = GaugeMetricFamily("edge_server_model_load_seconds",
                                      "duration of the model's last load", labels=["model"])
        for spec in self.pool.specs:
            loaded.add_metric([spec.id], 1.0 if self.pool.is_loaded(spec.id) else 0.0)
            if spec.id in self.pool.load_seconds:
                load_time.add_metric([spec.id], self.pool.load_seconds[spec.id])
        yield loaded
        yield load_time
        memory = GaugeMetricFamily("edge_server_memory_bytes", "resident memory (part "
                                   "`rss`) and what holds it: the memory account",
                                   labels=["part"])
        for part, size in memory_account(self.pool).items():
            memory.add_metric([part], size)
        yield memory

    def _engine_counters(self) -> Iterator[CounterMetricFamily]:
        """Kept by each model's engine: embedding batches against requests shows how often
        concurrent requests shared a llama_decode; drafts kept against drafted, how much
        lookup drafting saves."""
        counters = {key: CounterMetricFamily(f"edge_server_{key}", text, labels=["model"])
                    for key, text in _ENGINE_COUNTERS.items()}
        for model_id, stats in self.pool.stats().items():
            for key, counter in counters.items():
                if key in stats:  # embeddings: only once the model served some
                    counter.add_metric([model_id], stats[key])
        yield from counters.values()


_ENGINE_COUNTERS = {
    "draft_tokens": "tokens drafted by lookup and verified in a decode step",
    "draft_tokens_accepted": "drafted tokens kept (each saved a decode step)",
    "grouped_decode_steps": "decode steps that carried one group of the generating "
                            "sequences (the groups take turns where that is faster)",
    "draft_model_tokens": "tokens the draft model drafted (of draft_tokens)",
    "draft_model_tokens_accepted": "draft model tokens kept",
    "lora_set_switches": "decode steps under another LoRA adapter set than the step before "
                         "(requests under different sets take turns)",
    "embedding_requests": "embeddings requests queued",
    "embedding_inputs": "inputs embedded",
    "embedding_tokens": "tokens embedded",
    "embedding_batches": "llama_decode calls of the embedding worker",
    "embedding_shared_batches": "embedding batches holding inputs of several requests",
}


class RequestCounter:
    """ASGI middleware counting responses by route and status. A request is labelled
    with the path of the route that serves it ("/v1/models/{model}"), so every route has
    its own label as it is added; unknown paths share "other", so that clients cannot
    blow up the label set."""

    def __init__(self, app: ASGIApp, metrics: Metrics, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        served = [r for r in routes if isinstance(r, Route)]
        self._fixed = {r.path: r.path for r in served if not r.param_convertors}
        self._templates = [(r.path_regex, _PARAM_TYPE.sub(r"{\1}", r.path))
                           for r in served if r.param_convertors]

    def endpoint(self, path: str) -> str:
        label = self._fixed.get(path)
        if label is not None:
            return label
        return next((label for regex, label in self._templates if regex.match(path)),
                    "other")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = self.endpoint(scope.get("path", ""))

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


# A path parameter's type is no part of its label: "{model:path}" is "{model}".
_PARAM_TYPE = re.compile(r"\{(\w+):\w+\}")


def metrics_route(metrics: Metrics) -> Route:
    async def scrape(request: Request) -> Response:
        # Every key's work is in these counters: where keys are set, the admin key's.
        require_admin(request, "reading /metrics (counters of every key's requests)")
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Route("/metrics", scrape, methods=["GET"])
