"""The worker half of the connector, without vLLM: handshakes, READs with deadlines, leases, notifications.

Decode (D) gets `LoadJob`s from its scheduler: it handshakes with the prefiller in the background (once per
engine id; a prefiller restarted under a new engine id is simply a new peer, and a peer whose READ failed is
forgotten so the next request handshakes again), READs the plan's runs, then tells P `Done`. A job that
passes its deadline or fails is reported failed (vLLM recomputes it) and P is told `Rejected`.
Prefill (P) gets leases: a request's blocks stay pinned until D says Done/Rejected or the lease expires.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence

from hybrid_pd.connector import integrity
from hybrid_pd.connector.errors import ConnectorError, DigestMismatch, HandshakeTimeout, TransportError
from hybrid_pd.connector.messages import (
    Done,
    Handshake,
    Rejected,
    RemotePrefill,
    decode_handshake,
    decode_notification,
    encode,
)
from hybrid_pd.connector.plan import Run
from hybrid_pd.connector.side_channel import fetch_handshake
from hybrid_pd.connector.step import LoadJob, StepMeta
from hybrid_pd.connector.transport import Transport, descriptors

log = logging.getLogger("vllm." + __name__)  # under vLLM's configured logger


@dataclasses.dataclass
class TransferStats:
    request_id: str
    bytes: int = 0
    descriptors: int = 0
    seconds: float = 0.0
    failed: bool = False
    checkpoints: int = 0
    digest_mismatch: bool = False
    blocks_verified: int = 0


@dataclasses.dataclass
class Results:
    finished_sending: set[str] = dataclasses.field(default_factory=set)
    finished_recving: set[str] = dataclasses.field(default_factory=set)
    failed_recving: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class _Peer:
    future: cf.Future  # -> (Handshake, agent name)


@dataclasses.dataclass
class _Active:
    job: LoadJob
    deadline: float
    started: float
    handle: object | None = None
    posted: float | None = None  # when the READ was posted: transfer time runs from here, like upstream's
    stats: TransferStats | None = None
    check: integrity.Check | None = None  # the READ landed: its blocks' digests on their way (or nothing to check)
    error: Exception | None = None  # met at a step's start (landing the READ): the next poll fails the load with it
    waited: bool = False  # a poll waited for its check's digests once (_ready)


class WorkerSide:
    def __init__(
        self,
        transport: Transport,
        local: Handshake,
        *,
        read_timeout_s: float = 30.0,
        handshake_timeout_s: float = 5.0,
        idle_wait_s: float = 0.0,
        fetch: Callable[[str, int, float], bytes] = fetch_handshake,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        clear_blocks: Callable[[Sequence[Run]], None] | None = None,
        digest: integrity.DigestFn | None = None,
        landed_digest: integrity.DigestFn | None = None,
        check_wait_s: float = 0.0,
        algorithm: str = "",
        verify_fraction: float = 0.0,
        corrupt_reads: int = 0,
        corrupt_blocks: Callable[[Sequence[Run]], None] | None = None,
    ):
        self.transport, self.local = transport, local
        self._clear_blocks = clear_blocks  # zeroes local blocks (vLLM zeroes fresh blocks; a failed READ may
        # have landed in part, and the blocks of a load vLLM zeroes never)
        self.read_timeout_s, self.handshake_timeout_s = read_timeout_s, handshake_timeout_s
        self.idle_wait_s = idle_wait_s
        self._fetch, self._clock, self._sleep = fetch, clock, sleep
        self._pool = cf.ThreadPoolExecutor(2, thread_name_prefix="hybrid-pd-handshake")
        self._peers: dict[tuple[str, str, int], _Peer] = {}
        self._active: dict[str, _Active] = {}
        self._leases: dict[str, float] = {}  # P: request id -> deadline
        self._early: dict[str, float] = {}  # P: notifications that arrived before the lease did
        self.stats: list[TransferStats] = []
        self._idle = False
        # KV integrity (integrity.py): P digests the blocks of requests whose prompt completed this step; D
        # checks `verify_fraction` of the blocks each READ landed before it reports the load done
        self._digest, self.algorithm, self.verify_fraction = digest, algorithm, verify_fraction
        # D: the digests of landed blocks (`digest` where not given), and how long a poll waits for them (_ready)
        self._landed_digest, self.check_wait_s = landed_digest or digest, check_wait_s
        self._to_digest: dict[str, list[list[int]]] = {}
        # tests only: spoil bytes in the landed blocks of the first `corrupt_reads` loads, before the check
        self._corrupt_reads, self._corrupt_blocks = corrupt_reads, corrupt_blocks

    # ---- D: loads ---------------------------------------------------------------------------------------
    def _peer(self, remote: RemotePrefill) -> _Peer:
        key = (remote.remote_engine_id, remote.remote_host, remote.remote_port)
        peer = self._peers.get(key)
        if peer is None:
            peer = self._peers[key] = _Peer(self._pool.submit(self._handshake, remote))
        return peer

    def _handshake(self, remote: RemotePrefill) -> tuple[Handshake, str]:
        """Check the peer's handshake and add its agent: the one its kv_transfer_params carry, so that nothing
        waits on the prefiller's threads; from an older prefiller, the one its side channel answers."""
        port = remote.remote_port + self.local.tp_rank
        rank = self.local.tp_rank
        raw = remote.handshakes[rank] if rank < len(remote.handshakes) else self._ask(remote.remote_host, port)
        theirs = decode_handshake(raw)
        if theirs.engine_id != remote.remote_engine_id:
            raise ConnectorError(
                f"{remote.remote_host}:{port} is engine {theirs.engine_id}, the request "
                f"names {remote.remote_engine_id} (prefiller restarted?)"
            )
        theirs.check_compatible(self.local)
        return theirs, self.transport.add_peer(theirs.agent_metadata)

    def _ask(self, host: str, port: int) -> bytes:
        """The side channel, for a prefiller whose kv_transfer_params carry no handshake (an older release),
        asking again while it is silent (a prefiller whose threads are starved on a shared core answers late,
        not never) until the READ deadline: the loads waiting for it fail then anyway. A peer that is down
        (nothing listens) fails at once."""
        give_up = self._clock() + self.read_timeout_s
        while True:
            try:
                return self._fetch(host, port, self.handshake_timeout_s)
            except HandshakeTimeout as e:
                if self._clock() + self.handshake_timeout_s > give_up:
                    raise
                log.warning("%s; asking again (until the READ deadline, %g s)", e, self.read_timeout_s)

    def _forget(self, remote: RemotePrefill) -> None:
        self._peers.pop((remote.remote_engine_id, remote.remote_host, remote.remote_port), None)

    def start(self, meta: StepMeta) -> None:
        """Register this step's loads and post the READs of those whose peer is known, so that they run
        during the step's forward pass; the rest are posted by `poll` once their handshake is done."""
        now = self._clock()
        for job in meta.loads:
            act = self._active[job.request_id] = _Active(job, now + self.read_timeout_s, now)
            peer = self._peer(job.remote)
            if job.plan is not None and not job.fail and peer.future.done() and not peer.future.exception():
                try:
                    self._post(act, *peer.future.result())
                except Exception:  # noqa: BLE001  poll() posts again, meets the error and fails the request
                    pass
        for act in self._active.values():
            self._land_early(act)
        for req_id, lease_s in meta.leases.items():
            self._leases[req_id] = now + lease_s
        self._to_digest.update(meta.digests)
        # early decodes whose prefiller never fed them (D computes the prompt): failed remote loads in the metrics
        self.stats += [TransferStats(req_id, failed=True) for req_id in meta.failed_waits]
        self._idle = meta.idle

    def take_digests(self) -> integrity.RequestDigests | None:
        """P, after the step's forward pass (the KV of its tokens is written; on a GPU the digest kernels queue
        behind it): the digests of the requests whose prompt completed in this step, queued (None: none)."""
        todo, self._to_digest = self._to_digest, {}
        if self._digest is None or not todo:
            return None
        return integrity.RequestDigests(todo, self._digest)

    def _land_early(self, act: _Active) -> None:
        """At a step's start (before its forward pass is queued): a READ that landed since the last poll starts its
        check now, so that its digests are back by the step's poll, which then reports the load (on a GPU they run
        during the forward pass, on a stream of their own)."""
        if act.error is not None:
            return
        try:
            self._land(act)
        except Exception as e:  # noqa: BLE001  the poll fails the load with it, as if met there
            act.error = e

    def _land(self, act: _Active) -> bool:
        """True once act's READ landed and its check started."""
        if act.check is None and act.handle is not None and self.transport.poll(act.handle):
            self.transport.release(act.handle)
            act.handle = None
            act.check = self._check_landed(act)
        return act.check is not None

    def _advance(self, act: _Active) -> bool:
        """Move one job forward; True when it finished successfully. Raises ConnectorError on failure."""
        job = act.job
        peer = self._peer(job.remote)
        if act.error is not None:
            raise act.error
        if act.check is None:
            if act.handle is None:
                if not peer.future.done():
                    return False
                theirs, agent = peer.future.result()  # raises the handshake's error
                if job.fail:
                    raise ConnectorError(job.reason)  # _fail tells P Rejected
                if job.plan is None:
                    self.transport.notify(agent, encode(Rejected(job.remote.remote_request_id, reason=job.reason)))
                    return True
                if not self._post(act, theirs, agent):
                    self.transport.notify(agent, encode(Done(job.remote.remote_request_id)))
                    return True
            if not self._land(act):
                return False
        if not self._ready(act):  # the landed blocks' digests are still on their way
            return False
        assert act.check is not None
        checked = act.check.finish()  # raises DigestMismatch: the load fails
        if act.stats is not None:
            act.stats.blocks_verified = checked
        _, agent = peer.future.result()
        try:
            self.transport.notify(agent, encode(Done(job.remote.remote_request_id)))
        except TransportError as e:  # the data landed; P's lease frees its blocks
            log.warning("request %s: could not tell the prefiller it is done: %s", job.request_id, e)
        return True

    def _ready(self, act: _Active) -> bool:
        """Whether act's check has its digests. At its first look a poll waits up to check_wait_s for them (a
        spin, on the engine's thread): on a GPU they run beside the step's forward pass (landed_digest's stream),
        and a check not back now is reported a whole step later (the next poll). Never longer: the engine's
        other streams wait with it."""
        check = act.check
        assert check is not None
        if check.ready():
            return True
        if act.waited or self.check_wait_s <= 0:
            return False
        act.waited = True
        give_up = time.perf_counter() + self.check_wait_s
        while time.perf_counter() < give_up:
            if check.ready():
                return True
        return False

    def _post(self, act: _Active, theirs: Handshake, agent: str) -> bool:
        """Post the READ of `act`'s plan; False when there is nothing to read."""
        plan = act.job.plan
        assert plan is not None, "only a job with a plan is posted"
        descs = descriptors(self.local.regions, theirs.regions, plan.runs)
        act.stats = TransferStats(
            act.job.request_id, sum(d.length for d in descs), len(descs), checkpoints=len(plan.checkpoints)
        )
        if not descs:
            return False
        act.posted = self._clock()
        act.handle = self.transport.read(agent, descs)
        return True

    def _check_landed(self, act: _Active) -> integrity.Check:
        """D: start comparing the landed blocks with P's digests (a Check with nothing to compare where P sent
        none or checking is off)."""
        job, plan = act.job, act.job.plan
        assert plan is not None, "only a job with a plan lands"
        if self._corrupt_reads > 0 and self._corrupt_blocks is not None:
            self._corrupt_reads -= 1
            log.warning("request %s: test hook HYBRID_PD_TEST_CORRUPT_READS spoils bytes it landed", job.request_id)
            self._corrupt_blocks(plan.runs)
        expected = job.remote.digests
        if expected is None or self._landed_digest is None or self.verify_fraction <= 0:
            return integrity.Check(job.request_id, [], integrity.Computed([]))
        pairs = integrity.pairs_to_verify(plan, self.verify_fraction, job.request_id)
        return integrity.start_check(
            expected, self.algorithm, self.local.tp_rank, pairs, self._landed_digest, job.request_id
        )

    def _fail(self, act: _Active, err: Exception, results: Results) -> None:
        job = act.job
        log.warning(
            "request %s: KV load from %s failed, vLLM recomputes it: %s",
            job.request_id,
            job.remote.remote_engine_id,
            err,
        )
        if act.handle is not None:
            self.transport.release(act.handle)
        if job.plan is not None and self._clear_blocks is not None:
            self._clear_blocks(job.plan.runs)
        peer = self._peers.get((job.remote.remote_engine_id, job.remote.remote_host, job.remote.remote_port))
        if peer is not None and peer.future.done() and peer.future.exception() is None:
            try:  # let P free the blocks now rather than at lease expiry
                self.transport.notify(
                    peer.future.result()[1], encode(Rejected(job.remote.remote_request_id, reason=str(err)[:200]))
                )
            except TransportError:
                pass
        if isinstance(err, TransportError) or (
            peer is not None and peer.future.done() and peer.future.exception() is not None
        ):
            self._forget(job.remote)  # handshake again next time: the peer may have restarted
        if job.plan is not None or job.fail:
            results.finished_recving.add(job.request_id)
            results.failed_recving.add(job.request_id)
            stats = act.stats or TransferStats(job.request_id)
            stats.failed, stats.seconds = True, self._clock() - act.started
            stats.digest_mismatch = isinstance(err, DigestMismatch)
            self.stats.append(stats)

    def poll(self) -> Results:
        results = Results()
        now = self._clock()
        for req_id, act in list(self._active.items()):
            try:
                done = self._advance(act)
                if not done and now > act.deadline:
                    raise TransportError(f"READ not complete after {self.read_timeout_s:g} s")
            except ConnectorError as e:
                del self._active[req_id]
                self._fail(act, e, results)
                continue
            except Exception as e:  # noqa: BLE001  never let one request take the engine down
                log.exception("request %s: unexpected error in KV load", req_id)
                del self._active[req_id]
                self._fail(act, e, results)
                continue
            if done:
                del self._active[req_id]
                if act.job.plan is not None:
                    results.finished_recving.add(req_id)
                    stats = act.stats or TransferStats(req_id)
                    stats.seconds = self._clock() - (act.posted or act.started)
                    self.stats.append(stats)
        self._poll_leases(results, now)
        landed = results.finished_recving or results.failed_recving
        if self.idle_wait_s and self._idle and self._active and not landed:
            # a step with nothing to compute, only READs in flight: vLLM would step again at once, and a
            # decoder spinning so starved a prefiller on a shared core of the CPU the READ's set-up needed
            self._sleep(self.idle_wait_s)
        self._idle = False
        return results

    # ---- P: leases --------------------------------------------------------------------------------------
    def _poll_leases(self, results: Results, now: float) -> None:
        try:
            notes = self.transport.notifications()
        except TransportError as e:
            log.warning("reading NIXL notifications failed: %s", e)
            notes = []
        for raw in notes:
            try:
                msg = decode_notification(raw)
            except ConnectorError as e:
                log.warning("ignoring notification: %s", e)
                continue
            if isinstance(msg, Rejected):
                log.info("decoder rejected %s: %s", msg.request_id, msg.reason)
            self._early[msg.request_id] = now + 300
        for req_id in [r for r in self._leases if r in self._early]:
            del self._leases[req_id], self._early[req_id]
            results.finished_sending.add(req_id)
        for req_id, deadline in list(self._leases.items()):
            if now > deadline:
                log.warning("request %s: lease expired before the decoder read it; freeing its blocks", req_id)
                del self._leases[req_id]
                results.finished_sending.add(req_id)
        for req_id, expiry in list(self._early.items()):
            if now > expiry:
                del self._early[req_id]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
