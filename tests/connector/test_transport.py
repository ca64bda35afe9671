"""Descriptors from runs (exact addresses), and the real NIXL transport on two agents over loopback."""

import multiprocessing as mp

import numpy as np
import pytest

from hybrid_pd.connector.errors import TransportError
from hybrid_pd.connector.messages import Region
from hybrid_pd.connector.plan import Run
from hybrid_pd.connector.transport import Desc, InMemoryTransport, descriptors

PAGE, STATE = 4096, 1000  # an attention page, and a Mamba state inside a page of the same size


def regions(base: int, n: int) -> list[Region]:
    # group 0 = Mamba layer m0 (state < page), group 1 = attention layer a0 (page == block)
    return [Region("m0", 0, base, PAGE, STATE, n), Region("a0", 1, base + n * PAGE, PAGE, PAGE, n)]


def test_adjacent_attention_blocks_become_one_descriptor_mamba_states_do_not():
    local, remote = regions(0, 16), regions(1 << 20, 16)
    descs = descriptors(local, remote, [Run(1, 5, 2, 3), Run(0, 7, 3, 2)])
    assert descs == [Desc(16 * PAGE + 5 * PAGE, (1 << 20) + 16 * PAGE + 2 * PAGE, 3 * PAGE),
                     Desc(7 * PAGE, (1 << 20) + 3 * PAGE, STATE), Desc(8 * PAGE, (1 << 20) + 4 * PAGE, STATE)]


def test_runs_outside_the_registered_blocks_are_refused():
    with pytest.raises(TransportError, match="outside"):
        descriptors(regions(0, 4), regions(0, 4), [Run(1, 3, 0, 2)])


def fill(buf: np.ndarray, seed: int) -> None:
    buf[:] = np.random.default_rng(seed).integers(0, 255, buf.size, dtype=np.uint8)


def test_in_memory_transport_moves_bytes_and_notifies():
    src, dst = np.zeros(32 * PAGE, np.uint8), np.zeros(32 * PAGE, np.uint8)
    fill(src, 1)
    p, d = InMemoryTransport("mem-p"), InMemoryTransport("mem-d")
    try:
        peer = d.add_peer(p.metadata())
        descs = descriptors(regions(dst.ctypes.data, 16), regions(src.ctypes.data, 16), [Run(1, 0, 4, 2)])
        h = d.read(peer, descs)
        assert d.poll(h)
        assert (dst[16 * PAGE:18 * PAGE] == src[20 * PAGE:22 * PAGE]).all()
        d.notify(peer, b"done")
        assert p.notifications() == [b"done"] and p.notifications() == []
        d.fail_reads = True
        with pytest.raises(TransportError):
            d.poll(d.read(peer, descs))
    finally:
        p.close(), d.close()


def _prefiller(q_meta, q_back, n_blocks: int) -> None:
    """Child process: a NIXL agent owning `n_blocks` pages of known bytes; waits for D's notification."""
    from hybrid_pd.connector.transport import NixlTransport

    buf = np.zeros(2 * n_blocks * PAGE, np.uint8)
    fill(buf, 7)
    t = NixlTransport("loop-p", delay_us=1000)
    t.register([(buf.ctypes.data, buf.nbytes)])
    q_meta.put((t.metadata(), buf.ctypes.data))
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        notes = t.notifications()
        if notes:
            q_back.put(notes)
            break
        time.sleep(0.01)
    t.close()


def test_nixl_reads_real_bytes_between_two_processes_over_loopback():
    from hybrid_pd.connector.transport import NixlTransport

    n = 16
    ctx = mp.get_context("spawn")
    q_meta, q_back = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=_prefiller, args=(q_meta, q_back, n), daemon=True)
    child.start()
    t = None
    try:
        meta, remote_base = q_meta.get(timeout=60)
        expected = np.zeros(2 * n * PAGE, np.uint8)
        fill(expected, 7)
        dst = np.zeros(2 * n * PAGE, np.uint8)
        t = NixlTransport("loop-d", delay_us=1000)
        t.register([(dst.ctypes.data, dst.nbytes)])
        peer = t.add_peer(meta)
        runs = [Run(1, 3, 8, 4), Run(0, 2, 11, 1)]  # 4 adjacent attention pages + 1 Mamba state
        descs = descriptors(regions(dst.ctypes.data, n), regions(remote_base, n), runs)
        assert len(descs) == 2  # the 4 adjacent pages became one descriptor
        handle = t.read(peer, descs)
        import time

        deadline = time.monotonic() + 30
        while not t.poll(handle):
            assert time.monotonic() < deadline, "NIXL READ did not complete"
            time.sleep(0.005)
        t.release(handle)
        a = n * PAGE  # attention region offset
        assert (dst[a + 3 * PAGE:a + 7 * PAGE] == expected[a + 8 * PAGE:a + 12 * PAGE]).all()
        assert (dst[2 * PAGE:2 * PAGE + STATE] == expected[11 * PAGE:11 * PAGE + STATE]).all()
        assert not dst[2 * PAGE + STATE:3 * PAGE].any()  # the page padding after a state is not moved
        assert not dst[a:a + 3 * PAGE].any() and not dst[a + 7 * PAGE:].any()
        t.notify(peer, b"done:r1")
        assert q_back.get(timeout=30) == [b"done:r1"]
    finally:
        if t is not None:
            t.close()
        child.join(10)
        if child.is_alive():
            child.kill()
