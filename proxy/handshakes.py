"""P's handshake goes to each decoder once, not with every request.

Our connector's prefiller puts its NIXL handshake (one per TP rank: ~4 KB of JSON at 21 KV regions, ~12 KB at
48 layers) in every kv_transfer_params, so that a decoder never waits on P's side channel. A decoder keeps the
peers it handshook with, by (P's engine id, host, port), so from the second request of a (P, D) pair on the
handshake is dead weight on both legs. The proxy drops it on the way to D once D has answered a request that
carried it, and tells P which engine id the chosen decoder knows already (DECODER_KNOWS in P's params): P leaves
its handshakes out when that id is its own. P's engine id is in every params, so a restarted P (a new engine id)
sends them again and is a new pair for every decoder. A decoder whose connection failed (a restart, perhaps)
gets them again too; one that restarted without the proxy noticing, or a decoder picked again after the first
failed, asks P's side channel, as with a prefiller that sends no handshakes.
"""

from __future__ import annotations

from typing import Any

HANDSHAKES = "handshakes"
Pair = tuple[str, str | None, str, Any, Any]  # (D's URL, D's identity, P's engine id, P's host, P's port)


class HandshakeMemo:
    def __init__(self) -> None:
        self._delivered: set[Pair] = set()
        self._engines: dict[str, tuple[str, Any, Any]] = {}  # P's URL -> its (engine id, host, port), last seen

    def seen(self, prefiller: str, params: dict[str, Any]) -> None:
        """P's answer: which engine answers at its URL (learned from params that carry the handshakes)."""
        engine = params.get("remote_engine_id")
        if params.get(HANDSHAKES) and isinstance(engine, str):
            self._engines[prefiller] = (engine, params.get("remote_host"), params.get("remote_port"))

    def known_to(self, prefiller: str, url: str, identity: str | None) -> str | None:
        """The engine id of the prefiller at `prefiller` when the decoder at `url` has its handshake already."""
        engine = self._engines.get(prefiller)
        if engine is None or (url, identity, *engine) not in self._delivered:
            return None
        return engine[0]

    def params_for(self, params: dict[str, Any], url: str, identity: str | None) -> tuple[dict[str, Any], Pair | None]:
        """The params to send decoder `url`, and the pair to mark delivered once it answered (None: nothing to
        mark, the params carry no handshake)."""
        engine = params.get("remote_engine_id")
        if not params.get(HANDSHAKES) or not isinstance(engine, str):
            return params, None
        pair = (url, identity, engine, params.get("remote_host"), params.get("remote_port"))
        if pair in self._delivered:
            return {k: v for k, v in params.items() if k != HANDSHAKES}, None
        return params, pair

    def delivered(self, pair: Pair) -> None:
        self._delivered.add(pair)

    def forget(self, url: str) -> None:
        """The decoder at `url` may have restarted: it gets the handshakes again."""
        self._delivered = {p for p in self._delivered if p[0] != url}
