"""What a reviewer would refuse in a rendered Kubernetes overlay, as a list of problems (tests/deploy).
NetworkPolicies are checked by what they select: k8s_netpol.py.

Pods are checked wherever they are templated: Deployments, and LeaderWorkerSet leader and worker templates
(a CRD: no schema to validate against, so these rules are all that checks it).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.support.k8s_netpol import network_problems

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
WORKER_ROLES = ("prefill", "decode")
INSTANCE = "app.kubernetes.io/instance"
ROLE = "hybrid-pd/role"
RDMA_CAPABILITIES = {"IPC_LOCK"}  # the only one a container may add (components/ipc-lock)
READY_PROBE = ["python3", "-m", "hybrid_pd.prefill.launch.ready"]  # ready.py: the file AND its processes alive
MIN_START_BUDGET_S = 600  # the H100's slowest first start was 356 s for a 1 B model (base/prefill.yaml)


def render(path: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], check=True, capture_output=True, text=True,
                         timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_templates(docs: list[dict]) -> Iterator[tuple[str, dict]]:
    """(where, pod template) for every templated pod."""
    for name, dep in by_kind(docs, "Deployment").items():
        yield name, dep["spec"]["template"]
    for name, lws in by_kind(docs, "LeaderWorkerSet").items():
        lwt = lws["spec"]["leaderWorkerTemplate"]
        yield f"{name}/leader", lwt["leaderTemplate"]
        yield f"{name}/worker", lwt["workerTemplate"]


def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def probe_budget_s(probe: dict) -> int:
    return probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3)


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def container_problems(where: str, c: dict, pod: dict, role: str | None) -> list[str]:
    problems = []
    if ":" not in c["image"] or c["image"].endswith(":latest"):
        problems.append(f"{where}: image {c['image']!r} needs a pinned tag")
    res = c.get("resources", {})
    for kind in ("requests", "limits"):
        if not {"cpu", "memory"} <= set(res.get(kind, {})):
            problems.append(f"{where}: resources.{kind} needs cpu and memory")
    for extended in set(res.get("limits", {})) | set(res.get("requests", {})):
        if ("/" in extended or extended.startswith("hugepages-")) and \
                res.get("limits", {}).get(extended) != res.get("requests", {}).get(extended):
            problems.append(f"{where}: {extended} requests must equal limits")
    sc = c.get("securityContext", {})
    caps = sc.get("capabilities", {})
    if sc.get("allowPrivilegeEscalation") is not False or caps.get("drop") != ["ALL"]:
        problems.append(f"{where}: needs allowPrivilegeEscalation: false and capabilities drop [ALL]")
    added = set(caps.get("add", []))
    if added - RDMA_CAPABILITIES:
        problems.append(f"{where}: adds capabilities {sorted(added - RDMA_CAPABILITIES)}")
    pod_sc = pod["spec"].get("securityContext", {})
    user = sc.get("runAsUser", pod_sc.get("runAsUser"))
    non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    if not added and (non_root is not True or not isinstance(user, int) or user == 0):
        problems.append(f"{where}: must run as a numeric non-root user (runAsNonRoot, runAsUser)")
    if not sc.get("readOnlyRootFilesystem"):
        problems.append(f"{where}: root filesystem must be read-only")
    if sc.get("readOnlyRootFilesystem"):
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        if role in WORKER_ROLES and not {"/tmp", "/home/hybrid-pd"} <= mounts:
            problems.append(f"{where}: a read-only root needs writable /tmp and /home/hybrid-pd")
    return problems


def worker_problems(where: str, c: dict, pod: dict) -> list[str]:
    problems = []
    spec = pod["spec"]
    if "startupProbe" not in c:
        problems.append(f"{where}: a worker needs a startupProbe (model load takes minutes)")
    else:
        budget = probe_budget_s(c["startupProbe"])
        launcher = float(flag_value(c["args"], "--startup-timeout") or 900)
        if budget < MIN_START_BUDGET_S or launcher > budget:
            problems.append(f"{where}: startupProbe budget {budget} s must be >= {MIN_START_BUDGET_S} s and >= "
                            f"the launcher's --startup-timeout {launcher:g} s")
    ready_file = flag_value(c["args"], "--ready-file")
    for probe in ("startupProbe", "readinessProbe"):
        if c.get(probe, {}).get("exec", {}).get("command") != [*READY_PROBE, ready_file]:
            problems.append(f"{where}: {probe} must test the launcher's --ready-file with {' '.join(READY_PROBE)} "
                            "(vLLM's /health turns 200 before the warm-up has compiled the kernels clients would "
                            "wait for; a file alone outlives a killed container)")
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
    if "/dev/shm" not in mounts:
        problems.append(f"{where}: no /dev/shm volume")
    if not any(e.get("name") == "POD_IP" for e in c.get("env", [])):
        problems.append(f"{where}: the NIXL side channel needs POD_IP")
    if spec.get("automountServiceAccountToken") is not False:
        problems.append(f"{where}: workers must not mount a service-account token")
    vllm_args = c["args"][c["args"].index("--") + 1:] if "--" in c["args"] else []
    shutdown = int(flag_value(vllm_args, "--shutdown-timeout") or 0)
    if shutdown <= 0:
        problems.append(f"{where}: no --shutdown-timeout for vLLM (its default, 0, aborts requests in flight)")
    pre_stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    sleep = int(pre_stop[1]) if pre_stop[:1] == ["sleep"] else 0
    if sleep < 10:
        problems.append(f"{where}: needs a preStop sleep >= 10 s (while the endpoint's removal propagates)")
    if spec.get("terminationGracePeriodSeconds", 30) < sleep + shutdown + 5:
        problems.append(f"{where}: terminationGracePeriodSeconds must exceed preStop {sleep} s + "
                        f"--shutdown-timeout {shutdown} s")
    return problems


def proxy_problems(where: str, c: dict, pod: dict) -> list[str]:
    """Liveness on /livez (nothing else: /health is 503 without a decoder and while draining); the grace
    period covers the proxy's own drain (proxy/app.py RunningProxy.drain)."""
    problems = []
    path = c.get("livenessProbe", {}).get("httpGet", {}).get("path")
    if path != "/livez":
        problems.append(f"{where}: liveness on {path!r}: only /livez depends on nothing else (not a liveness probe)")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/health":
        problems.append(f"{where}: readiness must be /health (503 without a decoder and while draining)")
    delay = float(flag_value(c["args"], "--drain-delay-s") or 5)
    timeout = float(flag_value(c["args"], "--drain-timeout-s") or 60)
    if pod["spec"].get("terminationGracePeriodSeconds", 30) < delay + timeout + 5:
        problems.append(f"{where}: terminationGracePeriodSeconds must exceed --drain-delay-s {delay:g} s + "
                        f"--drain-timeout-s {timeout:g} s")
    return problems


def pod_problems(where: str, pod: dict) -> list[str]:
    labels = pod["metadata"].get("labels", {})
    role = labels.get(ROLE)
    problems = [] if role else [f"{where}: pods carry no {ROLE} label"]
    if INSTANCE not in labels:
        problems.append(f"{where}: pods carry no {INSTANCE} label")
    for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        problems += container_problems(f"{where}/{c['name']}", c, pod, role)
    containers = pod["spec"].get("initContainers", []) + pod["spec"]["containers"]
    if any("nvidia.com/gpu" in c.get("resources", {}).get("limits", {}) for c in containers):
        for c in containers:  # Guaranteed QoS: every container, init containers included
            res = c.get("resources", {})
            if any(res.get("requests", {}).get(k) != res.get("limits", {}).get(k) for k in ("cpu", "memory")):
                problems.append(f"{where}/{c['name']}: a GPU pod's cpu and memory requests must equal limits "
                                "(Guaranteed QoS)")
    main = pod["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        if probe not in main:
            problems.append(f"{where}/{main['name']}: no {probe}")
    if role == "proxy":
        problems += proxy_problems(f"{where}/{main['name']}", main, pod)
    if role in WORKER_ROLES:
        problems += worker_problems(f"{where}/{main['name']}", main, pod)
    return problems


def release_problems(docs: list[dict]) -> list[str]:
    """Selectors of one release select only its own pods; PDBs do not block drains; RBAC is what discovery uses."""
    problems = []
    pods = dict(pod_templates(docs))
    for name, dep in by_kind(docs, "Deployment").items():
        sel = dep["spec"]["selector"]["matchLabels"]
        if INSTANCE not in sel or not selects(sel, dep["spec"]["template"]["metadata"]["labels"]):
            problems.append(f"{name}: selector must carry {INSTANCE} and match its pods")
        role = sel.get(ROLE)
        if role in WORKER_ROLES:
            rolling = dep["spec"].get("strategy", {}).get("rollingUpdate", {})
            if str(rolling.get("maxSurge", "25%")) not in ("0", "0%") or rolling.get("maxUnavailable") != 1:
                problems.append(f"{name}: rollouts need maxSurge 0 and maxUnavailable 1 (a surge pod waits for "
                                "a spare GPU)")
            start = probe_budget_s(dep["spec"]["template"]["spec"]["containers"][0].get("startupProbe", {}))
            if dep["spec"].get("progressDeadlineSeconds", 600) <= start:
                problems.append(f"{name}: progressDeadlineSeconds must exceed the start budget ({start} s)")
    for name, pdb in by_kind(docs, "PodDisruptionBudget").items():
        sel = pdb["spec"]["selector"]["matchLabels"]
        chosen = [w for w, p in pods.items() if selects(sel, p["metadata"]["labels"])]
        if "minAvailable" in pdb["spec"] or pdb["spec"].get("maxUnavailable", 0) < 1:
            problems.append(f"{name}: use maxUnavailable >= 1 (minAvailable blocks drains at one replica)")
        if INSTANCE not in sel or not chosen:
            problems.append(f"{name}: must carry {INSTANCE} and select pods")
    for where, pod in pods.items():
        if not any(selects(p["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
                   for p in by_kind(docs, "PodDisruptionBudget").values()):
            problems.append(f"{where}: no PodDisruptionBudget selects its pods")
    services = by_kind(docs, "Service")
    for role in WORKER_ROLES:
        svc = [s for s in services.values() if s["metadata"].get("labels", {}).get(ROLE) == role]
        if not svc or {"http", "kv-events"} - {p["name"] for p in svc[0]["spec"]["ports"]}:
            problems.append(f"no {role} Service with ports named http and kv-events (proxy discovery)")
    for name, svc in services.items():
        if INSTANCE not in svc["spec"]["selector"] or INSTANCE not in svc["metadata"].get("labels", {}):
            problems.append(f"Service {name}: selector and labels must carry {INSTANCE}")
    rules = [(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(sorted(r["verbs"])))
             for role in by_kind(docs, "Role").values() for r in role["rules"]]
    if rules != [(("discovery.k8s.io",), ("endpointslices",), ("list", "watch"))]:
        problems.append(f"Role grants {rules}: discovery lists and watches endpointslices, nothing else")
    return problems


def custom_resource_problems(docs: list[dict]) -> list[str]:
    """ScaledObjects, ServiceMonitors: no schema here, so check what would silently do nothing."""
    problems = []
    deployments = by_kind(docs, "Deployment")
    instances = {p["metadata"]["labels"].get(INSTANCE) for _, p in pod_templates(docs)}
    for name, so in by_kind(docs, "ScaledObject").items():
        spec = so["spec"]
        if spec["scaleTargetRef"]["name"] not in deployments:
            problems.append(f"ScaledObject {name}: scales no Deployment of this overlay")
        namespace = so["metadata"].get("namespace")
        for trigger in spec["triggers"]:
            query = trigger["metadata"].get("query", "")
            if trigger["type"] != "prometheus":
                continue
            for selector in re.findall(r"\{[^}]*\}", query) or [""]:  # every series it sums
                if not {f'app_kubernetes_io_instance="{i}"' for i in instances} \
                        & set(re.findall(r'app_kubernetes_io_instance="[^"]*"', selector)):
                    problems.append(f"ScaledObject {name}: query {query!r} names another release")
                if namespace is None or f'namespace="{namespace}"' not in selector:
                    problems.append(f"ScaledObject {name}: query {query!r} must name its namespace "
                                    f"({namespace or 'none set'}): another release elsewhere exports the same series")
        if "cooldownPeriod" in spec and spec.get("minReplicaCount", 0) >= 1:
            problems.append(f"ScaledObject {name}: cooldownPeriod applies only to scaling to and from zero")
        behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior", {})
        if spec["scaleTargetRef"]["name"].endswith(WORKER_ROLES):
            up = behavior.get("scaleUp", {}).get("policies", [])
            if not up or any(p["type"] != "Pods" or p["value"] / p["periodSeconds"] > 1 / 120 for p in up):
                problems.append(f"ScaledObject {name}: scale-up must add at most one worker per 2 min (a worker "
                                "takes minutes to start; the HPA would add one per sync meanwhile)")
            if behavior.get("scaleDown", {}).get("stabilizationWindowSeconds", 300) < 600:
                problems.append(f"ScaledObject {name}: scale-down needs a stabilization window >= 10 min")
    for name, sm in by_kind(docs, "ServiceMonitor").items():
        sel = sm["spec"]["selector"]["matchLabels"]
        chosen = [s for s in by_kind(docs, "Service").values() if selects(sel, s["metadata"].get("labels", {}))]
        if len(chosen) != len(by_kind(docs, "Service")):
            problems.append(f"ServiceMonitor {name}: selects {len(chosen)} of the release's Services")
    return problems


def policy_problems(docs: list[dict]) -> list[str]:
    problems = []
    for where, pod in pod_templates(docs):
        problems += pod_problems(where, pod)
    return (problems + release_problems(docs) + network_problems(docs, dict(pod_templates(docs)))
            + custom_resource_problems(docs))
