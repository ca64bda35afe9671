"""Decode worker launcher: `hybrid-pd decode` starts vLLM as a KV consumer (see hybrid_pd.prefill)."""
