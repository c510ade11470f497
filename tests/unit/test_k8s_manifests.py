"""The Kubernetes manifests (deploy/k8s, issue 26): each overlay rendered by `kubectl kustomize`,
every object validated against the Kubernetes API's schemas (kubernetes-validate, strict:
an unknown field fails), and what the schemas cannot tell: one Deployment per endpoint of the
registry running the right command, probes on the status port, a termination grace, a
non-root read-only pod, a PodDisruptionBudget selecting it, the migration Job, and KEDA's
ScaledObjects aimed at existing Deployments and queues. The generated files must be the
registry's (`./dev manifests`)."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from application.registry import Role
from service.registry import REGISTRY
from tools.manifests import TERMINATION_GRACE_S, rendered

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (ROOT / "deploy" / "k8s" / "overlays").iterdir())
#: the oldest Kubernetes minor version the manifests must be valid for
KUBERNETES = "1.29"

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None,
                                   reason="kubectl renders the overlays (kubectl kustomize)")


def render(overlay: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize` makes of `overlay`."""
    done = subprocess.run(["kubectl", "kustomize", str(ROOT / "deploy" / "k8s" / "overlays" /
                                                       overlay)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def schema_errors(obj: dict[str, Any]) -> str | None:
    """Why `obj` is not valid for the API's schema (strict), or None."""
    try:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{obj['kind']} {obj['metadata'].get('name')}: {exc}"
    return None


def test_the_generated_files_are_the_registry_s() -> None:
    for path, text in rendered(REGISTRY).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)}: run ./dev manifests"


def test_the_schema_validator_has_teeth() -> None:
    """A misspelt field and a wrong type, each refused (the check below could not fail
    otherwise)."""
    job = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "migrate-job.yaml").read_text())
    assert schema_errors(job) is None
    typo = copy.deepcopy(job)
    container = typo["spec"]["template"]["spec"]["containers"][0]
    container["securityContxt"] = container.pop("securityContext")
    assert schema_errors(typo)
    wrong = copy.deepcopy(job)
    wrong["spec"]["backoffLimit"] = "four"
    assert schema_errors(wrong)


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_of_the_overlay_is_valid_for_the_kubernetes_api(overlay: str) -> None:
    objects = render(overlay)
    core = [o for o in objects if not o["apiVersion"].startswith("keda.sh/")]
    assert core
    assert [e for e in map(schema_errors, core) if e] == []


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_endpoint_runs_as_its_process_with_probes_a_grace_and_a_budget(
        overlay: str) -> None:
    objects = render(overlay)
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for o in objects:
        by_kind.setdefault(o["kind"], {})[o["metadata"]["name"]] = o
    deployments = by_kind.get("Deployment", {})
    assert set(deployments) == {f"eo-{r.name}" for r in REGISTRY}
    for r in REGISTRY:
        d = deployments[f"eo-{r.name}"]
        pod = d["spec"]["template"]["spec"]
        [c] = pod["containers"]
        callee = r.role is Role.CALLEE
        assert c["args"] == ["serve" if callee else "consume", "--endpoint", r.name]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert c["readinessProbe"]["httpGet"]["path"] == ("/health" if callee else "/ready")
        assert c["livenessProbe"]["httpGet"]["path"] == "/health"
        assert c["readinessProbe"]["httpGet"]["port"] in ports
        assert pod["terminationGracePeriodSeconds"] >= TERMINATION_GRACE_S
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert "limits" in c["resources"]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        for name in r.callees:  # reaches its callee's Service
            service = by_kind["Service"][f"eo-{name}"]
            url = env[f"EO_CALLEES__{name.upper()}__URL"]
            assert url == f"http://eo-{name}:{service['spec']['ports'][0]['port']}"
        secrets = {s["secretRef"]["name"] for s in c["envFrom"] if "secretRef" in s}
        assert secrets == {"eo-secrets"} or any(n.startswith("eo-secrets-") for n in secrets)
        pdb = by_kind["PodDisruptionBudget"][f"eo-{r.name}"]
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [job] = by_kind["Job"].values()
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]


@needs_kubectl
def test_keda_scales_each_consuming_deployment_on_its_queue() -> None:
    objects = render("production")
    deployments = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}
    auth = {o["metadata"]["name"] for o in objects if o["kind"] == "TriggerAuthentication"}
    scaled = [o for o in objects if o["kind"] == "ScaledObject"]
    assert {o["spec"]["scaleTargetRef"]["name"] for o in scaled} == {
        f"eo-{n}" for n in REGISTRY.consuming()}
    for o in scaled:
        assert o["spec"]["scaleTargetRef"]["name"] in deployments
        [trigger] = o["spec"]["triggers"]
        assert trigger["type"] == "rabbitmq"
        assert f"eo-{trigger['metadata']['queueName']}" == o["spec"]["scaleTargetRef"]["name"]
        assert trigger["authenticationRef"]["name"] in auth
