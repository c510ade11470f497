"""`eo manifests [--check]`: the Kubernetes objects of the registry's endpoints, generated into
`deploy/k8s/base/endpoints.yaml` and `deploy/k8s/components/keda/scaledobjects.yaml`
(docs/operations.md, Kubernetes). Run it after adding or removing an endpoint; `--check`
exits 1 when a file is not what the registry gives (a unit test runs it).

Per endpoint: a Deployment (consumers and gateways run `consume`, HTTP callees `serve`), a
PodDisruptionBudget, and for a callee a Service its callers reach. Every pod runs the image
as uid 10001 on a read-only root file system without privileges, takes its settings from the
ConfigMap `eo-settings` and the Secret `eo-secrets`, is ready on `/ready` (a callee: on
`/health`) and alive on `/health`, and has `TERMINATION_GRACE_S` to finish its in-flight
deliveries after SIGTERM. KEDA's optional ScaledObjects scale each consumer on its work
queue's length.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from application.registry import Registration, Registry, Role

manifests_app = typer.Typer(add_completion=False)

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS_FILE = ROOT / "deploy" / "k8s" / "base" / "endpoints.yaml"
KEDA_FILE = ROOT / "deploy" / "k8s" / "components" / "keda" / "scaledobjects.yaml"
#: the image's name in the manifests; an overlay's `images:` sets the real one
IMAGE = "eo-service"
#: the status port a consumer takes in a pod of its own (the first free one from 9464)
STATUS_PORT = 9464
#: the port an HTTP callee listens on in its pod, and its Service's
CALLEE_PORT = 8470
#: seconds between SIGTERM and SIGKILL: the consumer stops taking deliveries, finishes those
#: in flight (a batch's statements and publications take well under a second; a handler's HTTP
#: call at most `EO_HTTP_TIMEOUT_S` per try) and closes its connections
TERMINATION_GRACE_S = 60
#: how long start-up may wait for PostgreSQL and RabbitMQ before the process exits 69
#: (`EO_BROKER_GIVE_UP_S`, 120 s by default): the startup probe allows as much
STARTUP_S = 150
HEADER = ("# Generated from the registry by `./dev manifests` (tools/manifests.py): do not edit;\n"
          "# run it again after adding or removing an endpoint.\n")


def _labels(endpoint: str) -> dict[str, str]:
    """An endpoint's labels (the base's kustomization adds the service's name to all): a new
    mapping per use, as PyYAML writes one shared between objects as an anchor."""
    return {"app.kubernetes.io/component": endpoint}


def _callee_url(callee: str) -> str:
    return f"http://eo-{callee}:{CALLEE_PORT}"


def _container(r: Registration) -> dict[str, Any]:
    callee = r.role is Role.CALLEE
    port = {"name": "http", "containerPort": CALLEE_PORT} if callee else {
        "name": "status", "containerPort": STATUS_PORT}
    env: list[dict[str, Any]] = []
    if callee:
        prefix = f"EO_CALLEES__{r.name.upper()}__"
        env += [{"name": f"{prefix}HOST", "value": "0.0.0.0"},  # in its own pod
                {"name": f"{prefix}PORT", "value": str(CALLEE_PORT)},
                {"name": "EO_HEALTH_PORT", "value": str(CALLEE_PORT)}]
    for name in r.callees:
        env.append({"name": f"EO_CALLEES__{name.upper()}__URL", "value": _callee_url(name)})
    probe_port = port["name"]
    return {
        "name": r.name,
        "image": IMAGE,
        "args": ["serve" if callee else "consume", "--endpoint", r.name],
        "envFrom": [{"configMapRef": {"name": "eo-settings"}},
                    {"secretRef": {"name": "eo-secrets"}}],
        **({"env": env} if env else {}),
        "ports": [port],
        "startupProbe": {"httpGet": {"path": "/health", "port": probe_port},
                         "periodSeconds": 5, "failureThreshold": STARTUP_S // 5},
        "readinessProbe": {"httpGet": {"path": "/health" if callee else "/ready",
                                       "port": probe_port},
                           "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {"httpGet": {"path": "/health", "port": probe_port},
                          "periodSeconds": 20, "failureThreshold": 3},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                      "limits": {"memory": "512Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # an emptyDir
    }


def endpoint_objects(registry: Registry) -> list[dict[str, Any]]:
    """The Deployment, PodDisruptionBudget and (for a callee) Service of each endpoint of
    `registry`, in its order."""
    objects: list[dict[str, Any]] = []
    for r in registry:
        name = f"eo-{r.name}"
        objects.append({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "labels": _labels(r.name)},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": _labels(r.name)},
                "template": {
                    "metadata": {"labels": _labels(r.name)},
                    "spec": {
                        "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                            "runAsGroup": 10001,
                                            "seccompProfile": {"type": "RuntimeDefault"}},
                        "containers": [_container(r)],
                        "volumes": [{"name": "tmp", "emptyDir": {}}],
                    },
                },
            },
        })
        objects.append({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "labels": _labels(r.name)},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _labels(r.name)}},
        })
        if r.role is Role.CALLEE:
            objects.append({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "labels": _labels(r.name)},
                "spec": {"selector": _labels(r.name),
                         "ports": [{"name": "http", "port": CALLEE_PORT,
                                    "targetPort": "http"}]},
            })
    return objects


def scaled_objects(registry: Registry) -> list[dict[str, Any]]:
    """KEDA ScaledObjects (keda.sh/v1alpha1): each consuming endpoint's Deployment scaled on
    its work queue's length (`rabbitmq` trigger, the AMQP URL from the Secret through the
    TriggerAuthentication `eo-rabbitmq`)."""
    return [{
        "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
        "metadata": {"name": f"eo-{name}",
                     "labels": _labels(name)},
        "spec": {
            "scaleTargetRef": {"name": f"eo-{name}"},
            "minReplicaCount": 1, "maxReplicaCount": 8,
            "triggers": [{"type": "rabbitmq",
                          "metadata": {"protocol": "amqp", "queueName": name,
                                       "mode": "QueueLength", "value": "500"},
                          "authenticationRef": {"name": "eo-rabbitmq"}}],
        },
    } for name in registry.consuming()]


def _document(objects: list[dict[str, Any]]) -> str:
    if not objects:
        return HEADER
    text = str(yaml.safe_dump_all(objects, sort_keys=False, default_flow_style=False))
    if (ROOT / "copier.yml").exists():  # the template itself: its endpoints are the sample's,
        # which a service made without the sample does not have (`#%` lines: copier's)
        text = f"#% if keep_sample\n{text}#% endif\n"
    return HEADER + text


def rendered(registry: Registry) -> dict[Path, str]:
    """{file: its text} of the generated manifests of `registry`."""
    return {ENDPOINTS_FILE: _document(endpoint_objects(registry)),
            KEDA_FILE: _document(scaled_objects(registry))}


@manifests_app.command()
def manifests(check: Annotated[bool, typer.Option(
        help="exit 1 when a generated file is not the registry's, writing nothing")] = False,
              ) -> None:
    """Generate the Kubernetes objects of the registry's endpoints (deploy/k8s/)."""
    from entrypoints.service_spec import resolve_service
    from entrypoints.settings import load_settings

    registry = resolve_service(load_settings()).registry
    stale = []
    for path, text in rendered(registry).items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if check and stale:
        typer.echo(f"not the registry's: {', '.join(map(str, stale))}: run ./dev manifests",
                   err=True)
        raise typer.Exit(1)
    typer.echo("written: " + ", ".join(map(str, stale)) if stale else "up to date", err=True)
