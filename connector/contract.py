"""Names and values the processes agree on: the launchers, the proxy and the connector each import them from here.

A small module that imports nothing, so that no launcher imports the proxy (or the proxy a launcher) for one
string, and no two copies of a name can drift apart.
"""

# NONE_HASH's seed when the workers set no PYTHONHASHSEED (vllm/v1/core/kv_cache_utils.py DEFAULT_NONE_HASH_SEED)
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
# vLLM < 0.27 derives NONE_HASH from os.urandom unless PYTHONHASHSEED is set: workers and the proxy could never
# agree on block hashes. The launchers then set this seed (prefill/launch/worker_config.py), and the proxy tries
# it too (proxy/kv/index.py).
LAUNCHER_HASH_SEED = "0"

# In the prefill request's kv_transfer_params: the engine id whose handshake the decoder the proxy picked holds
# already (the proxy keeps track, proxy/handshakes.py); the prefiller of that id leaves its handshakes out.
DECODER_KNOWS = "hybrid_pd_decoder_knows"

# The name clients use for the tiny model (`--model tiny`, the launchers' and the demo's default).
TINY_SERVED_NAME = "hybrid-pd-tiny"

# In the prefill request's kv_transfer_params: where this prefiller stops computing the prompt, chosen per turn by
# the proxy's placement (proxy/placement/cost_model.py): "boundary", the last aligned block boundary below the
# prompt's end (one engine step in align mode; D computes the tail), or "last", N-1 tokens (two steps in align
# mode; D computes the last token in its decode step), or a token position (a junction: where the next turn is
# expected to diverge, e.g. where the last message starts; P stops at the aligned boundary at or below it and D
# computes the rest, so that D holds the state there). Absent: the engine's own setting (prefill_to_boundary).
PREFILL_STOP = "hybrid_pd_prefill_stop"
STOP_BOUNDARY, STOP_LAST = "boundary", "last"

# Early decode (the proxy's --early-decode): in the decode request's kv_transfer_params, sent while P still computes,
# in place of P's params: the transfer key under which the proxy will deliver P's params (or P's failure) to this
# decoder's params inbox (connector/params_inbox.py), and how long the decoder waits for them (seconds) before it
# computes the prompt itself.
AWAIT_PREFILL, AWAIT_S = "hybrid_pd_await_prefill", "hybrid_pd_await_s"

# In the prefill request's kv_transfer_params: False where the proxy's policy never serves a turn on the decoder
# alone (--pd-policy always-remote): P then ships no aligned Mamba checkpoint beside the state D resumes from (the
# checkpoint below N-1, or a junction's), bytes every such turn would pay for a next turn the decoder never serves
# alone. Absent or True: the prefiller's own setting (ship_checkpoints).
SHIP_CHECKPOINT = "hybrid_pd_ship_checkpoint"

# Early decode's direct delivery (connector/direct_delivery.py): in P's kv_transfer_params, [D's params inbox, the
# transfer key] where the proxy sent D the request early, so that P pushes its params there itself once they are
# final; in P's answer, True where that push went (the proxy then does not deliver again).
DELIVER_TO, DELIVERED = "hybrid_pd_deliver_to", "hybrid_pd_delivered"
