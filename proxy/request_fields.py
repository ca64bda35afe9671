"""What the proxy requires of a request's fields, as a table: the fields it reads itself, and those whose
wrong values vLLM answers with a 500 instead of a 400 (an exception past its own validation), so that such a
body gets a 400 in OpenAI's shape before it reaches a worker.

The second group was found by fuzzing every field of vLLM 0.32's completions and chat requests with values of
the wrong type and shape (benchmarks/vllm_500_fields.py; its findings in
benchmarks/results/2026-11-25-cpu-vllm-500-fields/summary.md):
- `structured_outputs` that is not an object: vLLM's pre-validator calls `.get` on it;
- an integer that msgpack cannot carry (below -2**63 or above 2**64-1) where vLLM does not bound it before it
  sends the sampling parameters to its engine core: `stream_interval`, `repetition_detection`'s sizes and
  counts, anywhere inside `structured_outputs` (a JSON schema's numbers).

Every other value is left to the worker, whose 4xx the proxy passes on. A field set to null counts as absent.
Checking costs one dict lookup per rule for a body without these fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import BadRequest

WIRE_INT_MIN, WIRE_INT_MAX = -(2**63), 2**64 - 1  # what msgpack (vLLM's engine-core wire format) can carry


@dataclass(frozen=True)
class Rule:
    """`path`: keys from the body down (a rule whose parent is not an object does not apply); `kind`: the JSON
    type the value must have; `wire_ints`: integers in the value, at any depth, must fit vLLM's wire format."""

    path: tuple[str, ...]
    kind: type
    wire_ints: bool = False

    @property
    def param(self) -> str:
        return ".".join(self.path)


RULES: tuple[Rule, ...] = (
    # read by the proxy itself
    Rule(("model",), str),
    Rule(("stream",), bool),
    Rule(("stream_options",), dict),
    Rule(("user",), str),
    Rule(("n",), int),
    Rule(("max_tokens",), int),
    Rule(("max_completion_tokens",), int),
    Rule(("min_tokens",), int),
    # answered with a 500 by vLLM 0.32
    Rule(("structured_outputs",), dict, wire_ints=True),
    Rule(("stream_interval",), int, wire_ints=True),
    Rule(("repetition_detection", "max_pattern_size"), int, wire_ints=True),
    Rule(("repetition_detection", "min_pattern_size"), int, wire_ints=True),
    Rule(("repetition_detection", "min_count"), int, wire_ints=True),
)

_KIND_NAMES = {str: "a string", bool: "a boolean", int: "an integer", dict: "an object"}


_RULES_BY_ROOT: dict[str, tuple[Rule, ...]] = {}  # a path's first key -> its rules (contiguous in the table)
for _rule in RULES:
    _RULES_BY_ROOT[_rule.path[0]] = (*_RULES_BY_ROOT.get(_rule.path[0], ()), _rule)
_GROUPS = tuple(_RULES_BY_ROOT.items())


def check_fields(body: dict[str, Any], rules: tuple[Rule, ...] = RULES) -> None:
    """Raise BadRequest (param: the field's dotted path) for the first value that breaks a rule."""
    if rules is not RULES:
        for rule in rules:
            _check(body, rule)
        return
    for root, group in _GROUPS:  # (a body has few of these fields: one lookup each, the rules only for those)
        if root in body:
            for rule in group:
                _check(body, rule)


def _check(body: dict[str, Any], rule: Rule) -> None:
    node: Any = body
    for key in rule.path:
        node = node.get(key) if isinstance(node, dict) else None
    if node is None:
        return
    if not isinstance(node, rule.kind) or (rule.kind is int and isinstance(node, bool)):
        raise BadRequest(f"'{rule.param}' must be {_KIND_NAMES[rule.kind]}", param=rule.param)
    if rule.wire_ints and not _ints_fit(node):
        raise BadRequest(f"'{rule.param}' holds an integer outside [{WIRE_INT_MIN}, {WIRE_INT_MAX}]", param=rule.param)


def _ints_fit(value: Any) -> bool:
    """Every integer in `value` (at any depth, without recursion) fits the wire format."""
    todo = [value]
    while todo:
        node = todo.pop()
        if isinstance(node, int) and not isinstance(node, bool):
            if not WIRE_INT_MIN <= node <= WIRE_INT_MAX:
                return False
        elif isinstance(node, dict):
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    return True
