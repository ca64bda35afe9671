"""Prefill worker launcher, and the worker-launch machinery both roles share.

`hybrid-pd prefill` starts vLLM as a KV producer: align-mode prefix caching, the KV connector, the DS
conv-state layout, a NIXL side channel and a ZMQ KV-event publisher, after refusing configurations known to
break. `hybrid_pd.decode` reuses this machinery with the consumer role. The tiny hybrid test model's builder
lives here too, since a worker is what loads it.
"""
