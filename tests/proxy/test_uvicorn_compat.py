"""The uvicorn internals proxy/http/server.py relies on, checked against the installed uvicorn's source.

The proxy's server subclasses uvicorn's httptools protocol and drives `uvicorn.Server` by hand (startup, its
listeners, its per-connection state): none of that is uvicorn's public API, and a 0.x release may change it.
What the subclass uses is read from proxy/http/server.py itself, so a new use is checked without touching this
file; each failure names the internal that moved and the uvicorn version that moved it."""

from __future__ import annotations

import ast
import inspect
import textwrap
import tomllib
from importlib.metadata import version
from pathlib import Path

import uvicorn
import uvicorn.config
import uvicorn.server
from packaging.requirements import Requirement
from uvicorn.protocols.http import httptools_impl

ROOT = Path(__file__).resolve().parents[2]
SERVER = ast.parse((ROOT / "proxy" / "http" / "server.py").read_text())
UVICORN = f"uvicorn {version('uvicorn')}"


def class_node(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def source_tree(obj: object) -> ast.Module:
    return ast.parse(textwrap.dedent(inspect.getsource(obj)))  # type: ignore[arg-type]


def self_attributes(node: ast.AST, ctx: type[ast.expr_context]) -> set[str]:
    """Names of `self.X` that `node` loads (ast.Load) or assigns (ast.Store)."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "self" and isinstance(n.ctx, ctx)}


def methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


OURS = class_node(SERVER, "_Protocol")
BASE = class_node(source_tree(httptools_impl), "HttpToolsProtocol")
CYCLE = class_node(source_tree(httptools_impl), "RequestResponseCycle")


def test_the_installed_uvicorn_is_within_the_declared_bound():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(Requirement(d) for d in deps if Requirement(d).name == "uvicorn").specifier
    assert spec.contains(version("uvicorn")), f"{UVICORN} is outside pyproject's bound {spec}"
    assert any(s.operator in ("<", "<=") for s in spec), f"uvicorn's bound {spec} needs an upper end"


def test_every_inherited_attribute_the_subclass_reads_is_still_set_by_uvicorn():
    used = self_attributes(OURS, ast.Load) - self_attributes(OURS, ast.Store) - set(methods(OURS))
    provided = self_attributes(BASE, ast.Store) | set(methods(BASE))
    gone = sorted(used - provided)
    assert not gone, f"{UVICORN}: HttpToolsProtocol no longer sets {gone}, which proxy/http/server.py's _Protocol reads"
    assert "keep_alive" in self_attributes(CYCLE, ast.Store), (
        f"{UVICORN}: RequestResponseCycle has no keep_alive (the server closes upgraded connections through it)")


def test_an_answer_that_ends_its_connection_says_connection_close():
    # HTTP/1.0 answers, and the server's upgraded requests (keep_alive set False), rely on uvicorn writing
    # `connection: close` itself whenever the cycle will not keep the connection (uvicorn >= 0.53).
    says_close = [n for n in ast.walk(methods(CYCLE)["send"]) if isinstance(n, ast.If)
                  and "not self.keep_alive" in ast.unparse(n.test)
                  and any(isinstance(c, ast.Constant) and c.value == b"connection: close\r\n" for c in ast.walk(n))]
    assert says_close, (
        f"{UVICORN}: RequestResponseCycle.send no longer adds `connection: close` when it will close the connection "
        "(clients of HTTP/1.0 answers and of upgraded requests would not know)")


def test_every_overridden_callback_keeps_its_parameters():
    base = methods(BASE)
    for name, ours in methods(OURS).items():
        if name.startswith("_"):
            continue
        assert name in base, f"{UVICORN}: HttpToolsProtocol.{name} is gone; uvicorn would never call our override"
        want, got = [a.arg for a in base[name].args.args], [a.arg for a in ours.args.args]
        assert got == want, f"{UVICORN}: HttpToolsProtocol.{name}{tuple(want)} but our override takes {tuple(got)}"


def test_a_parser_error_is_answered_through_send_400_response():
    handlers = [h for h in ast.walk(methods(BASE)["data_received"]) if isinstance(h, ast.ExceptHandler)
                and "HttpParserError" in ast.unparse(h.type or ast.Constant(None))]
    calls = {n.func.attr for h in handlers for n in ast.walk(h)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    assert "send_400_response" in calls, (
        f"{UVICORN}: data_received no longer answers a parser error with send_400_response: the server's limits "
        "(413, 431, 400 in OpenAI's shape) would go unanswered")


def test_each_request_takes_the_server_state_default_headers():
    # HTTPServer._date refreshes server_state.default_headers every second; each request's cycle must read them.
    text = ast.unparse(methods(BASE)["on_headers_complete"])
    assert "default_headers=self.server_state.default_headers" in text, (
        f"{UVICORN}: a request's cycle no longer takes server_state.default_headers (the Date header would freeze)")


def test_config_takes_our_keywords_and_our_protocol_class():
    call = next(n for n in ast.walk(SERVER) if isinstance(n, ast.Call) and ast.unparse(n.func) == "uvicorn.Config")
    params = inspect.signature(uvicorn.Config.__init__).parameters
    missing = sorted(k.arg for k in call.keywords if k.arg not in params)
    assert not missing, f"{UVICORN}: uvicorn.Config no longer takes {missing} (proxy/http/server.py passes them)"
    load = ast.unparse(class_node(source_tree(uvicorn.config), "Config"))
    assert "self.http_protocol_class = self.http" in load, (
        f"{UVICORN}: Config.load no longer takes a protocol class (not a name) as `http`")
    assert "self.lifespan_class =" in load, f"{UVICORN}: Config.load no longer sets lifespan_class"


def test_the_server_internals_the_proxy_drives_by_hand():
    server = class_node(source_tree(uvicorn.server), "Server")
    state = class_node(source_tree(uvicorn.server), "ServerState")
    assert "startup" in methods(server), f"{UVICORN}: Server.startup is gone (HTTPServer.start calls it)"
    assert "server_state" in self_attributes(methods(server)["__init__"], ast.Store), (
        f"{UVICORN}: Server has no server_state")
    assert "servers" in self_attributes(methods(server)["startup"], ast.Store), (
        f"{UVICORN}: Server.startup no longer keeps its listeners in self.servers (the drain closes them)")
    assert "lifespan" in self_attributes(server, ast.Load), f"{UVICORN}: Server no longer uses self.lifespan"
    gone = sorted({"connections", "tasks", "default_headers"} - self_attributes(state, ast.Store))
    assert not gone, f"{UVICORN}: ServerState has no {gone} (the drain and the Date header use them)"
    assert "shutdown" in methods(BASE), f"{UVICORN}: HttpToolsProtocol.shutdown is gone (the drain calls it)"


def test_the_callbacks_the_subclass_writes_out_are_still_uvicorns():
    # _Protocol.on_url and on_header do uvicorn's work themselves (they run per request and per header field):
    # a uvicorn whose own versions do more would have that skipped.
    body = {name: [ast.unparse(s) for s in methods(BASE)[name].body] for name in ("on_url", "on_header")}
    assert body["on_url"] == ["self.url += url"], f"{UVICORN}: HttpToolsProtocol.on_url changed: {body['on_url']}"
    assert body["on_header"] == [
        "name = name.lower()",
        "if name == b'expect' and value.lower() == b'100-continue':\n    self.expect_100_continue = True",
        "self.headers.append((name, value))",
    ], f"{UVICORN}: HttpToolsProtocol.on_header changed: {body['on_header']}"


def test_the_response_complete_callback_the_subclass_writes_out_is_still_uvicorns():
    # _Protocol.on_response_complete does uvicorn's work itself, with the keep-alive timer made the connection's
    # lazy one (no timer armed and cancelled per request): a uvicorn whose own version does more would have that
    # skipped, and data_received must still be where the keep-alive wait ends.
    body = [ast.unparse(s) for s in methods(BASE)["on_response_complete"].body]
    assert body == [
        "self.server_state.total_requests += 1",
        "if self.transport.is_closing():\n    return",
        "self._unset_keepalive_if_required()",
        "self.flow.resume_reading()",
        "if self.pipeline:\n    cycle, app = self.pipeline.pop()\n    self._start_asgi_task(cycle, app)\nelse:\n"
        "    self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, "
        "self.timeout_keep_alive_handler)",
    ], f"{UVICORN}: HttpToolsProtocol.on_response_complete changed: {body}"
    assert "timeout_keep_alive_handler" in methods(BASE), f"{UVICORN}: timeout_keep_alive_handler is gone"


def test_the_cycle_state_a_whole_answer_written_at_once_reads_and_sets_is_uvicorns():
    # HeadWithBody.respond_now writes a whole answer as RequestResponseCycle.send would and leaves the cycle's
    # state as send leaves it (test_http_server compares the bytes): every cycle attribute it touches must be one
    # uvicorn's cycle has.
    tree = ast.parse((ROOT / "proxy" / "http" / "head_with_body.py").read_text())
    respond = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "respond_now")
    used = {n.attr for n in ast.walk(respond) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "cycle"}
    provided = self_attributes(CYCLE, ast.Store) | set(methods(CYCLE))
    gone = sorted(used - provided)
    assert not gone, f"{UVICORN}: RequestResponseCycle no longer has {gone}, which HeadWithBody.respond_now uses"
