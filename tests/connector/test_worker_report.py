"""The worker metadata vLLM carries from each TP rank's worker to the scheduler: failed loads and P's digests,
merged over ranks, then attached to the request's kv_transfer_params rank by rank."""

import pickle
from types import SimpleNamespace

from hybrid_pd.connector.integrity import RequestDigests
from hybrid_pd.connector.kv_digest import ALGORITHM
from hybrid_pd.connector.messages import GroupDigests, parse_remote_prefill
from hybrid_pd.connector.plan import GroupSpec
from hybrid_pd.connector.scheduler_side import SchedulerSide
from hybrid_pd.connector.vllm_worker_report import WorkerReport


def finished(p: SchedulerSide) -> dict:
    req = SimpleNamespace(request_id="r1", kv_transfer_params={"do_remote_decode": True}, num_computed_tokens=8,
                          prompt_token_ids=list(range(9)), num_prompt_tokens=9, max_tokens=16)
    p.on_new_request(req)
    return p.request_finished(req, ([3], [5, 6]), finished_ok=True)[1]


def test_ranks_merge_and_each_ranks_digests_land_in_its_slot():
    rank0 = [GroupDigests([3], [10]), GroupDigests([5, 6], [11, 12])]
    rank1 = [GroupDigests([3], [20]), GroupDigests([5, 6], [21, 22])]
    merged = WorkerReport({"a"}, {"r1": {1: rank1}}).aggregate(WorkerReport({"b"}, {"r1": {0: rank0}}))
    assert merged.failed == {"a", "b"} and merged.digests == {"r1": {0: rank0, 1: rank1}}
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=[GroupSpec("mamba", 4), GroupSpec("attention", 4)],
                      digests=True)
    params = finished(p)
    p.on_digests(merged.digests, ALGORITHM)
    digests = parse_remote_prefill(params).digests
    assert digests is not None and digests.of_rank(1) == {0: {3: 20}, 1: {5: 21, 6: 22}}


def test_digests_missing_a_rank_are_not_attached():
    p = SchedulerSide(engine_id="P", host="h", port=7, groups=[GroupSpec("mamba", 4), GroupSpec("attention", 4)],
                      digests=True)
    params = finished(p)
    p.on_digests({"r1": {1: [GroupDigests([3], [20]), GroupDigests([5, 6], [21, 22])]}}, ALGORITHM)
    assert params["digests"] is None  # rank 0's would be checked against nothing: D then checks none


class Counted:
    """A rank's digests on their way; counts the reads."""

    reads = 0

    def ready(self) -> bool:
        return True

    def result(self) -> list[list[int]]:
        Counted.reads += 1
        return [[10], [11, 12]]


def test_a_ranks_digests_are_read_when_the_scheduler_looks_or_when_pickled_once():
    """P's worker queues the step's digests and returns: the report reads them back when the scheduler first
    looks at them (with the step's output) or when vLLM pickles it for another process (TP > 1), never twice."""
    Counted.reads = 0
    report = WorkerReport(set(), {}, (1, RequestDigests({"r1": [[3], [5, 6]]}, lambda items: Counted())))
    assert Counted.reads == 0  # building the report (inside the step) read nothing
    copy = pickle.loads(pickle.dumps(report))
    want = {"r1": {1: [GroupDigests([3], [10]), GroupDigests([5, 6], [11, 12])]}}
    assert Counted.reads == 1 and copy.digests == want
    assert report.digests == want and Counted.reads == 1
    merged = WorkerReport(set(), {"r1": {0: want["r1"][1]}}).aggregate(copy)
    assert merged.digests == {"r1": {0: want["r1"][1], 1: want["r1"][1]}}
