"""The transfer plan: exact block ids for the layouts vLLM produces, and properties over random layouts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_pd.connector.plan import (
    NULL_BLOCK,
    Checkpoint,
    GroupSpec,
    PlanError,
    Run,
    cdiv,
    coalesce,
    plan_transfer,
)

MAMBA, ATTN = GroupSpec("mamba", 256), GroupSpec("attention", 256)
GROUPS = (MAMBA, ATTN)  # the tiny model's order: group 0 GDN, group 1 full attention


def test_first_turn_moves_every_attention_block_and_one_state():
    # P computed 300 tokens: Mamba [null, state], attention [2, 4]; D allocated Mamba [0, 7], attention [5, 6]
    plan = plan_transfer(GROUPS, remote_ids=[[0, 3], [2, 4]], local_ids=[[0, 7], [5, 6]],
                         num_tokens=300, local_hit_tokens=0)
    assert plan.runs == (Run(0, 7, 3), Run(1, 5, 2), Run(1, 6, 4))
    assert plan.dropped_placeholders == 1 and plan.skipped_local == 0 and plan.num_blocks == 3


def test_adjacent_blocks_coalesce_into_one_run():
    plan = plan_transfer(GROUPS, remote_ids=[[0, 0, 9], [10, 11, 12]], local_ids=[[0, 0, 3], [20, 21, 22]],
                         num_tokens=700, local_hit_tokens=0)
    assert plan.runs == (Run(0, 3, 9), Run(1, 20, 10, 3))


def test_blocks_d_already_holds_are_not_moved():
    # D hit 512 tokens locally (attention d0, d1 and a Mamba checkpoint c0 at index 1)
    plan = plan_transfer(GROUPS, remote_ids=[[0, 0, 0, 40], [30, 31, 32, 33]],
                         local_ids=[[0, 8, 0, 9], [1, 2, 14, 15]], num_tokens=900, local_hit_tokens=512)
    assert plan.runs == (Run(0, 9, 40), Run(1, 14, 32, 2))
    assert plan.skipped_local == 2


def test_full_local_hit_moves_nothing():
    plan = plan_transfer(GROUPS, remote_ids=[[0, 5], [6, 7]], local_ids=[[3, 4], [1, 2]],
                         num_tokens=512, local_hit_tokens=512)
    assert plan.runs == () and plan.num_blocks == 0


def test_checkpoint_at_last_boundary_is_shipped_next_to_the_state():
    cp = Checkpoint(group=0, remote_block=17, local_block=30, tokens=512)
    plan = plan_transfer(GROUPS, remote_ids=[[0, 0, 9], [10, 11, 12]], local_ids=[[0, 0, 31], [20, 21, 22]],
                         num_tokens=700, local_hit_tokens=0, checkpoints=[cp])
    assert plan.runs == (Run(0, 30, 17), Run(0, 31, 9), Run(1, 20, 10, 3))
    assert plan.checkpoints == (cp,)


@pytest.mark.parametrize("tokens,hit", [(700, 512), (256 + 1, 0)])
def test_checkpoint_outside_the_load_is_dropped(tokens, hit):
    cp = Checkpoint(group=0, remote_block=17, local_block=30, tokens=512 if tokens != 257 else 300)
    n = cdiv(tokens, 256)
    plan = plan_transfer(GROUPS, remote_ids=[[0] * (n - 1) + [9], list(range(10, 10 + n))],
                         local_ids=[[0] * (n - 1) + [31], list(range(40, 40 + n))],
                         num_tokens=tokens, local_hit_tokens=hit, checkpoints=[cp])
    assert plan.checkpoints == ()
    assert all(r.remote_start != 17 for r in plan.runs)


def test_a_junctions_checkpoint_at_the_stop_is_read_beside_the_state_d_resumes_from():
    """P stopped at a junction (a boundary): its state there crosses twice, into the request's state block and
    into a spare block D registers as a checkpoint (D's prompt goes on, so vLLM would not keep that one)."""
    cp = Checkpoint(group=0, remote_block=9, local_block=30, tokens=512)
    plan = plan_transfer(GROUPS, remote_ids=[[0, 9], [10, 11]], local_ids=[[0, 31], [40, 41]],
                         num_tokens=512, local_hit_tokens=0, checkpoints=[cp])
    assert plan.checkpoints == (cp,)
    assert sorted((r.local_start, r.remote_start) for r in plan.runs if r.group == 0) == [(30, 9), (31, 9)]


def test_a_needed_placeholder_or_short_list_is_refused():
    with pytest.raises(PlanError, match="placeholder"):
        plan_transfer(GROUPS, [[0, 0], [2, 4]], [[0, 7], [5, 6]], num_tokens=300, local_hit_tokens=0)
    with pytest.raises(PlanError, match="need 2 blocks"):
        plan_transfer(GROUPS, [[0, 3], [2]], [[0, 7], [5, 6]], num_tokens=300, local_hit_tokens=0)
    with pytest.raises(PlanError, match="not a multiple"):
        plan_transfer(GROUPS, [[0, 3], [2, 4]], [[0, 7], [5, 6]], num_tokens=300, local_hit_tokens=100)


# ---- properties -----------------------------------------------------------------------------------------
@st.composite
def layouts(draw):
    bs = draw(st.sampled_from([16, 64, 256]))
    n = draw(st.integers(1, 12 * bs))
    needed = cdiv(n, bs)
    hit = draw(st.integers(0, n // bs)) * bs
    ids = draw(st.lists(st.integers(1, 10_000), min_size=4 * needed, max_size=4 * needed, unique=True))
    contiguous = draw(st.booleans())
    if contiguous:
        base = draw(st.integers(1, 5000))
        ids = list(range(base, base + 4 * needed))
    p_attn, d_attn = ids[:needed], ids[needed:2 * needed]
    p_m = [NULL_BLOCK] * (needed - 1) + [ids[2 * needed]]
    d_m = [NULL_BLOCK] * (needed - 1) + [ids[3 * needed]]
    return GroupSpec("mamba", bs), GroupSpec("attention", bs), p_m, d_m, p_attn, d_attn, n, hit


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_plan_moves_exactly_the_missing_blocks(layout):
    mamba, attn, p_m, d_m, p_attn, d_attn, n, hit = layout
    plan = plan_transfer([mamba, attn], [p_m, p_attn], [d_m, d_attn], num_tokens=n, local_hit_tokens=hit)
    moved_attn = plan.blocks_of(1)
    first, needed = hit // attn.block_size, cdiv(n, attn.block_size)
    assert moved_attn == list(zip(d_attn[first:needed], p_attn[first:needed]))
    assert plan.blocks_of(0) == ([] if hit == n else [(d_m[-1], p_m[-1])])  # one state, or none
    assert all(NULL_BLOCK not in pair for r in plan.runs for pair in r.pairs)  # placeholders never move
    assert plan.skipped_local == first
    for a, b in zip(plan.runs, plan.runs[1:]):  # runs are maximal
        assert not (a.group == b.group and b.local_start == a.local_start + a.count
                    and b.remote_start == a.remote_start + a.count)


@given(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), max_size=30))
def test_coalesce_keeps_every_pair_in_order(pairs):
    runs = coalesce(0, pairs)
    assert [p for r in runs for p in r.pairs] == pairs
