"""The torch block digest (connector/kv_digest.py): what a transfer can break, it notices."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from hybrid_pd.connector.kv_digest import PendingDigests, digest_blocks, flip_first_word


def layers(seed: int = 0, blocks: int = 8) -> list[torch.Tensor]:
    """One group's layers as vLLM lays them out: bf16 attention pages and a Mamba state smaller than its page."""
    gen = torch.Generator().manual_seed(seed)
    attn = torch.randn(blocks, 2, 16, 8, generator=gen).to(torch.bfloat16)
    page = torch.randn(blocks, 40, generator=gen)
    state = page.as_strided((blocks, 3, 5), (40, 5, 1))  # 15 of the page's 40 floats move
    return [attn, state, torch.randint(0, 255, (blocks, 7), generator=gen, dtype=torch.uint8)]  # 7 B: not words


def test_identical_bytes_give_identical_digests_across_calls_and_copies():
    a = digest_blocks(layers(), range(8))
    assert a == digest_blocks(layers(), range(8)) == digest_blocks([t.clone() for t in layers()], range(8))
    assert digest_blocks(layers(), [5, 2]) == [a[5], a[2]]
    assert len(set(a)) == 8  # different blocks, different digests


def test_a_flipped_byte_in_any_layer_changes_only_that_blocks_digest():
    before = digest_blocks(layers(), range(8))
    for k in range(3):
        ts = layers()
        flat = ts[k][3].view(torch.uint8) if k != 1 else ts[1][3]
        if k == 1:  # the strided Mamba state: one element of the part that moves
            flat[2, 4] = flat[2, 4] + 1
        else:
            flat.view(-1)[5] ^= 0x10
        after = digest_blocks(ts, range(8))
        assert [i for i in range(8) if after[i] != before[i]] == [3], k


def test_a_byte_outside_the_moved_part_of_a_page_is_ignored():
    ts = layers()
    before = digest_blocks(ts, [3])
    ts[1].as_strided((8, 40), (40, 1))[3, 39] += 1.0  # the page's tail, beyond the 15 floats that move
    assert digest_blocks(ts, [3]) == before


def test_a_zeroed_block_and_two_swapped_blocks_are_caught():
    ts, before = layers(), digest_blocks(layers(), range(8))
    ts[0][4].zero_()
    assert digest_blocks(ts, [4]) != [before[4]]
    ts = layers()
    for t in ts:
        t[[1, 6]] = t[[6, 1]].clone()
    after = digest_blocks(ts, range(8))
    assert after[1] == before[6] and after[6] == before[1]  # the bytes moved, their digests with them
    assert after[1] != before[1] and after[6] != before[6]  # so D, comparing per block id, sees both


def test_words_swapped_inside_a_block_are_caught():
    ts = layers()
    before = digest_blocks(ts, [2])
    w = ts[0][2].view(torch.int32).view(-1)
    w[[0, 1]] = w[[1, 0]].clone()
    assert digest_blocks(ts, [2]) != before


def test_the_test_hook_flips_one_element_and_the_digest_sees_it():
    ts = layers()
    before = digest_blocks(ts, range(8))
    flip_first_word(ts, 5)
    after = digest_blocks(ts, range(8))
    assert [i for i in range(8) if after[i] != before[i]] == [5]


def test_two_sign_bits_flipped_are_caught():
    """Two top-bit flips move two words by 2**31 each: a sum of products wrapped mod 2**32 would not move."""
    ts = layers()
    before = digest_blocks(ts, range(8))
    words = ts[0][3].view(torch.int32).view(-1)
    for i in (0, 17):
        words[i] ^= -(2**31)
    after = digest_blocks(ts, range(8))
    assert [i for i in range(8) if after[i] != before[i]] == [3]


def test_digests_read_back_together_are_each_jobs_own_in_order():
    """P digests every group of every prompt a step completed together (PendingDigests: one read back to the
    host): each job gets exactly its own digest_blocks, empty jobs included, whatever the jobs around it."""
    a, b = layers(1), layers(2, blocks=5)
    jobs = [(a, [3, 1]), (b, []), ([], [2]), (b, [4, 0, 4]), (a, range(8))]
    together = PendingDigests(jobs).result()
    assert together == [digest_blocks(t, ids) for t, ids in jobs]
    assert together[2] == [0] and together[1] == [] and PendingDigests([]).result() == []
    assert PendingDigests(jobs[::-1]).result() == together[::-1]
    assert PendingDigests(jobs, batched=True).result() == PendingDigests(jobs, batched=False).result()


def test_the_batched_digest_is_the_per_layer_one_on_every_layout(monkeypatch):
    """On a GPU the layers of one layout are digested together (kv_digest._layer_sums_batched): the same digests
    as the per-layer path the CPU runs, for every layout a group may hold, in slices or in one piece."""
    import hybrid_pd.connector.kv_digest as kv_digest

    gen = torch.Generator().manual_seed(7)
    gpu_attention = torch.randn(6, 80, 2, 128, generator=gen).to(torch.bfloat16).permute(0, 2, 1, 3)  # K/V per token
    group = [*layers(3, blocks=6), gpu_attention, *(torch.randn(6, 33, generator=gen) for _ in range(5)),
             torch.randint(-128, 127, (6, 5), generator=gen, dtype=torch.int8), torch.randn(6, generator=gen)]
    ids = [5, 0, 3, 3]
    expected = digest_blocks(group, ids, batched=False)
    assert digest_blocks(group, ids, batched=True) == expected
    changed = [t.clone() for t in group]
    changed[4][3, 7] += 1.0  # one layer of a slice of several moves only its block's digest
    moved = digest_blocks(changed, ids, batched=True)
    assert moved == digest_blocks(changed, ids, batched=False)
    assert [a != b for a, b in zip(moved, expected, strict=True)] == [False, False, True, True]
    monkeypatch.setattr(kv_digest, "BATCH_BYTES", 1)  # one layer per slice
    assert digest_blocks(group, ids, batched=True) == expected



TRITON_CHECK = """
import torch
import hybrid_pd.connector.kv_digest as kv_digest
from tests.connector.test_kv_digest import layers

gen = torch.Generator().manual_seed(11)
gpu_attention = torch.randn(6, 80, 2, 128, generator=gen).to(torch.bfloat16).permute(0, 2, 1, 3)  # K/V per token
group = [*layers(4, blocks=6), gpu_attention, torch.randn(6, generator=gen), torch.randn(6, 4100, generator=gen)]
ids = torch.tensor([5, 0, 3, 3])


def torch_sums(tensors):
    words = (kv_digest._words(kv_digest._raw(t).index_select(0, ids)) for t in tensors)
    return [w.mul_(kv_digest.multipliers(w.shape[1], w.device)).sum(dim=1) for w in words]


sums = kv_digest._layer_sums_triton(group, ids)
assert sorted(sums) == [0, 1, 3, 4, 5], sorted(sums)  # layer 2's blocks are 7 bytes: torch's
expected = torch_sums(group)
assert all(torch.equal(sums[j], expected[j]) for j in sums), (sums, expected)
group[5][3, 4099] += 1.0  # the last word of a block that spans three programs of WORDS words
moved = kv_digest._layer_sums_triton(group, ids)[5]
assert torch.equal(moved, torch_sums(group)[5]) and (moved != expected[5]).tolist() == [False, False, True, True]
"""


def test_the_triton_kernel_sums_what_torch_sums_on_every_layout_of_whole_words():
    """On a GPU one Triton kernel launch sums the blocks' words of every layer tensor
    (kv_digest._layer_sums_triton), in memory order as torch's paths read them; here Triton's interpreter runs it
    on the CPU (in a process of its own: the interpreter is chosen before triton is imported). Layers whose blocks
    are not whole words are left to torch."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Triton kernel failed" not in done.stderr, done.stderr[-3000:]


def test_a_triton_kernel_that_fails_leaves_the_digests_to_torch(monkeypatch, caplog):
    import hybrid_pd.connector.kv_digest as kv_digest

    monkeypatch.setattr(kv_digest, "_TRITON_OK", True)  # (restored after the test)
    monkeypatch.setattr(kv_digest, "triton_kernel", lambda: 1 / 0)
    assert kv_digest._layer_sums_triton([torch.randn(6, 100)], torch.tensor([1, 2])) == {}
    assert not kv_digest._TRITON_OK and "torch computes them from now on" in caplog.text
