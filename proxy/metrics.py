"""Prometheus metrics of one proxy instance (its own registry, so several proxies can live in one process).

The values are plain Python numbers without locks: every update comes from the proxy's one event-loop thread,
and prometheus_client's own metric classes take a lock and validate labels on every update, which the request
path pays about ten times per request. The registry sees them through one collector, read when scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
P = "hybrid_pd_proxy_"


class _Value:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class _Metric:
    """One metric family: its children by label values (one child, key (), when it has no labels)."""

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...] = ()):
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self._children: dict[tuple[str, ...], Any] = {}
        if not self.labelnames:
            self._children[()] = self._new()

    def _new(self) -> Any:
        return _Value()

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
            child = self._children[values] = self._new()
        return child

    def remove(self, *values: str) -> None:
        del self._children[values]

    # the metric without labels
    def inc(self, amount: float = 1.0) -> None:
        self._children[()].inc(amount)

    def set(self, value: float) -> None:
        self._children[()].set(value)

    def family(self) -> Metric:
        raise NotImplementedError


class Counter(_Metric):
    def family(self) -> Metric:
        f = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for values, child in self._children.items():
            f.add_metric(list(values), child.value)
        return f


class Gauge(_Metric):
    _function: Callable[[], float] | None = None
    _children_function: Callable[[], dict[tuple[str, ...], float]] | None = None

    def set_function(self, f: Callable[[], float]) -> None:
        """The gauge's value is f(), read when scraped (a metric without labels)."""
        self._function = f

    def set_children_function(self, f: Callable[[], dict[tuple[str, ...], float]]) -> None:
        """The gauge's children are f(): {label values: value}, read when scraped."""
        self._children_function = f

    def family(self) -> Metric:
        f = GaugeMetricFamily(self.name, self.doc, labels=self.labelnames)
        if self._function is not None:
            f.add_metric([], float(self._function()))
            return f
        if self._children_function is not None:
            for values, value in self._children_function().items():
                f.add_metric(list(values), float(value))
            return f
        for values, child in self._children.items():
            f.add_metric(list(values), child.value)
        return f


class Histogram(_Metric):
    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...] = (), buckets: tuple[float, ...] = ()):
        self.buckets = tuple(float(b) for b in buckets)
        super().__init__(name, doc, labelnames)

    def _new(self) -> _Buckets:
        return _Buckets(self.buckets)

    def family(self) -> Metric:
        f = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        bounds = [*(str(b) for b in self.buckets), "+Inf"]
        for values, child in self._children.items():
            cumulative, total = [], 0
            for bound, count in zip(bounds, child.counts):
                total += count
                cumulative.append((bound, total))
            f.add_metric(list(values), cumulative, child.sum)
        return f


class ProxyMetrics:
    def __init__(self) -> None:
        self.requests = Counter(
            P + "requests", "Client requests by endpoint, PD mode and HTTP status", ("endpoint", "mode", "status")
        )
        self.errors = Counter(
            P + "errors",
            "Errors by kind (bad_request, overloaded, no_healthy_worker, "
            "upstream_4xx, upstream_5xx, timeout, unavailable, client_disconnect, internal, early_undelivered)",
            ("kind",),
        )
        self.latency = Histogram(
            P + "request_latency_seconds",
            "Whole request, first byte in to last byte out",
            ("endpoint",),
            buckets=LATENCY_BUCKETS,
        )
        self.stage_latency = Histogram(
            P + "stage_latency_seconds",
            "Time per stage: tokenize, prefill (P call), decode (D call to its last byte)",
            ("stage",),
            buckets=LATENCY_BUCKETS,
        )
        self.ttft = Histogram(
            P + "time_to_first_token_seconds",
            "Client request in to first content byte out",
            ("endpoint",),
            buckets=LATENCY_BUCKETS,
        )
        self.routing = Counter(
            P + "routing_decisions", "Workers picked, by role and policy", ("role", "policy", "worker")
        )
        self.disagg = Counter(P + "disagg_decisions", "remote prefill or not, and why", ("decision",))
        self.fallbacks = Counter(P + "fallbacks", "PD turns that fell back to decode-only, by reason", ("reason",))
        self.hit_tokens = Counter(
            P + "hit_tokens",
            "Prompt tokens served from a cache: prefill_cached (P's "
            "own hit), decoder_local (index estimate on D), reported_cached (to clients)",
            ("kind",),
        )
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of answered requests")
        self.hit_mispredictions = Counter(
            P + "hit_mispredictions",
            "Turns where the KV index promised a worker a larger hit than the worker's own cached_tokens: "
            "decode (a turn the decoder served alone; it still completes there) or prefill (P's call)",
            ("role",),
        )
        self.hit_mispredicted_tokens = Counter(
            P + "hit_mispredicted_tokens",
            "Prompt tokens the index counted as cached on a worker that computed them (by role)",
            ("role",),
        )
        self.hybrid_misroutes = Counter(
            P + "hybrid_misroutes",
            "Turns the decider let the decoder compute for a hit it counted over attention blocks past the "
            "decoder's last checkpoint there (the peers' attention-only deciders), by --pd-policy",
            ("policy",),
        )
        self.hybrid_misroute_tokens = Counter(
            P + "hybrid_misroute_recomputed_tokens",
            "Prompt tokens the decoder recomputed on those turns (held as attention blocks, no checkpoint)",
            ("policy",),
        )
        self.junction_stops = Counter(
            P + "junction_stops",
            "Remote turns whose prefiller stopped where the prompt's last message starts, its state shipped for the "
            "decoder to keep (the turn diverged from the decoder's cache where it held no checkpoint: an agent loop "
            "that drops a fixed last instruction; --junction-checkpoints)",
        )
        self.placement_rates = Gauge(
            P + "placement_rate",
            "The placement model's rates now (placement/cost_model.py: ms, MB, tokens), priors moved by this proxy's "
            "own observations",
            ("rate",),
        )
        self.placement_observations = Gauge(
            P + "placement_observations", "Observations each of the placement model's fits has taken", ("fit",)
        )
        self.abandoned_prefills = Counter(
            P + "abandoned_prefills",
            "P calls left to finish alone (client gone or total timeout); P's blocks are freed by its own lease",
        )
        self.early_deliveries = Counter(
            P + "early_deliveries",
            "Early decode: P's params delivered to the decoder's inbox, by whom: prefiller (P pushed them itself, "
            "connector/direct_delivery.py) or proxy (after P's answer)",
            ("by",),
        )
        self.tokenized = Counter(
            P + "tokenized_prompts",
            "Prompts tokenized for routing, by where: local (the proxy's own tokenizer), remote (a worker's "
            "/tokenize: no local tokenizer, or a request shape it does not reproduce), failed",
            ("source",),
        )
        self.tokenizer_local = Gauge(P + "tokenizer_local", "1 once the model's tokenizer is loaded in the proxy")
        self.in_flight = Gauge(P + "in_flight", "Requests being served")
        self.queued = Gauge(P + "queued", "Requests waiting for a slot")
        self.worker_healthy = Gauge(P + "worker_healthy", "1 admitted, 0 ejected", ("role", "worker"))
        self.worker_prompt_tokens = Gauge(
            P + "worker_prompt_tokens",
            "Uncached prompt tokens of this proxy's requests in flight on a worker (what it still has to prefill); "
            "summed over the proxy replicas: the worker's backlog",
            ("role", "worker"),
        )
        self.kv_events = Counter(P + "kv_event_batches", "KV-event batches applied", ("worker",))
        self.kv_event_gaps = Counter(P + "kv_event_gaps", "KV-event batches missed (sequence jumps)", ("worker",))
        self.kv_event_errors = Counter(P + "kv_event_errors", "Undecodable KV-event messages", ("worker",))
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    @staticmethod
    def child(metric: _Metric, *labels: str) -> Any:
        """metric.labels(*labels): one dict lookup."""
        return metric.labels(*labels)

    def collect(self) -> Iterator[Metric]:
        for metric in vars(self).values():
            if isinstance(metric, _Metric):
                yield metric.family()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class FlowRecorder:
    """What the PD flow (pd_flow.py) records, one call per fact."""

    __slots__ = ("metrics",)

    def __init__(self, metrics: ProxyMetrics):
        self.metrics = metrics

    def decision(self, decision: str) -> None:
        self.metrics.disagg.labels(decision).inc()

    def routed(self, role: str, policy: str, worker: str) -> None:
        self.metrics.routing.labels(role, policy, worker).inc()

    def fallback(self, reason: str) -> None:
        self.metrics.fallbacks.labels(reason).inc()

    def hit(self, kind: str, tokens: int) -> None:
        self.metrics.hit_tokens.labels(kind).inc(tokens)

    def misroute(self, policy: str, tokens: int) -> None:
        self.metrics.hybrid_misroutes.labels(policy).inc()
        self.metrics.hybrid_misroute_tokens.labels(policy).inc(tokens)

    def junction_stop(self) -> None:
        self.metrics.junction_stops.inc()

    def misprediction(self, role: str, tokens: int) -> None:
        self.metrics.hit_mispredictions.labels(role).inc()
        self.metrics.hit_mispredicted_tokens.labels(role).inc(tokens)

    def stage(self, stage: str, seconds: float) -> None:
        self.metrics.stage_latency.labels(stage).observe(seconds)

    def ttft(self, endpoint: str, seconds: float) -> None:
        self.metrics.ttft.labels(endpoint).observe(seconds)

    def latency(self, endpoint: str, seconds: float) -> None:
        self.metrics.latency.labels(endpoint).observe(seconds)

    def tokenized(self, source: str) -> None:
        self.metrics.tokenized.labels(source).inc()

    def error(self, kind: str) -> None:
        self.metrics.errors.labels(kind).inc()

    def abandoned_prefill(self) -> None:
        self.metrics.abandoned_prefills.inc()

    def delivered(self, by: str) -> None:
        self.metrics.early_deliveries.labels(by).inc()

    def worker_down(self, role: str, worker: str) -> None:
        self.metrics.worker_healthy.labels(role, worker).set(0)

    def request(self, endpoint: str, mode: str, status: str) -> None:
        self.metrics.requests.labels(endpoint, mode, status).inc()

    def answered(self, endpoint: str, mode: str, status: int, usage: Any) -> None:
        """A request answered with `status`; `usage` is the answer's usage object (or None)."""
        self.request(endpoint, mode, str(status))
        if isinstance(usage, dict):
            if isinstance(usage.get("prompt_tokens"), int):
                self.metrics.prompt_tokens.inc(usage["prompt_tokens"])
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                self.hit("reported_cached", details["cached_tokens"])
