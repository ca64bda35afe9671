"""The worker launchers, and the tooling that builds and drives the system on one machine.

cli.py    `hybrid-pd prefill`: vLLM as a KV producer (decode/cli.py: `hybrid-pd decode`, the consumer)
launch/   what both roles run, and the `hybrid-pd` command itself: command.py (the dispatcher); worker.py
          (the launcher: flags -> WorkerConfig -> vLLM, warm-up, ready file, SIGTERM); flags.py (each setting
          declared once, the parser built from the declarations); worker_config.py (the validated
          configuration and vLLM's argv and environment); probes.py (what it reads before vLLM starts);
          warmup.py; cpu_affinity.py (the launcher's cores, other workers on them); supervisor.py (the vLLM
          child, signals); ready.py (the ready file and the Kubernetes probe); shm_segments.py; aligned_block.py;
          errors.py
dev/      off the serving path: tiny_model.py and tiny_families.py (the tiny hybrid models the demo and the
          tests load), demo.py and demo_workload.py (`hybrid-pd demo`)
"""
