"""The settings that fill a composite value rather than one field: the worker lists (a URL and its KV-event
endpoint make one WorkerSpec), the routing policies (scorers and a picker make one Policy) and the JSON file.
Declared once here, like the field settings in sections.py (declare.py); `values` picks, from a built config,
what the setting's own check judges, one item at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from .declare import Setting


@dataclass(frozen=True)
class Composite:
    setting: Setting
    values: Callable[[Any], Iterable[Any]] = lambda config: ()  # a built ProxyConfig -> the items to check


def _url(value: str) -> str | None:
    u = urlparse(value)
    return None if u.scheme in ("http", "https") and u.hostname else "is not an http(s)://host:port URL"


def _events(value: str) -> str | None:
    endpoint = value.removeprefix("bind:").removeprefix("connect:")
    ok = endpoint.startswith(("tcp://", "ipc://", "inproc://"))
    return None if ok else "is not a ZMQ endpoint ([bind:|connect:]tcp://host:port)"


def _inbox(value: str) -> str | None:
    return None if value.startswith("tcp://") and ":" in value[6:] else "is not a ZMQ endpoint (tcp://host:port)"


def _scorer(item: tuple[str, float]) -> str | None:
    from ..routing import SCORERS  # the registered plugins (late: they load with the routing package)

    name, weight = item
    if name not in SCORERS:
        return f"names an unknown scorer; known: {', '.join(sorted(SCORERS))}"
    return None if weight > 0 else "has a weight that is not > 0"


def _picker(name: str) -> str | None:
    from ..routing import PICKERS

    return None if name in PICKERS else f"is an unknown picker; known: {', '.join(sorted(PICKERS))}"


def _workers(role: str) -> list[Composite]:
    return [
        Composite(
            Setting(role, f"{role} worker base URL (repeatable)", metavar="URL", many=True, check=_url),
            lambda c: [w.url for w in getattr(c, role)],
        ),
        Composite(
            Setting(
                f"{role}_events",
                f"each {role} worker's KV-event endpoint, same order as --{role}: tcp://host:port; a loopback one "
                "is bound by the proxy (vLLM connects to it unless its endpoint is tcp://*:port), others are "
                "connected to; force with a bind: or connect: prefix",
                metavar="ZMQ",
                many=True,
                check=_events,
            ),
            lambda c: [w.events for w in getattr(c, role) if w.events is not None],
        ),
    ]


def _policy(role: str) -> list[Composite]:
    return [
        Composite(
            Setting(
                f"{role}_policy",
                f"weighted scorers for {role} workers, e.g. 'session_affinity=4,kv_hit=2,least_loaded' (scorers: "
                "least_loaded, session_affinity, kv_hit, queue_cost; 'none': the picker alone). Default: "
                "kv_hit=2,least_loaded with KV events (--*-events or k8s), else least_loaded",
                check=_scorer,
            ),
            lambda c: getattr(c.routing, role).scorers,
        ),
        Composite(
            Setting(f"{role}_picker", "picker among the best scores: round_robin (default) or first", check=_picker),
            lambda c: [getattr(c.routing, role).picker],
        ),
    ]


CONFIG_FILE = Composite(
    Setting(
        "config", 'JSON file of options (flat names, e.g. {"max_queue": 64}); the environment and flags override it'
    )
)
DECODE_INBOX = Composite(
    Setting(
        "decode_inbox",
        "each decode worker's params inbox for --early-decode, same order as --decode: tcp://host:port (the "
        "worker's --params-port)",
        metavar="ZMQ",
        many=True,
        check=_inbox,
    ),
    lambda c: [w.inbox for w in c.decode if w.inbox is not None],
)
WORKERS = [*_workers("prefill"), *_workers("decode"), DECODE_INBOX]
POLICIES = [*_policy("decode"), *_policy("prefill")]
COMPOSITES = [CONFIG_FILE, *WORKERS, *POLICIES]
