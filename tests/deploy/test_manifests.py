"""Kubernetes manifests: every overlay renders with `kubectl kustomize`, validates offline against the
Kubernetes schemas (custom resources: structure checks instead), passes our policy checks
(tests/support/k8s_policy.py), and its container arguments parse with our own CLIs (so the manifests cannot
drift from the launchers and the proxy). A second release in the same namespace stays apart from the first."""

from __future__ import annotations

import argparse
import copy
import os
import re
from pathlib import Path

import kubernetes_validate
import pytest

from hybrid_pd.prefill.launch.worker import add_worker_args, config_from_args
from hybrid_pd.proxy.config.sources import load_config
from tests.support.k8s_policy import (
    INSTANCE,
    K8S,
    ROLE,
    WORKER_ROLES,
    by_kind,
    flag_value,
    pod_templates,
    policy_problems,
    render,
    selects,
)

OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
K8S_VERSION = "1.32.0"
CUSTOM_KINDS = {"LeaderWorkerSet", "ScaledObject", "ServiceMonitor"}  # CRDs: no schema in kubernetes_validate


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(K8S / "overlays" / request.param)


def test_overlays_exist():
    assert set(OVERLAYS) == {"cpu-dev", "gpu", "gpu-rdma-ucx", "gpu-efa", "gpu-4p4d", "gpu-autoscale",
                             "gpu-multinode-tp"}


def test_every_object_validates_against_the_kubernetes_schema(rendered):
    _, docs = rendered
    assert {d["kind"] for d in docs} >= {"Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding",
                                          "PodDisruptionBudget", "NetworkPolicy"}
    for doc in docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_policy_checks_pass(rendered):
    assert policy_problems(rendered[1]) == []


def test_policy_checks_catch_a_broken_manifest(rendered):
    docs = copy.deepcopy(rendered[1])
    proxy = by_kind(docs, "Deployment")["hybrid-pd-proxy"]["spec"]["template"]
    proxy["spec"]["containers"][0]["livenessProbe"]["httpGet"]["path"] = "/health"
    proxy["spec"]["securityContext"]["runAsUser"] = 0
    proxy["spec"]["terminationGracePeriodSeconds"] = 30
    by_kind(docs, "PodDisruptionBudget")["hybrid-pd-proxy"]["spec"] = {
        "minAvailable": 1, "selector": {"matchLabels": {ROLE: "proxy"}}}
    by_kind(docs, "Role")["hybrid-pd-proxy-discovery"]["rules"][0]["verbs"].append("get")
    by_kind(docs, "NetworkPolicy")["hybrid-pd-workers"]["spec"]["ingress"][0]["from"] = [{"podSelector": {}}]
    problems = policy_problems(docs)
    assert any("not a liveness probe" in p for p in problems)
    assert any("numeric non-root user" in p for p in problems)
    assert any("must exceed --drain-delay-s 5 s + --drain-timeout-s 60 s" in p for p in problems)
    assert any("minAvailable blocks drains" in p for p in problems)
    assert any("must carry app.kubernetes.io/instance" in p for p in problems)
    assert any("Role grants" in p for p in problems)
    assert any("open to this release's proxy only" in p for p in problems)


def test_policy_checks_ask_what_each_network_policy_selects(rendered):
    """The hole the check once missed: a worker policy that names a label the pod templates lack (it named
    app.kubernetes.io/name, which base/kustomization.yaml adds to metadata only, like part-of) selects no pod,
    so every worker port is open to the cluster."""
    docs = copy.deepcopy(rendered[1])
    workers = by_kind(docs, "NetworkPolicy")["hybrid-pd-workers"]["spec"]
    workers["podSelector"]["matchLabels"]["app.kubernetes.io/part-of"] = "hybrid-pd"
    workers["ingress"][1]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/part-of"] = "hybrid-pd"
    problems = policy_problems(docs)
    names = sorted(w for w, p in pod_templates(docs) if p["metadata"]["labels"][ROLE] in WORKER_ROLES)
    assert f"NetworkPolicy hybrid-pd-workers selects no pods, not {names}" in problems
    assert {f"{n}: no NetworkPolicy selects these pods (open to every pod in the cluster)" for n in names} \
        <= set(problems)
    assert any("workers cannot reach each other's side channel" in p for p in problems)
    by_kind(docs, "NetworkPolicy")["hybrid-pd-proxy"]["spec"]["podSelector"] = {
        "matchLabels": {INSTANCE: "hybrid-pd"}}  # the proxy's policy takes the workers as well
    problems = policy_problems(docs)
    assert any(p.startswith("NetworkPolicy hybrid-pd-proxy selects [") and "prefill" in p for p in problems)


def test_policy_checks_refuse_worker_ports_open_beyond_the_release(rendered):
    docs = copy.deepcopy(rendered[1])
    workers = by_kind(docs, "NetworkPolicy")["hybrid-pd-workers"]["spec"]
    del workers["ingress"][1]["from"][0]["podSelector"]["matchLabels"][INSTANCE]  # any release's workers
    workers["ingress"][0]["ports"].append({"port": 22})
    workers["ingress"].append({"ports": [{"port": "http"}]})  # from anywhere
    problems = policy_problems(docs)
    assert any("must carry app.kubernetes.io/instance (other releases' pods match it)" in p for p in problems)
    assert any("only on http, kv-events and params-inbox" in p for p in problems)
    assert any("a rule without peers admits every pod" in p for p in problems)


def test_policy_checks_require_the_prefillers_way_to_a_decoders_params_inbox(rendered):
    """Early decode's direct delivery: a prefiller pushes its params to the decoder's inbox itself
    (connector/direct_delivery.py); a worker policy without that port is caught."""
    docs = copy.deepcopy(rendered[1])
    workers = by_kind(docs, "NetworkPolicy")["hybrid-pd-workers"]["spec"]
    assert not any("inbox ports" in p for p in policy_problems(docs))
    rule = workers["ingress"][1]
    if "ports" not in rule:  # multi-node TP (components/lws): workers reach each other on every port
        return
    rule["ports"] = [p for p in rule["ports"] if p.get("port") != "params-inbox"]
    assert any("workers cannot reach each other's side channel, UCX and inbox ports" in p
               for p in policy_problems(docs))


def test_policy_checks_catch_a_broken_worker(rendered):
    docs = copy.deepcopy(rendered[1])
    where, pod = next((w, p) for w, p in pod_templates(docs) if p["metadata"]["labels"][ROLE] == "decode")
    c = pod["spec"]["containers"][0]
    del c["lifecycle"]
    c["args"] = [a for a in c["args"] if a != "--shutdown-timeout"]
    c["image"] = c["image"].rsplit(":", 1)[0] + ":latest"
    c["resources"]["limits"]["nvidia.com/gpu"] = "2"
    c["resources"]["requests"]["nvidia.com/gpu"] = "1"
    c["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    pod["spec"]["automountServiceAccountToken"] = True
    c["readinessProbe"] = {"httpGet": {"path": "/health", "port": "http"}}
    c["resources"]["requests"]["cpu"] = "1"
    if where in by_kind(docs, "Deployment"):
        by_kind(docs, "Deployment")[where]["spec"]["strategy"] = {}  # the default: 25% surge
    problems = policy_problems(docs)
    if "nvidia.com/gpu" in c["resources"]["limits"]:
        assert any("requests must equal limits (Guaranteed QoS)" in p for p in problems)
    if where in by_kind(docs, "Deployment"):
        assert any("maxSurge 0 and maxUnavailable 1" in p for p in problems)
    for wanted in ("preStop sleep", "no --shutdown-timeout", "needs a pinned tag", "requests must equal limits",
                   "adds capabilities ['SYS_ADMIN']", "service-account token", "readinessProbe must test"):
        assert any(wanted in p for p in problems), wanted


def test_policy_checks_catch_autoscaling_that_does_not_do_what_it_says():
    docs = render(K8S / "overlays" / "gpu-autoscale")
    objs = by_kind(docs, "ScaledObject")
    assert set(objs) == {"hybrid-pd-prefill", "hybrid-pd-decode", "hybrid-pd-proxy"}
    decode = objs["hybrid-pd-decode"]["spec"]
    decode["cooldownPeriod"] = 600  # what it was: nothing at minReplicaCount 1
    del decode["advanced"]  # the HPA's defaults: 4 pods or 100% per 15 s up, 5 min down
    trigger = objs["hybrid-pd-prefill"]["spec"]["triggers"][0]["metadata"]
    trigger["query"] = trigger["query"].replace(', namespace="hybrid-pd"', "")
    problems = policy_problems(docs)
    assert any("hybrid-pd-decode: cooldownPeriod applies only" in p for p in problems)
    assert any("hybrid-pd-decode: scale-up must add at most one worker" in p for p in problems)
    assert any("hybrid-pd-decode: scale-down needs a stabilization window" in p for p in problems)
    assert any("hybrid-pd-prefill: query" in p and "must name its namespace (hybrid-pd)" in p for p in problems)


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


LWS_ENV = {"LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0", "LWS_LEADER_ADDRESS": "10.0.0.1"}


def test_worker_arguments_are_accepted_by_the_launcher(rendered, monkeypatch):
    overlay, docs = rendered
    env = by_kind(docs, "ConfigMap")["hybrid-pd-config"]["data"] | LWS_ENV
    monkeypatch.setenv("POD_IP", "10.0.0.7")
    workers = [(w, p) for w, p in pod_templates(docs) if p["metadata"]["labels"][ROLE] in WORKER_ROLES]
    assert len(workers) in (2, 4)  # a Deployment per role, or a LeaderWorkerSet's two templates per role
    for _where, pod in workers:
        role = pod["metadata"]["labels"][ROLE]
        c = pod["spec"]["containers"][0]
        assert c["command"] == ["hybrid-pd", role]
        ap = argparse.ArgumentParser()
        add_worker_args(ap, role)
        cfg = config_from_args(ap.parse_args(expand(c["args"], env)), role, check_ports_free=False)
        assert cfg.env({})["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.7"
        assert cfg.device == ("cpu" if overlay == "cpu-dev" else "gpu")
        assert int(flag_value(list(cfg.extra_vllm_args), "--shutdown-timeout")) > 0
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert (ports["http"], ports["nixl"], ports["kv-events"]) == (
            cfg.port, cfg.side_channel_port, cfg.kv_events_port)
        # a decoder's params inbox (early decode): bound by its connector where the Service and the proxy look
        assert ports.get("params-inbox") == (cfg.params_port if role == "decode" else None)
        assert cfg.env({}).get("HYBRID_PD_PARAMS_PORT") == (str(cfg.params_port) if role == "decode" else None)


GDN_MODELS = re.compile(r"(?i)qwen3[-.]?(next|5)")  # the hybrids with GDN linear attention


def test_engine_flags_fit_the_overlays_model(rendered):
    """A GDN prefill backend passed to a model without GDN layers (Mamba-2) configures nothing and tells a
    reader something untrue about the deployment."""
    _, docs = rendered
    model = by_kind(docs, "ConfigMap")["hybrid-pd-config"]["data"]["MODEL"]
    for where, pod in pod_templates(docs):
        args = " ".join(pod["spec"]["containers"][0].get("args", []))
        if "gdn_prefill_backend" in args:
            assert GDN_MODELS.search(model), f"{where}: gdn_prefill_backend for {model}, which has no GDN layers"


def test_proxy_discovers_only_its_own_release(rendered, monkeypatch):
    _, docs = rendered
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # what the kubelet sets in every pod
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    pod = by_kind(docs, "Deployment")["hybrid-pd-proxy"]["spec"]["template"]
    c = pod["spec"]["containers"][0]
    downward = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert downward["INSTANCE"] == f"metadata.labels['{INSTANCE}']"
    instance = pod["metadata"]["labels"][INSTANCE]
    cfg = load_config(expand(c["args"], {"POD_NAMESPACE": "serving", "INSTANCE": instance}), env={})
    assert cfg.discovery == "k8s" and cfg.k8s.namespace == "serving"
    services = by_kind(docs, "Service").values()  # the EndpointSlice controller copies a Service's labels
    for role, selector in (("prefill", cfg.k8s.prefill_selector), ("decode", cfg.k8s.decode_selector)):
        wanted = dict(kv.split("=") for kv in selector.split(","))
        found = [s for s in services if selects(wanted, s["metadata"]["labels"])]
        assert [s["metadata"]["labels"][ROLE] for s in found] == [role]
        assert found[0]["spec"]["selector"][INSTANCE] == instance


def test_a_second_release_in_the_namespace_neither_adopts_nor_discovers_the_first(tmp_path: Path):
    other = tmp_path / "team-b"
    other.mkdir()
    base = os.path.relpath(K8S / "overlays" / "cpu-dev", other)  # kustomize refuses absolute paths
    (other / "kustomization.yaml").write_text(
        f"resources: [{base}]\nnamePrefix: team-b-\n"
        f"labels:\n  - pairs: {{{INSTANCE}: team-b}}\n    includeSelectors: true\n")
    first, second = render(K8S / "overlays" / "cpu-dev"), render(other)
    assert policy_problems(second) == []
    for a, b in ((first, second), (second, first)):
        pods_b = [p["metadata"]["labels"] for _, p in pod_templates(b)]
        for kind, path in (("Deployment", ("spec", "selector", "matchLabels")), ("Service", ("spec", "selector")),
                           ("PodDisruptionBudget", ("spec", "selector", "matchLabels"))):
            for name, obj in by_kind(a, kind).items():
                sel = obj
                for key in path:
                    sel = sel[key]
                assert not any(selects(sel, labels) for labels in pods_b), f"{kind} {name} selects the other's pods"
    proxy_b = by_kind(second, "Deployment")["team-b-hybrid-pd-proxy"]["spec"]["template"]["metadata"]["labels"]
    assert proxy_b[INSTANCE] == "team-b"


def claims(docs: list[dict]) -> dict[str, set[str]]:
    """Each templated pod's PersistentVolumeClaims by name."""
    return {where: {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"].get("volumes", [])
                    if "persistentVolumeClaim" in v} for where, pod in pod_templates(docs)}


def test_every_claim_a_pod_mounts_is_rendered_and_the_proxy_reads_the_model_volume(rendered):
    """The proxy mounts the workers' model volume read-only (its tokenizer's files, HF_HOME on it, offline)."""
    _, docs = rendered
    pvcs = set(by_kind(docs, "PersistentVolumeClaim"))
    for where, names in claims(docs).items():
        assert names <= pvcs, f"{where} mounts {names - pvcs}, not rendered"
    proxy = by_kind(docs, "Deployment")["hybrid-pd-proxy"]["spec"]["template"]["spec"]
    c = proxy["containers"][0]
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == "/models/hf"


def test_weights_on_each_nodes_disk_leave_no_pod_on_a_claim(tmp_path: Path):
    """components/model-cache-hostpath deletes the model PVC: every pod that mounted it, the proxy included, reads
    the node's folder instead (a pod left on a deleted claim never schedules)."""
    here = tmp_path / "hostpath"
    here.mkdir()
    base = os.path.relpath(K8S / "overlays" / "gpu", here)
    component = os.path.relpath(K8S / "components" / "model-cache-hostpath", here)
    (here / "kustomization.yaml").write_text(f"resources: [{base}]\ncomponents: [{component}]\n")
    docs = render(here)
    assert not by_kind(docs, "PersistentVolumeClaim")
    assert all(not names for names in claims(docs).values()), claims(docs)
    proxy = by_kind(docs, "Deployment")["hybrid-pd-proxy"]["spec"]["template"]["spec"]
    assert [v["hostPath"]["path"] for v in proxy["volumes"] if v["name"] == "models"] == ["/var/lib/hybrid-pd/models"]
