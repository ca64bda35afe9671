"""Prometheus metrics of one proxy instance (its own registry, so several proxies can live in one process)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
P = "hybrid_pd_proxy_"


class ProxyMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(P + "requests", "Client requests by endpoint, PD mode and HTTP status",
                                ["endpoint", "mode", "status"], registry=r)
        self.errors = Counter(P + "errors", "Errors by kind (bad_request, overloaded, no_healthy_worker, "
                              "upstream_4xx, upstream_5xx, timeout, unavailable, client_disconnect, internal)",
                              ["kind"], registry=r)
        self.latency = Histogram(P + "request_latency_seconds", "Whole request, first byte in to last byte out",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.stage_latency = Histogram(P + "stage_latency_seconds", "Time per stage: tokenize, prefill (P call), "
                                       "decode (D call to its last byte)", ["stage"], buckets=LATENCY_BUCKETS,
                                       registry=r)
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Client request in to first content byte out",
                              ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.routing = Counter(P + "routing_decisions", "Workers picked, by role and policy",
                               ["role", "policy", "worker"], registry=r)
        self.disagg = Counter(P + "disagg_decisions", "remote prefill or not, and why", ["decision"], registry=r)
        self.fallbacks = Counter(P + "fallbacks", "PD turns that fell back to decode-only, by reason",
                                 ["reason"], registry=r)
        self.hit_tokens = Counter(P + "hit_tokens", "Prompt tokens served from a cache: prefill_cached (P's "
                                  "own hit), decoder_local (index estimate on D), reported_cached (to clients)",
                                  ["kind"], registry=r)
        self.prompt_tokens = Counter(P + "prompt_tokens", "Prompt tokens of answered requests", registry=r)
        self.abandoned_prefills = Counter(P + "abandoned_prefills", "P calls left to finish alone (client gone "
                                          "or total timeout); P's blocks are freed by its own lease", registry=r)
        self.in_flight = Gauge(P + "in_flight", "Requests being served", registry=r)
        self.queued = Gauge(P + "queued", "Requests waiting for a slot", registry=r)
        self.worker_healthy = Gauge(P + "worker_healthy", "1 admitted, 0 ejected", ["role", "worker"], registry=r)
        self.kv_events = Counter(P + "kv_event_batches", "KV-event batches applied", ["worker"], registry=r)
        self.kv_event_gaps = Counter(P + "kv_event_gaps", "KV-event batches missed (sequence jumps)", ["worker"],
                                     registry=r)
        self.kv_event_errors = Counter(P + "kv_event_errors", "Undecodable KV-event messages", ["worker"],
                                       registry=r)

        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), looked up once per label set: prometheus_client's labels() takes a lock and
        validates on every call, which the hot path pays several times per request. Not for metrics whose
        children are removed (worker_healthy)."""
        key = (metric, labels)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = metric.labels(*labels)
        return c

    def render(self) -> bytes:
        return generate_latest(self.registry)
