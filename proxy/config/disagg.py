"""The proxy's PD section (DisaggConfig): whether and where a turn's prompt is computed remotely, the policy that
decides it (ours: placement/cost_model.py; the peers' deciders), and the flow's PD options. Apart from sections.py
for its size; like it, it imports nothing of the proxy but the declarations.
"""

from __future__ import annotations

from dataclasses import dataclass

from .declare import at_least, boolean, one_of, setting, within

PD_POLICIES = ("auto", "ours", "always-remote", "isl-bounding", "non-cached-tokens", "hit-ratio")
PREFILLER_STOPS = ("model", "boundary", "last")


@dataclass(frozen=True)
class DisaggConfig:
    enabled: bool = setting(True, "disagg", "remote prefill at all (off: every request is decode-only)", parse=boolean)
    policy: str = setting(
        "auto",
        "pd_policy",
        "who decides where a turn's prompt is computed, once its decoder is chosen: ours (placement/cost_model.py: the "
        "least predicted TTFT within --itl-slo-ms, from every worker's attention + checkpoint hit and load); "
        "always-remote (upstream's toy proxy); isl-bounding (Dynamo's conditional disaggregation: the decoder "
        "alone under --isl-max-tokens and --isl-ratio of uncached input); non-cached-tokens (llm-d's prefix-based "
        "PD decider: a prefiller from --non-cached-tokens uncached tokens); hit-ratio (deprecated: the "
        "decoder alone from --decoder-hit-ratio of the prompt, 0.8 unless given). The peers' deciders read "
        "attention-only hits, as theirs do. auto: ours, or hit-ratio where --decoder-hit-ratio is given",
        choices=PD_POLICIES,
        check=one_of(*PD_POLICIES),
    )
    itl_slo_ms: float = setting(
        0.0,
        "itl_slo_ms",
        "policy ours: the longest inter-token gap a turn may cause the decoder's running streams (its prefill on "
        "the decoder stalls each of them for about its duration); within it, the least TTFT wins. 0: no bound; "
        "the least total delay (the turn's TTFT plus each running stream's stall) wins",
        parse=float,
        check=at_least(0),
    )
    shared_device: bool = setting(
        False, "shared_device", "policy ours: P and D on one GPU, a prefill on P stalls D's streams too", parse=boolean
    )
    shared_device_stall: float = setting(
        1.0,
        "shared_device_stall",
        "with --shared-device: the share of P's prefill D's streams wait for (1: all)",
        parse=float,
        check=within(0, 1),
    )
    next_turn: bool = setting(
        True,
        "next_turn",
        "policy ours: the decoder alone carries what it leaves a conversation's next turn, the prefiller's recompute "
        "of what it computed times the recent share of turns that went on on a prefiller",
        parse=boolean,
    )
    prefiller_queue: bool = setting(
        True,
        "prefiller_queue",
        "policy ours: a remote option carries the delay its prefill adds to the requests that queue behind it on "
        "the prefiller (as many as it finds there), as the decoder alone carries its stall of the decoder's streams",
        parse=boolean,
    )
    learn_local_alone: bool = setting(
        False,
        "learn_local_alone",
        "policy ours: a turn the decoder served alone teaches the prefill rates only where nothing else was on the "
        "decoder until its first token, as a prefiller's call does (its TTFT then times a prefill, not a prefill "
        "queued behind other streams' steps); off: every such turn does",
        parse=boolean,
    )
    align_split: bool = setting(
        False,
        "align_split",
        "policy ours: the engines' align mode ends a prefill step at the last aligned boundary below a prompt's end "
        "and computes the rest in one more (vLLM before 0.32, and layers without prefill checkpoints, e.g. 0.33's GDN "
        "on Triton); off: the state there is written inside the prompt's last chunk, a step fewer in the cost "
        "model's prices. Until a prefiller says: hybrid-pd's prefillers tell with every answer, and that wins",
        parse=boolean,
    )
    prefiller_stop: str = setting(
        "model",
        "prefiller_stop",
        "where a prefiller stops computing a remote turn's prompt of a hybrid model: model (policy ours: whichever "
        "the cost model prices lower; the other policies: the prefiller's own setting, HYBRID_PD_PREFILL_TO_BOUNDARY, "
        "auto by default); boundary (the last aligned boundary below the prompt's end: the decoder computes the rest "
        "in a prefill step of its own); last (one token short: the decoder computes the last token in a "
        "decode-shaped step)",
        choices=PREFILLER_STOPS,
        check=one_of(*PREFILLER_STOPS),
    )
    junction_checkpoints: bool = setting(
        True,
        "junction_checkpoints",
        "policy ours, chat: where a remote turn diverged from the decoder's cache past the decoder's last "
        "checkpoint (an agent loop whose next turn drops a fixed last instruction), the prefiller stops where the "
        "last message starts and that state crosses for the decoder to keep; the decoder computes the last "
        "message itself, and the next turn, diverging there, hits it",
        parse=boolean,
    )
    min_prompt_tokens: int = setting(
        0,
        "min_prompt_tokens",
        "prefill shorter prompts on the decoder (needs tokenization)",
        parse=int,
        check=at_least(0),
    )
    min_prompt_chars: int = setting(
        0, "min_prompt_chars", "prefill shorter prompts (characters) on the decoder", parse=int, check=at_least(0)
    )
    decoder_hit_ratio: float = setting(
        0.0,
        "decoder_hit_ratio",
        "deprecated (policy hit-ratio, which giving it selects): prefill on the decoder when it already holds this "
        "share of the prompt (0: not set). Measured: a decoder holding 0.71 of a turn computed its tail in 117 ms "
        "where the prefiller took 146 ms (H100, 2026-11-24 run); policy ours decides in time instead",
        parse=float,
        check=within(0, 1),
    )
    min_uncached_blocks: float = setting(
        1.0,
        "min_uncached_blocks",
        "policy hit-ratio: prefill on the decoder when what it lacks (past its attention + checkpoint "
        "hit) is under this many aligned blocks (0: off; needs KV events)",
        parse=float,
        check=at_least(0),
    )
    load_aware: bool = setting(
        True,
        "disagg_load_aware",
        "policy hit-ratio: apply the two rules above only while prefilling on the decoder delays its "
        "running streams less than a remote prefill would cost (see --remote-overhead-tokens)",
        parse=boolean,
    )
    remote_overhead_tokens: int = setting(
        1024,
        "remote_overhead_tokens",
        "policy hit-ratio: a remote prefill's fixed cost (hop to P, READ, the decoder's wait) in "
        "tokens of prefill compute (1024: ~30 ms of an H200 at Qwen3-Next shapes)",
        parse=int,
        check=at_least(0),
    )
    isl_max_tokens: int = setting(
        2048,
        "isl_max_tokens",
        "policy isl-bounding: the decoder alone under this many uncached tokens (Dynamo's eff_isl_threshold) ...",
        parse=int,
        check=at_least(0),
    )
    isl_ratio: float = setting(
        0.7,
        "isl_ratio",
        "policy isl-bounding: ... and under this share of the prompt (Dynamo's eff_isl_ratio_threshold)",
        parse=float,
        check=within(0, 1),
    )
    non_cached_tokens: int = setting(
        128,
        "non_cached_tokens",
        "policy non-cached-tokens: a prefiller from this many uncached tokens (llm-d's nonCachedTokens; 128 = 8 "
        "of its prefix plugin's 16-token blocks)",
        parse=int,
        check=at_least(0),
    )
    warm_pairs: bool = setting(
        False,
        "warm_pairs",
        "send each admitted prefiller/decoder pair one short PD request of the proxy's own before clients' (the "
        "first READ between two engines takes ~1 s: handshake, memory mapping, first kernels); /health answers "
        "503 until the first ones end (90 s at most)",
        parse=boolean,
    )
    log_placement: bool = setting(
        False,
        "log_placement",
        "policy ours: log each turn's placement at INFO (every option's predicted TTFT, stall and cost, the choice) "
        "and, once the turn has ended, the TTFT it had, P's call against its price and the factor on P's call learned",
        parse=boolean,
    )
    early_decode: bool = setting(
        False,
        "early_decode",
        "a remote turn's decode request goes to the decoder together with the prefill request, not after P's "
        "answer: the decoder admits and tokenizes it while P computes, and the proxy delivers P's params (or P's "
        "failure: the decoder computes the prompt) to its params inbox (--decode-inbox); decoders without one are "
        "served in turn as before",
        parse=boolean,
    )
    usage_breakdown: bool = setting(
        True,
        "usage_breakdown",
        "add usage.hybrid_pd to answers: what the prefiller hit, what the decoder hit, where the prompt was "
        "computed (usage.prompt_tokens_details.cached_tokens is unchanged)",
        parse=boolean,
    )

    @property
    def pd_policy(self) -> str:
        """The policy in force: auto is ours, or hit-ratio where --decoder-hit-ratio is given."""
        if self.policy == "auto":
            return "hit-ratio" if self.decoder_hit_ratio > 0 else "ours"
        return self.policy
