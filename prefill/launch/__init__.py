"""The worker launcher both roles import, and the `hybrid-pd` command (see hybrid_pd.prefill)."""
