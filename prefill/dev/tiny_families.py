"""Tiny configurations of the hybrid families vLLM serves, one small function each: the same few knobs
(hidden size, layers, how often a layer is full attention) mapped onto each family's own config class.

Every family keeps what makes it a hybrid of its kind: its state tensors (GDN: conv + delta-rule state;
Mamba2: conv + SSM state with heads and groups; Mamba1: conv + per-channel SSM state; short conv), its layer
pattern (attention every Nth layer, or attention and Mamba in parallel inside a layer for Falcon-H1) and, where
vLLM needs one, a small MoE. Widths are the smallest that vLLM's kernels accept.

Built models are cached under a name derived from the spec, tiny_model.BUILD_VERSION (every family) and
FAMILY_REVISION (one family): bump the family's revision when a function here changes what it builds.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # for annotations only: transformers takes seconds to import, and only builders need it
    from transformers import PretrainedConfig


class FamilyKnobs(Protocol):
    """The knobs every builder maps (tiny_model.TinyModelSpec has them; tiny_model imports this module)."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def full_attention_interval(self) -> int: ...  # every Nth layer is full attention
    @property
    def init_std(self) -> float: ...


ConfigBuilder = Callable[[FamilyKnobs, int], "PretrainedConfig"]  # (spec, vocab size) -> a model config
FAMILIES: dict[str, ConfigBuilder] = {}
# bump a family's revision when its builder's output changes (its cached folders then rebuild, the others stay):
# zamba2 1 = tied embeddings, 2 = RoPE in its shared attention and FAMILY_TRAINING's recipe; lfm2 1 = trained on
# unkeyed documents (tiny_training.py: it has no long state)
FAMILY_REVISION: dict[str, int] = {"zamba2": 2, "lfm2": 1}


@dataclasses.dataclass(frozen=True)
class Training:
    """A family trained otherwise than the build's plain steps (tiny_training.train): `steps_x` times the spec's
    train_steps, and from `blind_from` of them on (a share) `blind` of the positions hidden from its recurrent
    mixers (tiny_training.blind_mixers: a word there reaches later positions through attention only)."""

    steps_x: int = 1
    blind: float = 0.0
    blind_from: float = 0.0

    def steps(self, train_steps: int) -> int:
        return self.steps_x * train_steps

    def blind_steps(self, train_steps: int) -> tuple[int, int]:
        steps = self.steps(train_steps)
        return int(steps * self.blind_from), steps


# The tiny Zamba2 barely read its attention blocks (a scrambled one moved it 0.02-0.03 nats on vLLM 0.33, under the
# tolerance): trained 1,400 steps plainly and then 1,400 with 30% of the positions hidden from its Mamba mixers, on an
# H100 (transformers, torch 2.11), the scrambled block moved it past the GPU runs' tolerance on 24 of 24 prompts
# (0.059-0.346 nats) and a zeroed state by 4.75-6.51 (benchmarks/results/2026-12-07-h100-zamba2-blind-mixers, where
# every other schedule, share and the CPU read attention on some prompts only, or lost the state's weight)
FAMILY_TRAINING: dict[str, Training] = {"zamba2": Training(steps_x=8, blind=0.3, blind_from=0.5)}


def family(name: str) -> Callable[[ConfigBuilder], ConfigBuilder]:
    def register(fn: ConfigBuilder) -> ConfigBuilder:
        FAMILIES[name] = fn
        return fn

    return register


def common(spec: FamilyKnobs, vocab: int) -> dict[str, Any]:
    return dict(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.layers,
        max_position_embeddings=4096,
        initializer_range=spec.init_std,
        tie_word_embeddings=False,
        eos_token_id=0,
        pad_token_id=0,
        bos_token_id=0,
    )


def is_attention(spec: FamilyKnobs, i: int) -> bool:
    return (i + 1) % spec.full_attention_interval == 0


def gated_delta_net(spec: FamilyKnobs, vocab: int) -> dict[str, Any]:
    """What Qwen3-Next and Qwen3.5 share: GDN linear attention beside gated full attention (partial RoPE)."""
    return common(spec, vocab) | dict(
        intermediate_size=2 * spec.hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["full_attention" if is_attention(spec, i) else "linear_attention" for i in range(spec.layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )


@family("qwen3_next")
def qwen3_next(spec: FamilyKnobs, vocab: int) -> PretrainedConfig:
    """Qwen3-Next (GDN linear attention + gated full attention + MoE; vLLM needs >= 1 MoE layer)."""
    from transformers import Qwen3NextConfig

    cfg = Qwen3NextConfig(
        **gated_delta_net(spec, vocab),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    )
    cfg.architectures = ["Qwen3NextForCausalLM"]
    return cfg


def mamba2_widths(spec: FamilyKnobs) -> dict[str, int]:
    """Mamba2 mixer widths shared by the Mamba2 families: heads * head_dim = 2 * hidden, 64-wide heads."""
    return dict(heads=2 * spec.hidden_size // 64, head_dim=64, state=16, chunk=128)


@family("nemotron_h")
def nemotron_h(spec: FamilyKnobs, vocab: int) -> PretrainedConfig:
    """Nemotron-H (Mamba2, attention and MLP as separate layers, 'M-*-': each mixer followed by an MLP)."""
    from transformers import NemotronHConfig

    m = mamba2_widths(spec)
    mixers = ["full_attention" if is_attention(spec, i // 2) else "linear_attention" for i in range(0, spec.layers, 2)]
    blocks = [kind for mixer in mixers for kind in (mixer, "mlp")][: spec.layers]
    cfg = NemotronHConfig(
        **common(spec, vocab),
        layers_block_type=blocks,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=2 * spec.hidden_size,
        mamba_num_heads=m["heads"],
        mamba_head_dim=m["head_dim"],
        n_groups=2,
        ssm_state_size=m["state"],
        conv_kernel=4,
        expand=2,
        chunk_size=m["chunk"],
    )
    cfg.architectures = ["NemotronHForCausalLM"]
    return cfg


@family("granite_moe_hybrid")
def granite_moe_hybrid(spec: FamilyKnobs, vocab: int) -> PretrainedConfig:
    """Granite-4.0-H (Mamba2 layers and attention layers without position embedding, MoE + shared MLP)."""
    from transformers import GraniteMoeHybridConfig

    m = mamba2_widths(spec)
    cfg = GraniteMoeHybridConfig(
        **common(spec, vocab),
        intermediate_size=128,
        shared_intermediate_size=2 * spec.hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        position_embedding_type=None,
        layer_types=["full_attention" if is_attention(spec, i) else "linear_attention" for i in range(spec.layers)],
        mamba_n_heads=m["heads"],
        mamba_d_head=m["head_dim"],
        mamba_n_groups=1,
        mamba_d_state=m["state"],
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=m["chunk"],
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    cfg.architectures = ["GraniteMoeHybridForCausalLM"]
    return cfg


@family("falcon_h1")
def falcon_h1(spec: FamilyKnobs, vocab: int) -> PretrainedConfig:
    """Falcon-H1 (attention and Mamba2 side by side in every layer, so every layer holds both states)."""
    from transformers import FalconH1Config

    m = mamba2_widths(spec)
    cfg = FalconH1Config(
        **common(spec, vocab),
        intermediate_size=2 * spec.hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=m["heads"] * m["head_dim"],
        mamba_n_heads=m["heads"],
        mamba_d_head=m["head_dim"],
        mamba_n_groups=1,
        mamba_d_state=m["state"],
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=m["chunk"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    cfg.architectures = ["FalconH1ForCausalLM"]
    return cfg


@family("jamba")
def jamba(spec: FamilyKnobs, vocab: int) -> PretrainedConfig:
    """Jamba (Mamba1: per-channel SSM state, no heads; attention every Nth layer; MoE every other layer)."""
    from transformers import JambaConfig

    cfg = JambaConfig(
        **common(spec, vocab),
        intermediate_size=2 * spec.hidden_size,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=spec.full_attention_interval,
        attn_layer_offset=spec.full_attention_interval - 1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=4,
        num_experts_per_tok=2,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
    )
    cfg.architectures = ["JambaForCausalLM"]
    return cfg


@family("qwen3_5")
def qwen3_5(spec: FamilyKnobs, vocab: int) -> PretrainedConfig:
    """Qwen3.5 text model (GDN linear attention + gated full attention, dense MLP), trained as transformers'
    Qwen3_5ForCausalLM and saved as released Qwen3.5 checkpoints are (`qwen3_5_release_layout`)."""
    from transformers import Qwen3_5TextConfig

    cfg = Qwen3_5TextConfig(
        **gated_delta_net(spec, vocab),
    )
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    return cfg


def qwen3_5_release_layout(folder: Path) -> None:
    """Rewrite a saved text-only Qwen3.5 as the released checkpoints are laid out: one composite config
    (`model_type` qwen3_5, `text_config` + `vision_config`, `Qwen3_5ForConditionalGeneration`) and the text
    weights under `model.language_model.`. vLLM 0.26 serves Qwen3.5 only that way (it has no text-only class:
    its multimodal processor wants the composite `Qwen3_5Config`); 0.32 serves it too. No vision weights: the
    engines run with `--language-model-only` (FAMILY_VLLM_ARGS), which skips the vision tower. The image and video
    processor configs are there because vLLM 0.32 makes every KV consumer of a multimodal model accept
    pre-computed embeddings, and sizing those loads the processors even under `--language-model-only`."""
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3_5Config

    text = json.loads((folder / "config.json").read_text())
    vision = dict(depth=1, hidden_size=64, num_heads=2, intermediate_size=128, out_hidden_size=text["hidden_size"])
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"])
    cfg.architectures, cfg.dtype = ["Qwen3_5ForConditionalGeneration"], text["dtype"]
    cfg.save_pretrained(folder)
    pixels = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    for name, kind, cls, shortest, longest in (  # patches as the vision config; the pixel bounds only size a budget
        ("preprocessor_config.json", "image_processor_type", "Qwen2VLImageProcessorFast", 65536, 16777216),
        ("video_preprocessor_config.json", "video_processor_type", "Qwen3VLVideoProcessor", 4096, 25165824),
    ):
        processor = {kind: cls, "processor_class": "Qwen3VLProcessor", **pixels}
        processor["size"] = {"shortest_edge": shortest, "longest_edge": longest}
        (folder / name).write_text(json.dumps(processor, indent=1))
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    save_file(
        {re.sub(r"^model\.", "model.language_model.", k): v for k, v in tensors.items()},
        weights,
        metadata={"format": "pt"},
    )


@family("lfm2")
def lfm2(spec: FamilyKnobs, vocab: int) -> PretrainedConfig:
    """LFM2 (gated short convolution layers, state = the last few inputs, + attention layers)."""
    from transformers import Lfm2Config

    cfg = Lfm2Config(
        **common(spec, vocab) | {"tie_word_embeddings": True},  # vLLM's Lfm2ForCausalLM always ties lm_head
        intermediate_size=2 * spec.hidden_size,
        block_auto_adjust_ff_dim=False,
        num_attention_heads=4,
        num_key_value_heads=2,
        conv_L_cache=3,
        layer_types=["full_attention" if is_attention(spec, i) else "conv" for i in range(spec.layers)],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    # LFM2 checkpoints carry these; transformers' class dropped them from its signature, vLLM still reads them
    # (set as attributes, they are saved in config.json as the keyword arguments were)
    cfg.conv_dim = cfg.conv_dim_out = cfg.block_dim = spec.hidden_size
    cfg.architectures = ["Lfm2ForCausalLM"]
    return cfg


@family("zamba2")
def zamba2(spec: FamilyKnobs, vocab: int) -> PretrainedConfig:
    """Zamba2 (Mamba2 backbone; 'hybrid' layers add one shared attention+MLP block on [h, embeddings]).

    Tied embeddings, as in the released Zamba2-1.2B and 2.7B (their configs leave `tie_word_embeddings` at its
    default, True): vLLM's Zamba2ForCausalLM ties lm_head to embed_tokens whatever the config says and skips the
    checkpoint's lm_head.weight, so an untied model's head is replaced by its embeddings there (flat greedy outputs).
    """
    from transformers import Zamba2Config

    m = mamba2_widths(spec)
    cfg = Zamba2Config(
        **(common(spec, vocab) | dict(tie_word_embeddings=True)),
        intermediate_size=2 * spec.hidden_size,
        num_attention_heads=2 * spec.hidden_size // 64,  # attention runs on 2 * hidden: 64-wide heads
        layers_block_type=["hybrid" if is_attention(spec, i) else "mamba" for i in range(spec.layers)],
        n_mamba_heads=m["heads"],
        mamba_ngroups=1,
        mamba_d_state=m["state"],
        mamba_d_conv=4,
        mamba_expand=2,
        chunk_size=m["chunk"],
        num_mem_blocks=1,
        use_shared_attention_adapter=False,
        use_mem_rope=True,  # RoPE in the shared attention (vLLM reads it): FAMILY_TRAINING's recipe was found with it
    )
    cfg.architectures = ["Zamba2ForCausalLM"]
    return cfg


# A family whose checkpoint vLLM reads in another layout than transformers saves: folder -> rewritten in place
LAYOUTS: dict[str, Callable[[Path], None]] = {"qwen3_5": qwen3_5_release_layout}
# vLLM flags a family's engines need
FAMILY_VLLM_ARGS: dict[str, tuple[str, ...]] = {"qwen3_5": ("--language-model-only",)}
