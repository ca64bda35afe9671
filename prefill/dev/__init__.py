"""Dev tooling, off the serving path: the tiny hybrid models and the demo (see hybrid_pd.prefill)."""
