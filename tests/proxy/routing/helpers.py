"""Workers and contexts for the routing plugin tests."""

from hybrid_pd.proxy.config import KVIndexConfig
from hybrid_pd.proxy.kv.index import KVIndex
from hybrid_pd.proxy.routing import Deps
from hybrid_pd.proxy.workers import Worker


def workers(*names: str, role: str = "decode") -> list[Worker]:
    return [Worker(f"http://{n}:8000", role) for n in names]  # type: ignore[arg-type]


def deps(index: KVIndex | None = None, hash_block_size: int = 0) -> Deps:
    return Deps(index or KVIndex(), KVIndexConfig(hash_block_size=hash_block_size))
