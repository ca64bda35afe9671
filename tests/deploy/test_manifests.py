"""Kubernetes manifests: every overlay renders with `kubectl kustomize`, validates offline against the
Kubernetes schemas, passes our policy checks, and its container arguments parse with our own CLIs (so the
manifests cannot drift from the launchers and the proxy)."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from hybrid_pd.prefill.cli import add_worker_args, config_from_args
from hybrid_pd.proxy.config_sources import load_config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
K8S_VERSION = "1.32.0"
WORKER_ROLES = ("prefill", "decode")


def render(overlay: str) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def policy_problems(docs: list[dict]) -> list[str]:
    """What a reviewer would refuse in a rendered overlay."""
    problems = []
    pdb_selectors = [d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] == "PodDisruptionBudget"]
    for name, dep in by_kind(docs, "Deployment").items():
        pod = dep["spec"]["template"]
        role = pod["metadata"]["labels"].get("hybrid-pd/role")
        if role is None:
            problems.append(f"{name}: pods carry no hybrid-pd/role label")
        if not any(sel.items() <= pod["metadata"]["labels"].items() for sel in pdb_selectors):
            problems.append(f"{name}: no PodDisruptionBudget selects its pods")
        for c in pod["spec"]["containers"]:
            where = f"{name}/{c['name']}"
            if ":" not in c["image"] or c["image"].endswith(":latest"):
                problems.append(f"{where}: image {c['image']!r} needs a pinned tag")
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in c:
                    problems.append(f"{where}: no {probe}")
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                if not {"cpu", "memory"} <= set(res.get(kind, {})):
                    problems.append(f"{where}: resources.{kind} needs cpu and memory")
            for extended in set(res.get("limits", {})) | set(res.get("requests", {})):
                if "/" in extended and res.get("limits", {}).get(extended) != res.get("requests", {}).get(extended):
                    problems.append(f"{where}: {extended} requests must equal limits")
            if role in WORKER_ROLES:
                if "startupProbe" not in c:
                    problems.append(f"{where}: a worker needs a startupProbe (model load takes minutes)")
                mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
                if "/dev/shm" not in mounts:
                    problems.append(f"{where}: no /dev/shm volume")
                if not any(e.get("name") == "POD_IP" for e in c.get("env", [])):
                    problems.append(f"{where}: the NIXL side channel needs POD_IP")
        if role in WORKER_ROLES and not pod["spec"].get("terminationGracePeriodSeconds"):
            problems.append(f"{name}: no graceful shutdown period")
    services = by_kind(docs, "Service")
    for role in WORKER_ROLES:
        svc = [s for s in services.values() if s["metadata"].get("labels", {}).get("hybrid-pd/role") == role]
        if not svc or {"http", "kv-events"} - {p["name"] for p in svc[0]["spec"]["ports"]}:
            problems.append(f"no {role} Service with ports named http and kv-events (proxy discovery)")
    return problems


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


def test_overlays_exist():
    assert set(OVERLAYS) == {"gpu", "cpu-dev"}


def test_every_object_validates_against_the_kubernetes_schema(rendered):
    _, docs = rendered
    assert {d["kind"] for d in docs} >= {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role",
                                          "RoleBinding", "PodDisruptionBudget"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_policy_checks_pass(rendered):
    assert policy_problems(rendered[1]) == []


def test_policy_checks_catch_a_broken_manifest(rendered):
    docs = copy.deepcopy(rendered[1])
    decode = by_kind(docs, "Deployment")["hybrid-pd-decode"]["spec"]["template"]["spec"]["containers"][0]
    del decode["livenessProbe"]
    decode["image"] = "ghcr.io/hybrid-pd/hybrid-pd:latest"
    decode["resources"]["limits"]["nvidia.com/gpu"] = "2"
    decode["resources"]["requests"]["nvidia.com/gpu"] = "1"
    problems = policy_problems(docs)
    assert "hybrid-pd-decode/decode: no livenessProbe" in problems
    assert any("needs a pinned tag" in p for p in problems)
    assert any("nvidia.com/gpu requests must equal limits" in p for p in problems)


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def test_worker_arguments_are_accepted_by_the_launcher(rendered, monkeypatch):
    import argparse

    overlay, docs = rendered
    env = by_kind(docs, "ConfigMap")["hybrid-pd-config"]["data"]
    monkeypatch.setenv("POD_IP", "10.0.0.7")
    for role in WORKER_ROLES:
        c = by_kind(docs, "Deployment")[f"hybrid-pd-{role}"]["spec"]["template"]["spec"]["containers"][0]
        assert c["command"] == ["hybrid-pd", role]
        ap = argparse.ArgumentParser()
        add_worker_args(ap, role)
        args = ap.parse_args(expand(c["args"], env))
        cfg = config_from_args(args, role, check_ports_free=False)
        assert cfg.env({})["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.7"
        assert cfg.device == ("gpu" if overlay == "gpu" else "cpu")
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert (ports["http"], ports["nixl"], ports["kv-events"]) == (
            cfg.port, cfg.side_channel_port, cfg.kv_events_port)


def test_proxy_arguments_are_accepted_by_the_proxy(rendered, monkeypatch):
    _, docs = rendered
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # what the kubelet sets in every pod
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    c = by_kind(docs, "Deployment")["hybrid-pd-proxy"]["spec"]["template"]["spec"]["containers"][0]
    cfg = load_config(expand(c["args"], {"POD_NAMESPACE": "serving"}), env={})
    assert cfg.discovery == "k8s" and cfg.k8s.namespace == "serving"
    workers = {s["metadata"]["labels"]["hybrid-pd/role"] for s in by_kind(docs, "Service").values()}
    assert {cfg.k8s.prefill_selector.split("=")[1], cfg.k8s.decode_selector.split("=")[1]} <= workers
