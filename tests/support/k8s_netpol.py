"""NetworkPolicies of a rendered overlay, checked by what they select (tests/deploy, through k8s_policy.py).

A policy protects only the pods its podSelector matches, and a rule admits only the peers its selectors
match: a selector that names a label no pod template carries protects nothing and is still valid YAML. So
every selector is evaluated against the overlay's pod templates, the way the API server would:

    hybrid-pd-workers  selects every worker template (prefill, decode), nothing else
        ingress: this release's proxy       -> http, kv-events, params-inbox (decoders)
                 this release's workers     -> the NIXL side-channel ports, UCX's TCP port range and
                                                  params-inbox (decoders: a prefiller's own delivery)
                 (metrics: the monitoring namespace -> http; multi-node TP: workers -> any port)
    hybrid-pd-proxy    selects every proxy template, nothing else; ingress: http, from anywhere
"""

from __future__ import annotations

from collections.abc import Iterator

WORKER_ROLES = ("prefill", "decode")
INSTANCE = "app.kubernetes.io/instance"
ROLE = "hybrid-pd/role"
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}  # components/servicemonitor: where Prometheus runs
PROXY_PORTS = ("http", "kv-events", "params-inbox")  # the worker ports the proxy dials (params-inbox: decoders)


def matches(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a pod's labels; {} matches every pod."""
    if not (selector.get("matchLabels") or {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
            return False
    return True


def selected(selector: dict, pods: dict[str, dict]) -> set[str]:
    return {where for where, pod in pods.items() if matches(selector, pod["metadata"].get("labels", {}))}


def port_set(ports: list[dict], named: dict[str, set[int]]) -> set[int]:
    """The TCP port numbers a rule's ports admit (named ports: every container port of that name)."""
    out: set[int] = set()
    for p in ports:
        if isinstance(p["port"], str):
            out |= named.get(p["port"], set())
        else:
            out |= set(range(p["port"], p.get("endPort", p["port"]) + 1))
    return out


def ucx_port_range(docs: list[dict]) -> set[int]:
    for d in docs:
        if d["kind"] == "ConfigMap" and "UCX_TCP_PORT_RANGE" in d.get("data", {}):
            low, _, high = d["data"]["UCX_TCP_PORT_RANGE"].partition("-")
            return set(range(int(low), int(high or low) + 1))
    return set()


def network_problems(docs: list[dict], pods: dict[str, dict]) -> list[str]:
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}
    workers = {w for w, p in pods.items() if p["metadata"].get("labels", {}).get(ROLE) in WORKER_ROLES}
    proxies = {w for w, p in pods.items() if p["metadata"].get("labels", {}).get(ROLE) == "proxy"}
    named: dict[str, set[int]] = {}
    for where in workers:
        for c in pods[where]["spec"]["containers"]:
            for p in c.get("ports", []):
                named.setdefault(p["name"], set()).add(p["containerPort"])
    problems = []
    for where in sorted(set(pods) - set().union(*(selected(p["spec"]["podSelector"], pods)
                                                   for p in policies.values()))):
        problems.append(f"{where}: no NetworkPolicy selects these pods (open to every pod in the cluster)")
    for suffix, wanted, rules in (("hybrid-pd-workers", workers, worker_rule_problems),
                                  ("hybrid-pd-proxy", proxies, proxy_rule_problems)):
        name = next((n for n in policies if n.endswith(suffix)), None)
        if name is None:
            problems.append(f"no NetworkPolicy {suffix}")
            continue
        spec = policies[name]["spec"]
        chosen = selected(spec["podSelector"], pods)
        if chosen != wanted:
            problems.append(f"NetworkPolicy {name} selects {sorted(chosen) or 'no pods'}, not {sorted(wanted)}")
        if INSTANCE not in (spec["podSelector"].get("matchLabels") or {}):
            problems.append(f"NetworkPolicy {name}: podSelector must carry {INSTANCE}")
        if "Ingress" not in spec.get("policyTypes", ["Ingress"]):
            problems.append(f"NetworkPolicy {name}: no Ingress policy type")
        problems += rules(name, spec.get("ingress", []), pods, workers, proxies, named, docs)
    return problems


def peers(name: str, rule: dict, pods: dict[str, dict]) -> Iterator[tuple[str, set[str] | None, str]]:
    """(kind, pods selected or None, problem) for each peer of a rule: 'pods' of this release, 'namespace'."""
    for peer in rule.get("from", []):
        if "ipBlock" in peer:
            yield "ipBlock", None, f"NetworkPolicy {name}: ipBlock peers are not expected"
        elif "namespaceSelector" in peer:
            ok = peer["namespaceSelector"].get("matchLabels") == MONITORING and "podSelector" not in peer
            yield "namespace", None, "" if ok else f"NetworkPolicy {name}: namespace peer {peer} is not monitoring's"
        else:
            sel = peer["podSelector"]
            missing = INSTANCE not in (sel.get("matchLabels") or {})
            yield "pods", selected(sel, pods), (f"NetworkPolicy {name}: peer {sel} must carry {INSTANCE} "
                                                "(other releases' pods match it)") if missing else ""


def worker_rule_problems(name: str, ingress: list[dict], pods: dict[str, dict], workers: set[str],
                         proxies: set[str], named: dict[str, set[int]], docs: list[dict]) -> list[str]:
    problems = []
    multinode = any(d["kind"] == "LeaderWorkerSet" for d in docs)
    admitted: dict[str, set[int]] = {"proxy": set(), "workers": set()}
    side = named.get("nixl", set()) | ucx_port_range(docs) | named.get("params-inbox", set())  # worker to worker
    for rule in ingress:
        if not rule.get("from"):
            problems.append(f"NetworkPolicy {name}: a rule without peers admits every pod of the cluster")
            continue
        ports = port_set(rule.get("ports", []), named)
        for kind, chosen, problem in peers(name, rule, pods):
            problems += [problem] if problem else []
            if kind == "namespace" and port_set(rule.get("ports", []), named) != named.get("http", set()):
                problems.append(f"NetworkPolicy {name}: the monitoring namespace may reach http only")
            if kind != "pods" or chosen is None:
                continue
            if chosen == proxies and proxies:
                admitted["proxy"] |= ports
                if ports != set().union(*(named.get(port, set()) for port in PROXY_PORTS)):
                    problems.append(f"NetworkPolicy {name}: worker ports {sorted(ports)} must be open to this "
                                    "release's proxy only on http, kv-events and params-inbox")
            elif chosen == workers and workers:
                if not rule.get("ports") and not multinode:
                    problems.append(f"NetworkPolicy {name}: workers reach workers on every port (only the "
                                    "side channel, UCX's TCP range and the params inbox are needed)")
                admitted["workers"] |= ports if rule.get("ports") else side  # (every port)
            else:
                problems.append(f"NetworkPolicy {name}: peer selects {sorted(chosen) or 'no pods'}: worker ports "
                                "must be open to this release's proxy only, and workers to each other")
    if not set().union(*(named.get(port, set()) for port in PROXY_PORTS)) <= admitted["proxy"]:
        problems.append(f"NetworkPolicy {name}: the proxy cannot reach the workers' http, kv-events and "
                        "params-inbox ports")
    if not side <= admitted["workers"]:
        problems.append(f"NetworkPolicy {name}: workers cannot reach each other's side channel, UCX and inbox ports "
                        f"{sorted(side - admitted['workers'])[:3]}...")
    return problems


def proxy_rule_problems(name: str, ingress: list[dict], pods: dict[str, dict], workers: set[str],
                        proxies: set[str], named: dict[str, set[int]], docs: list[dict]) -> list[str]:
    http = {p["containerPort"] for w in proxies for c in pods[w]["spec"]["containers"]
            for p in c.get("ports", []) if p["name"] == "http"}
    problems = []
    for rule in ingress:
        ports = port_set(rule.get("ports", []), {"http": http})
        if not rule.get("ports") or ports != http:
            problems.append(f"NetworkPolicy {name}: the proxy takes traffic on http only, not {sorted(ports) or 'all'}")
    return problems
