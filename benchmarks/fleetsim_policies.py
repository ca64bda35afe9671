"""What a simulated proxy decides with: routing policies (the proxy's own Router and plugins) and a placement rule
(P or D for the prefill), named so that the fleet tables compare them.

    policy            decode router / prefill router            placement                      index routing sees
    ours              kv_hit=2,least_loaded / same               proxy.placement.disagg.decide  hybrid (+ checkpoints)
    round_robin       round robin / round robin                  always remote                  -
    session_affinity  session_affinity / session_affinity        always remote                  -
    isl_bounding      kv_hit,least_loaded / same                 remote when prompt - D's hit   attention only
                                                                 >= 4,096 (Dynamo's conditional
                                                                 disaggregation, policy "isl")
    non_cached        kv_hit,least_loaded / same                 remote when prompt - D's hit   attention only
                                                                 >= 512 (llm-d's PD decider on
                                                                 non-cached tokens)

The peers' routers are modelled with our scorers over an index that sees only the attention group's events: a
router that does not know the hybrid rule counts every attention block it holds as a hit (Dynamo's KV router and
llm-d's prefix scorer key blocks by hash, not by KV-cache group). Their thresholds are their documented
examples, not tuned. A placement rule is a function of `PlacementInput`; PLACEMENTS is where the time-based
model plugs in: `time_model` is registered when proxy/placement/cost_model.py is importable (its `place()` picks the
prefiller too: a placement may answer a prefiller's URL instead of True).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.config.sections import DisaggConfig, Policy
from proxy.placement.disagg import REMOTE, REMOTE_DECODER_BUSY, decide


@dataclass(frozen=True)
class Prefiller:
    url: str
    hit: int  # the prompt's usable hit on it, as the router's index sees it
    load: int  # requests in flight
    queued_tokens: int  # uncached prompt tokens of those


@dataclass(frozen=True)
class PlacementInput:
    prompt_tokens: int
    decoder_hit: int  # D's usable hit as the router's index sees it
    prefill_hit: int  # the best prefiller's
    decoder_busy: int  # requests in flight on D
    aligned_block: int
    decoder_url: str = ""
    prefillers: tuple[Prefiller, ...] = field(default=())


Placement = Callable[[PlacementInput], "bool | str"]  # False: on D; True: on P (the prefill router picks); a URL


def ours(cfg: DisaggConfig) -> Placement:
    def place(x: PlacementInput) -> bool:
        return decide(
            cfg,
            eligible=True,
            has_prefillers=True,
            prompt_chars=0,
            prompt_tokens=x.prompt_tokens,
            decoder_hit=x.decoder_hit,
            aligned_block=x.aligned_block,
            decoder_busy=x.decoder_busy,
            prefill_hit=x.prefill_hit,
        ) in (REMOTE, REMOTE_DECODER_BUSY)

    return place


def uncached_at_least(threshold: int) -> Placement:
    return lambda x: x.prompt_tokens - x.decoder_hit >= threshold


def time_model(cfg: DisaggConfig) -> Placement:
    """proxy.placement.cost_model.place with its priors and no ITL objective (the least total delay)."""
    from proxy.placement import cost_model as pm  # type: ignore[attr-defined]

    def place(x: PlacementInput) -> bool | str:
        d = pm.WorkerView(x.decoder_url, hit=x.decoder_hit, load=x.decoder_busy)
        ps = [pm.WorkerView(p.url, hit=p.hit, load=p.load, queued_tokens=p.queued_tokens) for p in x.prefillers]
        chosen = pm.place(x.prompt_tokens, d, ps, aligned_block=x.aligned_block).prefiller
        return False if chosen is None else chosen

    return place


PLACEMENTS: dict[str, Callable[[DisaggConfig], Placement]] = {
    "ours": ours,
    "always_remote": lambda cfg: lambda x: True,
    "isl_bounding": lambda cfg: uncached_at_least(4096),
    "non_cached": lambda cfg: uncached_at_least(512),
}
HAVE_TIME_MODEL = importlib.util.find_spec("proxy.placement.cost_model") is not None
if HAVE_TIME_MODEL:
    PLACEMENTS["time_model"] = time_model


@dataclass(frozen=True)
class PolicySpec:
    name: str
    decode: Policy
    prefill: Policy
    placement: str
    hybrid_index: bool = True


KV_LOAD = Policy((("kv_hit", 2.0), ("least_loaded", 1.0)))
PEER_KV_LOAD = Policy((("kv_hit", 1.0), ("least_loaded", 1.0)))
RR = Policy((), "round_robin")
AFFINITY = Policy((("session_affinity", 1.0),))

POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec("ours", KV_LOAD, KV_LOAD, "ours"),
        PolicySpec("round_robin", RR, RR, "always_remote"),
        PolicySpec("session_affinity", AFFINITY, AFFINITY, "always_remote"),
        PolicySpec("isl_bounding", PEER_KV_LOAD, PEER_KV_LOAD, "isl_bounding", hybrid_index=False),
        PolicySpec("non_cached", PEER_KV_LOAD, PEER_KV_LOAD, "non_cached", hybrid_index=False),
    )
}
if HAVE_TIME_MODEL:
    POLICIES["time_model"] = PolicySpec("time_model", KV_LOAD, KV_LOAD, "time_model")
