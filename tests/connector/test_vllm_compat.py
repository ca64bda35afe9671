"""Our vLLM glue against each vLLM release we claim, read from the release's source (the `vllm` wheel,
fetched without dependencies, parsed with `ast`, never imported or run). 0.26 runs on the GPU machines, 0.32 is
the CPU test bed, 0.33 runs nowhere here (it pins torch 2.14). What the glue uses is read from the glue itself
where it can be, so a new use is checked without touching this file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.vllm_source import VllmSource, vllm_source

RELEASES = ["0.26.0", "0.32.0", "0.33.0"]
pytestmark = pytest.mark.parametrize("release", RELEASES)
CONNECTOR = Path(__file__).resolve().parents[2] / "connector"
GLUE = {f: ast.parse((CONNECTOR / f).read_text()) for f in ("vllm_glue.py", "vllm_stats.py", "vllm_checkpoints.py",
                                                          "vllm_request.py", "scheduler_side.py")}
BASE = "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
SCHEDULER, REQUEST, OUTPUTS = "vllm/v1/core/sched/scheduler.py", "vllm/v1/request.py", "vllm/v1/outputs.py"
POOL, UTILS = "vllm/v1/core/block_pool.py", "vllm/v1/core/kv_cache_utils.py"
MANAGER = "vllm/v1/core/kv_cache_manager.py"
WORKERS = ("vllm/v1/worker/kv_connector_model_runner_mixin.py", "vllm/v1/worker/gpu/kv_connector.py")
# What the glue has for vLLM >= 0.32 only, and why older releases, which never call or import it, are fine.
SINCE_0_32 = {
    "get_transfer_results": "they call get_finished; a failed load travels as WorkerReport worker metadata",
    "KVConnectorTransferResults": "imported inside get_transfer_results only",
    "get_loaded_kv_cache_group_ids": "they do not ask (0.32 asks so as not to zero the blocks we load)",
    "supports_divergent_local_hybrid_hits": "they give the connector the hit common to all groups",
}
SINCE_0_33 = {"supports_sleep_mode": "they have no sleep-mode check (ours refuses sleep mode where asked)"}
HOOKS = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
         "update_connector_output", "request_finished_all_groups", "get_loaded_kv_cache_group_ids",
         "supports_divergent_local_hybrid_hits")  # the scheduler's; the worker's are checked apart


def vllm_imports() -> list[tuple[str, str, str, bool]]:
    """(module, name, glue file, imported inside a function) for every `from vllm... import` of the glue."""
    out = []
    for file, tree in GLUE.items():
        top = {id(n) for n in tree.body}
        out += [(n.module, a.name, file, id(n) not in top) for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "vllm" for a in n.names]
    return out


ARG_UTILS = "vllm/engine/arg_utils.py"  # what the launchers' probes read (prefill/launch/probes.py)
NEEDED = [BASE, SCHEDULER, REQUEST, OUTPUTS, POOL, UTILS, MANAGER, ARG_UTILS, *WORKERS] + [
    m.replace(".", "/") + end for m, *_ in vllm_imports() for end in (".py", "/__init__.py")]
_sources: dict[str, VllmSource | Exception] = {}


def source(release: str) -> VllmSource:
    """The release's source, fetched once per session; a failed download fails every test of the release."""
    if release not in _sources:
        try:
            _sources[release] = vllm_source(release, NEEDED)
        except Exception as e:  # noqa: BLE001  kept, so that the other tests fail without a new download
            _sources[release] = e
    if isinstance(_sources[release], Exception):
        pytest.fail(f"vLLM {release}: {_sources[release]}", pytrace=False)
    return _sources[release]


def older_than(release: str, version: tuple[int, int]) -> bool:
    return tuple(map(int, release.split(".")))[:2] < version


def old(release: str) -> bool:
    return older_than(release, (0, 32))


def top_level(tree: ast.Module | None) -> dict[str, ast.AST]:
    """What a module defines or imports at run time (not under TYPE_CHECKING)."""
    names, todo = {}, list(tree.body if tree else ())
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)):
            names[n.name] = n
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: n for a in n.names})
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            names.update({t.id: n for t in targets if isinstance(t, ast.Name)})
        elif isinstance(n, ast.If) and "TYPE_CHECKING" not in ast.unparse(n.test):
            todo += n.body + n.orelse
        elif isinstance(n, ast.Try):
            todo += n.body + [s for h in n.handlers for s in h.body] + n.orelse
    return names


def vllm_class(src: VllmSource, path: str, name: str) -> ast.ClassDef | None:
    found = top_level(src.parse(path)).get(name)
    return found if isinstance(found, ast.ClassDef) else None


def glue_class(name: str) -> ast.ClassDef:
    return next(n for t in GLUE.values() for n in t.body if isinstance(n, ast.ClassDef) and n.name == name)


def methods(cls: ast.ClassDef | None) -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in getattr(cls, "body", ()) if isinstance(f, ast.FunctionDef)}


def fields(cls: ast.ClassDef | None) -> set[str]:
    return {ast.unparse(s.target) for s in getattr(cls, "body", ()) if isinstance(s, ast.AnnAssign)}


def attrs(node: ast.AST | None, on: str | None = None, store: bool = False) -> set[str]:
    """Attribute names used in `node` (on the object spelled `on`; only those assigned, with `store`)."""
    return {n.attr for n in (ast.walk(node) if node else ()) if isinstance(n, ast.Attribute)
            and (on is None or ast.unparse(n.value) == on) and (not store or isinstance(n.ctx, (ast.Store, ast.Del)))}


def decorated(f: ast.FunctionDef, name: str) -> bool:
    return any(ast.unparse(d).split(".")[-1] == name for d in f.decorator_list)


def shape(f: ast.FunctionDef) -> tuple:
    kind = next((d for d in ("property", "classmethod", "staticmethod") if decorated(f, d)), "method")
    return kind, [x.arg for x in f.args.posonlyargs + f.args.args], bool(f.args.vararg), bool(f.args.kwarg)


def accepts(f: ast.AST | None, n: int) -> bool:
    """Whether a call with n positional arguments (besides self/cls) binds to `f`."""
    if not isinstance(f, ast.FunctionDef):
        return False
    names = [x.arg for x in f.args.posonlyargs + f.args.args]
    params = len(names) - (names[:1] in (["self"], ["cls"]))
    return params - len(f.args.defaults) <= n and (n <= params or bool(f.args.vararg))


def test_every_vllm_name_the_glue_imports_exists(release):
    src, missing = source(release), []
    for module, name, file, lazy in vllm_imports():
        path, tree = src.module(module)
        if name not in top_level(tree) and not (lazy and old(release) and name in SINCE_0_32):
            missing.append(f"{path} has no {name} (imported by connector/{file})")
    assert not missing, f"vLLM {release}: " + "; ".join(missing)


def test_every_override_exists_on_the_base_class_with_the_same_parameters(release):
    src, ours, problems = source(release), glue_class("HybridPDConnector"), []
    base = {**methods(vllm_class(src, BASE, "SupportsHMA")), **methods(vllm_class(src, BASE, "KVConnectorBase_V1"))}
    for name, f in methods(ours).items():
        if name not in base and not (old(release) and name in SINCE_0_32) and not (
                older_than(release, (0, 33)) and name in SINCE_0_33):
            problems.append(f"{name} is not on the base class")
        elif name in base and shape(f) != shape(base[name]):
            problems.append(f"{name}: ours {shape(f)}, theirs {shape(base[name])}")
    own = set(methods(ours)) | attrs(methods(ours)["__init__"], "self", store=True)  # the rest is the base's
    problems += [f"self.{a} is not on the base class" for a in sorted(attrs(ours, "self") - own - set(base)
                                                                       - attrs(base.get("__init__"), "self", True))]
    assert not problems, f"vLLM {release}: {BASE} KVConnectorBase_V1/SupportsHMA: " + "; ".join(problems)


def test_every_abstract_method_is_implemented(release):
    src, origin, missing = source(release), {n: m for m, n, *_ in vllm_imports()}, []
    for cls in (n for t in GLUE.values() for n in t.body if isinstance(n, ast.ClassDef)):
        for base in (ast.unparse(b) for b in cls.bases if ast.unparse(b) in origin):
            path = src.module(origin[base])[0]
            abstract = [f for f in methods(vllm_class(src, path, base)).values() if decorated(f, "abstractmethod")]
            missing += [f"{cls.name} lacks {base}.{f.name} ({path})" for f in abstract if f.name not in methods(cls)]
    assert not missing, f"vLLM {release}: " + "; ".join(missing)


def test_kv_connector_output_has_the_fields_we_read(release):
    fn = methods(glue_class("HybridPDConnector"))["update_connector_output"]
    optional = {n.args[1].value for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "getattr"}
    # failed_recving is new in 0.32; before it, kv_connector_worker_meta carries our failed loads
    wanted = attrs(fn, "connector_output") | optional - ({"failed_recving"} if old(release) else set())
    have = fields(vllm_class(source(release), OUTPUTS, "KVConnectorOutput"))
    assert wanted <= have, f"vLLM {release}: {OUTPUTS} KVConnectorOutput lacks {sorted(wanted - have)}"


def test_scheduler_updates_the_connector_before_it_resumes_finished_loads(release):
    # our pre-0.32 failed-load rewind (WorkerReport -> SchedulerSide.rewind_failed_loads) depends on it
    fn = methods(vllm_class(source(release), SCHEDULER, "Scheduler")).get("_update_from_kv_xfer_finished")
    nodes = list(ast.walk(fn)) if fn else []
    update = [n.lineno for n in nodes
              if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("connector.update_connector_output")]
    resume = [n.lineno for n in nodes if isinstance(n, ast.For) and "finished_recving" in ast.unparse(n.iter)]
    assert update and resume and max(update) < min(resume), (
        f"vLLM {release}: {SCHEDULER} Scheduler._update_from_kv_xfer_finished does not call "
        f"connector.update_connector_output (lines {update}) before its finished_recving loop (lines {resume})")


def test_the_connector_sees_a_steps_output_after_the_requests_it_finished_and_before_they_leave(release):
    """P's KV digests (SchedulerSide.on_digests) come in the worker metadata of the step that finished the
    request, and join the kv_transfer_params dict `request_finished` returned: vLLM must finish requests first,
    then hand the connector the step's output, and put that same dict (not a copy) into the request's output."""
    fn = methods(vllm_class(source(release), SCHEDULER, "Scheduler")).get("update_from_output")
    nodes = list(ast.walk(fn)) if fn else []
    finish = [n.lineno for n in nodes if isinstance(n, ast.Call) and ast.unparse(n.func) == "self._free_request"]
    update = [n.lineno for n in nodes
              if isinstance(n, ast.Call) and ast.unparse(n.func) == "self._update_from_kv_xfer_finished"]
    passed = [n for n in nodes if isinstance(n, ast.keyword) and n.arg == "kv_transfer_params"
              and ast.unparse(n.value) == "kv_transfer_params"]
    assert finish and update and max(finish) < min(update) and passed, (
        f"vLLM {release}: {SCHEDULER} update_from_output no longer finishes requests (lines {finish}) before it "
        f"updates the connector (lines {update}), or copies kv_transfer_params: P's digests would miss the params")


def test_vllms_block_level_load_errors_still_handle_one_kv_cache_group_only(release):
    """Why the connector never reports failed blocks through `get_block_ids_with_load_errors`: vLLM's handler
    unpacks a request's block ids as ONE group, and a hybrid model has several (attention + Mamba), so the
    engine would die on it. Failed loads go through the per-request channel (>= 0.32) or our WorkerReport rewind
    (older). When vLLM handles several groups there, this fails: use the block-level path then."""
    fn = methods(vllm_class(source(release), SCHEDULER, "Scheduler")).get("_update_requests_with_invalid_blocks")
    single = [n.lineno for n in ast.walk(fn) if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Tuple)
              and len(n.targets[0].elts) == 1 and "get_block_ids" in ast.unparse(n.value)] if fn else []
    assert single, (f"vLLM {release}: Scheduler._update_requests_with_invalid_blocks no longer unpacks one "
                    "KV-cache group: report failed blocks through get_block_ids_with_load_errors")


def test_vllm_calls_the_hooks_we_implement(release):
    src, scheduler = source(release), attrs(source(release).parse(SCHEDULER))
    missing = [f"{SCHEDULER} never uses connector.{h}" for h in HOOKS
               if h not in scheduler and not (old(release) and h in SINCE_0_32)]
    base = methods(vllm_class(src, BASE, "KVConnectorBase_V1"))  # 0.32+: the block pool comes through the manager
    if "bind_gpu_block_pool" not in scheduler and not (
            "bind_kv_cache_manager" in scheduler and "bind_gpu_block_pool" in attrs(base.get("bind_kv_cache_manager"))):
        missing.append(f"{SCHEDULER} never hands the connector its block pool (bind_gpu_block_pool)")
    if not old(release) and "get_finished" not in attrs(base.get("get_transfer_results"), "self"):
        missing.append(f"{BASE} get_transfer_results does not call get_finished (HYBRID_PD_TRANSFER_RESULTS=legacy)")
    results = "get_finished" if old(release) else "get_transfer_results"
    missing += [f"{path} never calls {h}" for path in WORKERS for h in
                (results, "build_connector_worker_meta", "get_kv_connector_stats") if h not in attrs(src.parse(path))]
    assert not missing, f"vLLM {release}: " + "; ".join(missing)


def test_request_has_the_attributes_the_scheduler_side_touches(release):
    request, status = (vllm_class(source(release), REQUEST, name) for name in ("Request", "RequestStatus"))
    init = attrs(methods(request).get("__init__"), "self", store=True)
    used, written, statuses = (set().union(*(attrs(t, on, w) for t in GLUE.values()))
                               for on, w in (("request", False), ("request", True), ("RequestStatus", False)))
    missing = sorted(used - init - {f for f, m in methods(request).items() if decorated(m, "property")})
    missing += [f"{a} (we assign it: not a plain attribute)" for a in sorted(written - init)]
    members = {t.id for s in (status.body if status else ()) if isinstance(s, ast.Assign) for t in s.targets}
    missing += [f"RequestStatus.{m}" for m in sorted(statuses - members)]
    assert not missing, f"vLLM {release}: {REQUEST} Request.__init__ lacks {missing}"


def test_block_pool_has_what_checkpoints_use(release):
    src, ours = source(release), glue_class("BlockPoolCheckpoints")
    pool = methods(vllm_class(src, POOL, "BlockPool"))
    calls = [n for n in ast.walk(ours) if isinstance(n, ast.Call) and ast.unparse(n.func).startswith("self.pool.")]
    problems = [f"BlockPool.{c.func.attr} taking {len(c.args)} arguments" for c in calls
                if not accepts(pool.get(c.func.attr), len(c.args))]
    problems += [f"BlockPool.{a}" for a in sorted(attrs(ours, "self.pool") - {c.func.attr for c in calls}
                                                  - attrs(pool.get("__init__"), "self", store=True))]
    if not accepts(top_level(src.parse(UTILS)).get("resolve_block_hashes"), 3):
        problems.append(f"{UTILS} resolve_block_hashes(block_hashes, hash_block_size, block_size)")
    if "block_id" not in fields(vllm_class(src, UTILS, "KVCacheBlock")):
        problems.append(f"{UTILS} KVCacheBlock.block_id")
    if "get_block_ids" not in methods(vllm_class(src, MANAGER, "KVCacheBlocks")):
        problems.append(f"{MANAGER} KVCacheBlocks.get_block_ids")
    assert not problems, f"vLLM {release}: {POOL} and friends lack " + "; ".join(problems)


def test_stats_and_prometheus_classes_take_what_we_pass(release):
    src, problems = source(release), []
    path, metrics = src.module("vllm.distributed.kv_transfer.kv_connector.v1.metrics")
    if "data" not in fields(top_level(metrics).get("KVConnectorStats")):
        problems.append("KVConnectorStats.data")
    init = methods(top_level(metrics).get("KVConnectorPromMetrics")).get("__init__")
    if not accepts(init, 4) or not {"_histogram_cls", "_counter_cls"} <= attrs(init, "self", store=True):
        problems.append("KVConnectorPromMetrics.__init__(vllm_config, metric_types, labelnames, "
                        "per_engine_labelvalues) setting self._histogram_cls and self._counter_cls")
    utils_path, utils = src.module("vllm.v1.metrics.utils")
    if not accepts(top_level(utils).get("create_metric_per_engine"), 2):
        problems.append(f"{utils_path} create_metric_per_engine(metric, per_engine_labelvalues)")
    assert not problems, f"vLLM {release}: {path}: " + "; ".join(problems)


def test_the_launchers_probe_finds_where_mamba_cache_mode_is_deprecated(release):
    """0.33 deprecates --mamba-cache-mode (align mode follows --enable-prefix-caching): the launchers leave it out
    there and pass it to 0.26 and 0.32, which need it."""
    from hybrid_pd.prefill.launch.probes import vllm_ignores_mamba_cache_mode

    text = (source(release).root / ARG_UTILS).read_text()
    assert "--mamba-cache-mode" in text
    assert vllm_ignores_mamba_cache_mode(text) == (not older_than(release, (0, 33)))


def test_the_scheduler_skips_a_request_whose_external_hit_is_not_known_yet(release):
    """Early decode (connector/awaiting.py): a request waiting for its prefiller's params answers
    get_num_new_matched_tokens with None, which the scheduler must take as "not this step, ask again" (skip the
    request and keep it waiting), not as a hit of 0 tokens."""
    fn = methods(vllm_class(source(release), SCHEDULER, "Scheduler")).get("schedule")
    calls = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and "get_num_new_matched_tokens" in ast.unparse(n)
             ] if fn else []
    names = {ast.unparse(t.elts[0]) for c in calls for t in c.targets if isinstance(t, ast.Tuple)}
    skips = [n for n in ast.walk(fn) if isinstance(n, ast.If) and ast.unparse(n.test) in {f"{v} is None" for v in names}
             and any(isinstance(s, ast.Continue) for s in n.body)] if fn else []
    assert names and skips, (f"vLLM {release}: {SCHEDULER} Scheduler.schedule no longer skips a request whose "
                             "get_num_new_matched_tokens is None: early decode would compute every waiting prompt")
