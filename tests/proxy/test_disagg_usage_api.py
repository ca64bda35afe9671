"""Pure pieces of the flow: the disaggregation decision, the cached_tokens rule, request parsing."""

from __future__ import annotations

import dataclasses

import pytest

from hybrid_pd.proxy.config import DisaggConfig
from hybrid_pd.proxy.errors import BadRequest
from hybrid_pd.proxy.openai_api import parse_request
from hybrid_pd.proxy.placement.cost_model import WorkerView, place
from hybrid_pd.proxy.placement.disagg import decide
from hybrid_pd.proxy.usage import breakdown, fix_usage, prefill_hit, reported_cached, whole_request_cached_tokens

ARGS = dict(eligible=True, has_prefillers=True, prompt_chars=1000, prompt_tokens=400, decoder_hit=None)
LEGACY = DisaggConfig(policy="hit-ratio")  # the deprecated rule, as before the placement model


@pytest.mark.parametrize("cfg, changes, expected", [
    (DisaggConfig(), {}, "remote"),
    (DisaggConfig(enabled=False), {}, "local_disabled"),
    (DisaggConfig(), {"eligible": False}, "local_ineligible"),
    (DisaggConfig(), {"has_prefillers": False}, "local_no_prefiller"),
    (DisaggConfig(min_prompt_tokens=401), {}, "local_short"),
    (DisaggConfig(min_prompt_tokens=400), {}, "remote"),
    (DisaggConfig(min_prompt_chars=2000), {}, "remote"),  # tokens known: characters do not decide
    (DisaggConfig(min_prompt_chars=2000), {"prompt_tokens": None}, "local_short"),
    (DisaggConfig(decoder_hit_ratio=0.75), {"decoder_hit": 300}, "local_decoder_hit"),
    (DisaggConfig(decoder_hit_ratio=0.75), {"decoder_hit": 299}, "remote"),
    # what D lacks past its own hit, against the aligned block (256): under one block stays on D
    (LEGACY, {"prompt_tokens": 255, "aligned_block": 256}, "local_small_uncached"),
    (LEGACY, {"prompt_tokens": 256, "aligned_block": 256}, "remote"),
    (LEGACY, {"decoder_hit": 256, "prompt_tokens": 500, "aligned_block": 256}, "local_small_uncached"),
    (LEGACY, {"decoder_hit": 256, "prompt_tokens": 512, "aligned_block": 256}, "remote"),
    (dataclasses.replace(LEGACY, min_uncached_blocks=0), {"prompt_tokens": 10, "aligned_block": 256}, "remote"),
    (LEGACY, {"prompt_tokens": 10, "aligned_block": 0}, "remote"),  # no events yet: no block known
    (LEGACY, {"prompt_tokens": None, "aligned_block": 256}, "remote"),
    # D holds 300 of 400: 100 uncached, x (1 + streams on D), against 1024 + P's uncached
    (DisaggConfig(decoder_hit_ratio=0.75), {"decoder_hit": 300, "decoder_busy": 13},
     "local_decoder_hit"),  # 1400 <= 1424
    (DisaggConfig(decoder_hit_ratio=0.75), {"decoder_hit": 300, "decoder_busy": 14}, "remote_decoder_busy"),
    (DisaggConfig(decoder_hit_ratio=0.75), {"decoder_hit": 300, "decoder_busy": 10, "prefill_hit": 300},
     "local_decoder_hit"),  # 1100 <= 1124
    (DisaggConfig(decoder_hit_ratio=0.75), {"decoder_hit": 300, "decoder_busy": 11, "prefill_hit": 300},
     "remote_decoder_busy"),  # 1200 > 1124
    (DisaggConfig(decoder_hit_ratio=0.75, load_aware=False), {"decoder_hit": 300, "decoder_busy": 99},
     "local_decoder_hit"),
    (dataclasses.replace(LEGACY, remote_overhead_tokens=0), {"prompt_tokens": 255, "aligned_block": 256,
                                                             "decoder_busy": 1, "prefill_hit": 128},
     "remote_decoder_busy"),  # 510 > 127
    # the peers' deciders, on D's attention-only overlap (the shared gates first)
    (DisaggConfig(policy="always-remote"), {"decoder_hit": 399, "attention_hit": 399}, "remote"),
    (DisaggConfig(policy="always-remote"), {"eligible": False}, "local_ineligible"),
    (DisaggConfig(policy="isl-bounding"), {"attention_hit": 121}, "local_isl_bounding"),  # 279 < 2048, 0.6975 < 0.7
    (DisaggConfig(policy="isl-bounding"), {"attention_hit": 120}, "remote"),  # 280 / 400 = 0.7
    (DisaggConfig(policy="isl-bounding", isl_max_tokens=279), {"attention_hit": 121}, "remote"),
    (DisaggConfig(policy="isl-bounding"), {"prompt_tokens": None}, "remote"),  # not tokenized: no overlap known
    (DisaggConfig(policy="non-cached-tokens"), {"attention_hit": 273}, "local_non_cached"),  # 127 < 128
    (DisaggConfig(policy="non-cached-tokens"), {"attention_hit": 272}, "remote"),
    (DisaggConfig(policy="non-cached-tokens", non_cached_tokens=0), {}, "local_non_cached"),  # llm-d's 0: off
    # ours: the placement model's choice; no placement (the prompt was not tokenized): remote
    (DisaggConfig(), {"placement": place(400, WorkerView("d", 384), [WorkerView("p")])}, "local_placement"),
    (DisaggConfig(), {"placement": place(400, WorkerView("d", 0, load=64), [WorkerView("p")])}, "remote"),
    (DisaggConfig(itl_slo_ms=20), {"placement": place(4000, WorkerView("d", 3500, load=8), [WorkerView("p")],
                                                      itl_slo_ms=20)},
     "remote_itl_slo"),
    (DisaggConfig(), {"prompt_tokens": None}, "remote"),
])
def test_decide(cfg, changes, expected):
    assert decide(cfg, **{**ARGS, **changes}) == expected


def test_cached_tokens_rule():
    assert whole_request_cached_tokens(256, 512, 700) == 512  # D's own prefix is longer
    assert whole_request_cached_tokens(512, 256, 700) == 512  # P's is
    assert whole_request_cached_tokens(None, None, 700) == 0
    assert whole_request_cached_tokens(900, 0, 700) == 700
    resp = {"usage": {"prompt_tokens": 700, "prompt_tokens_details": {"cached_tokens": 699}}}
    assert fix_usage(resp, 256, None) == 256 and resp["usage"]["prompt_tokens_details"]["cached_tokens"] == 256
    assert fix_usage({"usage": {"prompt_tokens": 3}}, 1, 1) is None  # no details: nothing invented
    assert prefill_hit({"usage": {"prompt_tokens_details": {"cached_tokens": 5}}}) == 5
    assert prefill_hit({"kv_transfer_params": {"remote_prefill_cached_tokens": 6}}) == 6
    assert prefill_hit({"usage": {}}) is None


def test_policy_auto_and_the_deprecated_ratio():
    from hybrid_pd.proxy.config import ProxyConfig
    from hybrid_pd.proxy.errors import ConfigError

    base = {"decode": ["http://d"]}
    assert ProxyConfig.from_flat(base).disagg.pd_policy == "ours"
    assert ProxyConfig.from_flat({**base, "decoder_hit_ratio": 0.8}).disagg.pd_policy == "hit-ratio"
    assert ProxyConfig.from_flat({**base, "pd_policy": "isl-bounding"}).disagg.pd_policy == "isl-bounding"
    with pytest.raises(ConfigError, match="--decoder-hit-ratio belongs to --pd-policy hit-ratio"):
        ProxyConfig.from_flat({**base, "pd_policy": "ours", "decoder_hit_ratio": 0.8})
    assert ProxyConfig.from_flat({**base, "pd_policy": "hit-ratio"}).disagg.decoder_hit_ratio == 0  # 0.8 applies


def test_usage_breakdown_for_billing():
    """What P hit, what D hit, where the prompt was computed; cached_tokens stays the client's figure."""
    pd = {"usage": {"prompt_tokens": 700, "prompt_tokens_details": {"cached_tokens": 699}}}
    assert fix_usage(pd, 256, 512) == 512
    breakdown(pd, 256, 512, "prefill")
    assert pd["usage"]["prompt_tokens_details"] == {"cached_tokens": 512}
    assert pd["usage"]["hybrid_pd"] == {"prefill_cached_tokens": 256, "decoder_cached_tokens": 512,
                                        "computed_on": "prefill"}
    alone = {"usage": {"prompt_tokens": 700, "prompt_tokens_details": {"cached_tokens": 544}}}
    assert reported_cached(alone) == 544
    breakdown(alone, None, reported_cached(alone), "decode")
    assert alone["usage"]["hybrid_pd"] == {"prefill_cached_tokens": None, "decoder_cached_tokens": 544,
                                           "computed_on": "decode"}
    assert alone["usage"]["prompt_tokens_details"] == {"cached_tokens": 544}
    assert reported_cached({"usage": {"prompt_tokens": 3}}) is None


def test_prefill_and_decode_bodies():
    req = parse_request("completions", b'{"prompt": "abc", "stream": true, "stream_options": {"include_usage": true},'
                                       b' "min_tokens": 3, "n": 1, "echo": true, "add_special_tokens": false}')
    assert req.stream and req.include_usage and req.single_prompt
    assert req.tokenize_body() == {"prompt": "abc", "add_special_tokens": False}
    req.token_ids = [1, 2, 3]
    p = req.prefill_body(forward_token_ids=True)
    assert p["prompt"] == [1, 2, 3] and p["max_tokens"] == 1 and p["stream"] is False
    assert not {"min_tokens", "n", "echo", "stream_options", "add_special_tokens"} & set(p)
    d = req.decode_body({"x": 1}, forward_token_ids=False)
    assert d["prompt"] == "abc" and d["kv_transfer_params"] == {"x": 1} and d["min_tokens"] == 3


@pytest.mark.parametrize("endpoint, raw, single", [
    ("completions", b'{"prompt": [1, 2, 3]}', True),
    ("completions", b'{"prompt": [[1, 2], [3]]}', False),
    ("completions", b'{"prompt": ["a"]}', True),
    ("completions", b'{"prompt": "a", "n": 2}', False),
    ("completions", b'{"prompt": "a", "best_of": 3}', False),
    ("chat", b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hey"}]}]}', True),
])
def test_prompt_shapes(endpoint, raw, single):
    assert parse_request(endpoint, raw).single_prompt is single


@pytest.mark.parametrize("raw, ids", [
    (b'{"prompt": [1, 2, 3]}', [1, 2, 3]),
    (b'{"prompt": [[7, 8]]}', [7, 8]),
    (b'{"prompt": [[1, 2], [3]]}', None),  # a batch: no single prompt to route by
    (b'{"prompt": [-1, 18446744073709551616]}', [-1, 2 ** 64]),  # vLLM's to judge
])
def test_token_ids_are_taken_as_given(raw, ids):
    assert parse_request("completions", raw).token_ids == ids


@pytest.mark.parametrize("prompt", [b"[]", b"[true]", b"[1, false]", b"[1.0]", b"[[]]", b"[[1, true]]", b'["a", 1]',
                                    b'[[1, 2], "a"]', b"null", b"5"])
def test_what_is_not_a_prompt_is_refused(prompt):
    """Booleans and floats are not token ids (JSON's true is no 1), nor is an empty array one prompt."""
    with pytest.raises(BadRequest) as e:
        parse_request("completions", b'{"prompt": ' + prompt + b"}")
    assert e.value.param == "prompt" and e.value.status == 400


@pytest.mark.parametrize("raw, param", [(b'{"prompt": "a", "n": true}', "n"), (b'{"prompt": {}}', "prompt"),
                                        (b'{"messages": [1]}', "messages"), (b'{"prompt": "a", "user": 1}', "user")])
def test_wrong_types_name_the_param(raw, param):
    endpoint = "chat" if b"messages" in raw else "completions"
    with pytest.raises(BadRequest) as e:
        parse_request(endpoint, raw)
    assert e.value.param == param and e.value.status == 400
