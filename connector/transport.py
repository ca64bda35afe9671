"""Moving bytes between workers: a small `Transport` protocol, NIXL behind it, and an in-memory twin.

The worker speaks only `Transport`; NIXL errors are mapped to `TransportError` here and nowhere else.
`descriptors` turns a plan's runs into (local address, remote address, length) triples: a run over blocks
that abut in memory on both sides (attention pages) is one descriptor per layer, a run over blocks that do
not (a Mamba state is smaller than its page) is one descriptor per block and layer.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from hybrid_pd.connector.errors import ConfigurationError, TransportError
from hybrid_pd.connector.messages import Region
from hybrid_pd.connector.plan import Run


@dataclasses.dataclass(frozen=True)
class Desc:
    local: int
    remote: int
    length: int


def descriptors(local: Sequence[Region], remote: Sequence[Region], runs: Iterable[Run]) -> list[Desc]:
    """The READ descriptors for `runs`, layer by layer (regions are matched by layer name)."""
    theirs = {r.layer: r for r in remote}
    out: list[Desc] = []
    for run in runs:
        for mine in local:
            if mine.group != run.group:
                continue
            peer = theirs.get(mine.layer)
            if peer is None or peer.length != mine.length:
                raise TransportError(f"layer {mine.layer}: no matching remote region")
            if run.local_start + run.count > mine.num_blocks or run.remote_start + run.count > peer.num_blocks:
                raise TransportError(f"layer {mine.layer}: run {run} outside the registered blocks")
            if mine.blocks_abut and peer.blocks_abut:
                out.append(
                    Desc(
                        mine.base + run.local_start * mine.stride,
                        peer.base + run.remote_start * peer.stride,
                        run.count * mine.length,
                    )
                )
            else:
                out += [
                    Desc(
                        mine.base + (run.local_start + i) * mine.stride,
                        peer.base + (run.remote_start + i) * peer.stride,
                        mine.length,
                    )
                    for i in range(run.count)
                ]
    return out


class Transport(Protocol):
    name: str
    mem_type: str

    def register(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Make (address, size) ranges of this process readable by peers."""

    def metadata(self) -> bytes:
        """What a peer needs to `add_peer` us."""

    def add_peer(self, metadata: bytes) -> str:
        """Load a peer's metadata; return its agent name."""

    def remove_peer(self, peer: str) -> None: ...

    def read(self, peer: str, descs: Sequence[Desc]) -> Any:
        """Start READs of `descs` from `peer`; return a handle for `poll`."""

    def poll(self, handle: Any) -> bool:
        """True once the READ landed; raises TransportError if it failed."""

    def release(self, handle: Any) -> None: ...

    def notify(self, peer: str, message: bytes) -> None: ...

    def notifications(self) -> list[bytes]:
        """Notifications received since the last call."""

    def close(self) -> None: ...


# NIXL backends a worker may pick: UCX (TCP, InfiniBand/RoCE verbs, CUDA IPC) or LIBFABRIC (AWS EFA).
NIXL_BACKENDS = ("UCX", "LIBFABRIC")


def nixl_backend(extra: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """The backend named by kv_connector_extra_config `nixl_backend`, else by HYBRID_PD_NIXL_BACKEND (the
    launchers own --kv-transfer-config, so Kubernetes sets the environment), else UCX."""
    if "nixl_backend" in extra:
        name, source = extra["nixl_backend"], "kv_connector_extra_config nixl_backend"
    else:
        name, source = env.get("HYBRID_PD_NIXL_BACKEND", "UCX"), "HYBRID_PD_NIXL_BACKEND"
    if name not in NIXL_BACKENDS:
        raise ConfigurationError(f"{source}={name!r}: choose one of {', '.join(NIXL_BACKENDS)}")
    return name


class NixlTransport:
    """A NIXL agent (UCX or LIBFABRIC backend) with a progress thread that sleeps `delay_us` between polls
    (ConnectorConfig.nixl_delay_us)."""

    def __init__(
        self,
        name: str,
        mem_type: str = "DRAM",
        *,
        delay_us: int,
        backend: str = "UCX",
        progress_thread: bool = True,
    ):
        from hybrid_pd.connector import nixl_delay

        nixl_delay.install(delay_us)
        try:
            from nixl._api import nixl_agent, nixl_agent_config

            self.agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=progress_thread, backends=[backend]))
        except Exception as e:  # NIXL raises bare RuntimeError/nixlBind errors: map them here
            raise TransportError(f"cannot create NIXL agent {name} ({backend} backend): {e}") from e
        self.name, self.mem_type = name, mem_type
        self._registered: list[Any] = []

    def _call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except TransportError:
            raise
        except Exception as e:  # noqa: BLE001  the one boundary where NIXL's errors become ours
            raise TransportError(f"NIXL {what} failed: {e}") from e

    def register(self, ranges: Sequence[tuple[int, int]]) -> None:
        descs = self._call(
            "get_reg_descs", self.agent.get_reg_descs, [(addr, size, 0, "") for addr, size in ranges], self.mem_type
        )
        self._call("register_memory", self.agent.register_memory, descs)
        self._registered.append(descs)

    def metadata(self) -> bytes:
        return self._call("get_agent_metadata", self.agent.get_agent_metadata)

    def add_peer(self, metadata: bytes) -> str:
        name = self._call("add_remote_agent", self.agent.add_remote_agent, metadata)
        return name.decode() if isinstance(name, bytes) else name

    def remove_peer(self, peer: str) -> None:
        self._call("remove_remote_agent", self.agent.remove_remote_agent, peer)

    def _dlist(self, rows: list[tuple[int, int, int]]) -> Any:
        import numpy as np

        return self._call(
            "get_xfer_descs", self.agent.get_xfer_descs, np.array(rows, dtype=np.uint64).reshape(-1, 3), self.mem_type
        )

    def read(self, peer: str, descs: Sequence[Desc]) -> Any:
        local = self._dlist([(d.local, d.length, 0) for d in descs])
        remote = self._dlist([(d.remote, d.length, 0) for d in descs])
        handle = self._call("initialize_xfer", self.agent.initialize_xfer, "READ", local, remote, peer)
        state = self._call("transfer", self.agent.transfer, handle)
        if state == "ERR":
            self.release(handle)
            raise TransportError(f"NIXL READ from {peer} could not be posted")
        return handle

    def poll(self, handle: Any) -> bool:
        state = self._call("check_xfer_state", self.agent.check_xfer_state, handle)
        if state == "ERR":
            raise TransportError("NIXL READ failed (peer gone or memory deregistered)")
        return state == "DONE"

    def release(self, handle: Any) -> None:
        try:
            self.agent.release_xfer_handle(handle)
        except Exception:  # noqa: BLE001  a handle still in flight is released by NIXL at teardown
            pass

    def notify(self, peer: str, message: bytes) -> None:
        self._call("send_notif", self.agent.send_notif, peer, message)

    def notifications(self) -> list[bytes]:
        notifs = self._call("get_new_notifs", self.agent.get_new_notifs)
        return [m for msgs in notifs.values() for m in msgs]

    def close(self) -> None:
        for descs in self._registered:
            try:
                self.agent.deregister_memory(descs)
            except Exception:  # noqa: BLE001  best effort at shutdown
                pass
        self._registered.clear()


class InMemoryTransport:
    """Same contract, one process: peers are looked up by name, READs are memmoves done at first poll.

    `fail_reads` makes every READ fail at poll; `stall_reads` makes them never complete (deadline tests).
    """

    _fabric: dict[str, InMemoryTransport] = {}
    _lock = threading.Lock()
    _ids = itertools.count()

    def __init__(self, name: str, mem_type: str = "DRAM"):
        self.name, self.mem_type = name, mem_type
        self.ranges: list[tuple[int, int]] = []
        self.inbox: list[bytes] = []
        self.fail_reads = self.stall_reads = False
        self.reads: list[list[Desc]] = []
        self._pending: dict[int, tuple[str, list[Desc]]] = {}
        with self._lock:
            self._fabric[name] = self

    def register(self, ranges: Sequence[tuple[int, int]]) -> None:
        self.ranges += list(ranges)

    def metadata(self) -> bytes:
        return self.name.encode()

    def add_peer(self, metadata: bytes) -> str:
        name = metadata.decode()
        if name not in self._fabric:
            raise TransportError(f"no agent {name}")
        return name

    def remove_peer(self, peer: str) -> None:
        pass

    def read(self, peer: str, descs: Sequence[Desc]) -> int:
        if peer not in self._fabric:
            raise TransportError(f"peer {peer} is gone")
        handle = next(self._ids)
        self._pending[handle] = (peer, list(descs))
        self.reads.append(list(descs))
        return handle

    def poll(self, handle: int) -> bool:
        peer, descs = self._pending[handle]
        if self.fail_reads or peer not in self._fabric:
            raise TransportError(f"READ from {peer} failed")
        if self.stall_reads:
            return False
        for d in descs:
            ctypes.memmove(d.local, d.remote, d.length)
        return True

    def release(self, handle: int) -> None:
        self._pending.pop(handle, None)

    def notify(self, peer: str, message: bytes) -> None:
        target = self._fabric.get(peer)
        if target is None:
            raise TransportError(f"peer {peer} is gone")
        target.inbox.append(message)

    def notifications(self) -> list[bytes]:
        out, self.inbox = self.inbox, []
        return out

    def close(self) -> None:
        with self._lock:
            self._fabric.pop(self.name, None)
