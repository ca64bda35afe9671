"""Real engines for the connector tests, at most two at a time (2-core test bed), and the PD calls and
decoder metrics those tests share."""

from __future__ import annotations

from tests.support.conversation import complete
from tests.support.procs import free_port, metric_sum, scrape_metrics, worker_argv


class Engines:
    """Named engines, at most two running; `up()` stops the others and starts what is missing."""

    def __init__(self, launch, specs: dict[str, tuple[str, str, str, str, dict]], vllm_args: tuple[str, ...] = ()):
        self.launch, self.specs, self.running, self.logs = launch, specs, {}, {}  # name -> (role, connector,
        # core, model folder, environment)
        self.vllm_args = vllm_args  # flags every engine passes to vLLM

    def up(self, *names):
        for name in [n for n in self.running if n not in names]:
            self.running.pop(name).stop()
        started = []
        for name in names:
            if name not in self.running:
                role, connector, cpu, model, env = self.specs[name]
                port = free_port()
                argv = worker_argv(role, connector=connector, port=port, cpu_bind=cpu, model=model,
                                   extra=["--", *self.vllm_args] if self.vllm_args else [])
                self.running[name] = self.launch(name, argv, f"http://127.0.0.1:{port}", env)
                self.logs[name] = self.running[name].log_path
                started.append(name)
        for name in started:
            self.running[name].wait_healthy(300)
        return {n: self.running[n].url for n in names}


def pd_complete(p_url: str, d_url: str, prompt: str | list[int], max_tokens: int = 12,
                **extra) -> tuple[dict, dict]:
    p_resp = complete(p_url, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    params = p_resp.get("kv_transfer_params")
    assert params and params["remote_block_ids"], p_resp
    return p_resp, complete(d_url, prompt, max_tokens, kv_transfer_params=params, **extra)


def d_metrics(url: str) -> dict[str, float]:
    m = scrape_metrics(url)
    return {k: metric_sum(m, f"vllm:{k}") for k in (
        "hybrid_pd_bytes_transferred_sum", "hybrid_pd_bytes_transferred_count", "hybrid_pd_descriptors_sum",
        "hybrid_pd_checkpoints_shipped_total", "hybrid_pd_failed_transfers_total", "prefix_cache_hits_total",
        "kv_cache_usage_perc")}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}
