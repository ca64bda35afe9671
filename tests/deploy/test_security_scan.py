"""Every overlay, rendered, through an offline security scanner (checkov, its own venv: deploy/dev.sh), against
a recorded baseline of accepted findings and why (checkov_baseline.yaml). Schemas are test_manifests.py's
(kubernetes-validate); what the scanner cannot know (selectors against pod templates, probes, drains) is
tests/support/k8s_policy.py's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.k8s_policy import K8S

BASELINE = Path(__file__).with_name("checkov_baseline.yaml")
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())


def checkov() -> str:
    found = os.environ.get("HYBRID_PD_CHECKOV") or shutil.which("checkov")
    if not found or not Path(found).exists():
        pytest.fail("checkov not found: run the tests through deploy/dev.sh (it installs the scanner pinned in "
                    "deploy/k8s/scan-requirements.txt into its own venv), or set HYBRID_PD_CHECKOV")
    return found


def scan(folder: Path) -> set[tuple[str, str, str]]:
    """(check id, overlay, Kind/name) of every failed check on the rendered overlays in `folder`."""
    out = subprocess.run([checkov(), "-d", str(folder), "--framework", "kubernetes", "--quiet", "--compact",
                          "--skip-download", "-o", "json"], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip(), out.stderr[-2000:]
    report = json.loads(out.stdout)
    report = report[0] if isinstance(report, list) else report
    assert report["summary"]["parsing_errors"] == 0, report["summary"]
    findings = set()
    for f in report["results"]["failed_checks"]:
        kind, _namespace, name = f["resource"].split(".", 2)
        findings.add((f["check_id"], Path(f["file_path"]).stem, f"{kind}/{name}"))
    return findings


def accepted(finding: tuple[str, str, str], baseline: dict) -> bool:
    check, overlay, resource = finding
    entry = baseline.get(check)
    return bool(entry) and resource in entry["resources"] and overlay in entry.get("overlays", OVERLAYS)


@pytest.fixture(scope="module")
def findings(tmp_path_factory) -> set[tuple[str, str, str]]:
    folder = tmp_path_factory.mktemp("rendered")
    for overlay in OVERLAYS:
        rendered = subprocess.run(["kubectl", "kustomize", str(K8S / "overlays" / overlay)], check=True,
                                  capture_output=True, text=True, timeout=60).stdout
        (folder / f"{overlay}.yaml").write_text(rendered)
    return scan(folder)


def test_every_finding_is_fixed_or_accepted_with_a_reason(findings):
    baseline = yaml.safe_load(BASELINE.read_text())
    assert all(entry["why"].strip() for entry in baseline.values())
    assert sorted(f for f in findings if not accepted(f, baseline)) == []


def test_the_baseline_accepts_nothing_that_no_longer_happens(findings):
    baseline = yaml.safe_load(BASELINE.read_text())
    stale = []
    for check, entry in baseline.items():
        for resource in entry["resources"]:
            if not any(c == check and r == resource for c, _, r in findings):
                stale.append(f"{check} {resource}")
        for overlay in entry.get("overlays", []):
            if not any(c == check and o == overlay for c, o, _ in findings):
                stale.append(f"{check} {overlay}")
    assert stale == []


def test_the_scanner_finds_what_it_is_trusted_to_find(tmp_path):
    """A worker without a NetworkPolicy and a privileged, root container with a writable root: findings the
    baseline does not accept."""
    docs = [d for d in yaml.safe_load_all(subprocess.run(
        ["kubectl", "kustomize", str(K8S / "overlays" / "gpu")], check=True, capture_output=True, text=True,
        timeout=60).stdout) if d and d["kind"] != "NetworkPolicy"]
    decode = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "hybrid-pd-decode")
    decode["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    (tmp_path / "gpu.yaml").write_text(yaml.safe_dump_all(docs))
    new = {(c, r) for c, _, r in scan(tmp_path) if not accepted((c, "gpu", r), yaml.safe_load(BASELINE.read_text()))}
    assert any(c == "CKV2_K8S_6" and "hybrid-pd-decode" in r for c, r in new)  # no NetworkPolicy selects it
    assert ("CKV_K8S_16", "Deployment/hybrid-pd-decode") in new  # privileged
