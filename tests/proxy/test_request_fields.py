"""Every body that made vLLM answer 500 (the fuzzer's findings, benchmarks/vllm_500_fields.py) gets a 400 in
OpenAI's shape from the proxy and reaches no worker; the values next to them that vLLM takes still reach the
decoder. The proxy runs against fake workers."""

from __future__ import annotations

import json

import aiohttp
import pytest

from benchmarks.naming import RESULTS
from hybrid_pd.proxy.errors import BadRequest
from hybrid_pd.proxy.request_fields import WIRE_INT_MAX, WIRE_INT_MIN, check_fields
from tests.proxy.fakes import cluster, run

FINDINGS = json.loads((RESULTS / "2026-11-25-cpu-vllm-500-fields" / "results.json").read_text())["found"]
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
COMPLETION = {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 1}


async def post(body: dict, path: str = "/v1/completions") -> tuple[int, dict, int]:
    """(status, answer, generate calls the workers saw) for one body sent to a fresh proxy."""
    headers = {"Content-Type": "application/json"}
    async with cluster() as c, aiohttp.ClientSession() as s, s.post(c.url + path, data=json.dumps(body),
                                                                      headers=headers) as r:
        return r.status, await r.json(), len(c.p.generate_calls) + len(c.d.generate_calls)


def test_the_findings_cover_every_field_that_gave_vllm_a_500():
    fields = {f["field"] for f in FINDINGS}
    assert fields == {"structured_outputs", "structured_outputs.json", "stream_interval",
                      "repetition_detection.min_count"}, fields
    assert {f["endpoint"] for f in FINDINGS} == {"completions", "chat"}


@pytest.mark.parametrize("finding", FINDINGS, ids=lambda f: f"{f['endpoint']}-{f['field']}-{f['value']}")
def test_a_body_vllm_answers_with_a_500_gets_a_400_and_reaches_no_worker(finding):
    status, answer, calls = run(post(finding["body"], PATHS[finding["endpoint"]]))
    assert status == 400, answer
    err = answer["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", err
    assert finding["field"].startswith(err["param"]), (finding["field"], err)
    assert calls == 0


@pytest.mark.parametrize("extra", [
    {"structured_outputs": None},
    {"structured_outputs": {"json": {"type": "array", "maxItems": WIRE_INT_MAX}}},
    {"structured_outputs": {"regex": "[a-z]+"}},
    {"stream_interval": WIRE_INT_MAX},
    {"repetition_detection": {"max_pattern_size": 0, "min_count": WIRE_INT_MIN}},
    {"repetition_detection": {"max_pattern_size": 2, "min_count": 2}},
    {"repetition_detection": "not an object: vLLM answers 400 itself"},
], ids=str)
def test_values_vllm_takes_reach_the_decoder(extra):
    status, answer, calls = run(post({**COMPLETION, **extra}))
    assert status == 200 and calls >= 1, answer


@pytest.mark.parametrize(("extra", "param"), [
    ({"stream_interval": WIRE_INT_MAX + 1}, "stream_interval"),
    ({"stream_interval": True}, "stream_interval"),
    ({"stream_interval": "1"}, "stream_interval"),
    ({"repetition_detection": {"min_pattern_size": WIRE_INT_MIN - 1}}, "repetition_detection.min_pattern_size"),
    ({"repetition_detection": {"max_pattern_size": WIRE_INT_MAX + 1, "min_count": 2}},
     "repetition_detection.max_pattern_size"),
    ({"structured_outputs": {"json": {"properties": {"a": {"maximum": [WIRE_INT_MAX + 1]}}}}}, "structured_outputs"),
    ({"structured_outputs": []}, "structured_outputs"),
    ({"max_tokens": False}, "max_tokens"),
])
def test_check_fields_names_the_field(extra, param):
    with pytest.raises(BadRequest) as e:
        check_fields({**COMPLETION, **extra})
    assert e.value.param == param and e.value.status == 400
