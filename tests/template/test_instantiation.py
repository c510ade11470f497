"""What keeps the template a template: `copier copy` of this repository without the sample
(`./dev new`) makes a service that passes its own checks (`./dev test`'s lint, types, layer
contracts and docs, every test module collected under the new name, and the team's own
tests), takes a new endpoint by its domain package and its registry alone, and runs that
endpoint on the embedded profile, with the test API, on PostgreSQL and RabbitMQ, and in its
own chaos campaign; and `copier update` later brings a change of the template into it
without losing the service's own code. The framework's tests are the template's, unchanged
by copier: the suite runs them here, not again in the copy; the fence's mutations are caught
by the campaign on the same endpoints in the checkout (test_fence_on_the_fixture.py).

Slow (a new environment): `pytest -m template` runs it alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from adapters.postgres.admin import drop_database, with_database
from adapters.s3.moto_server import MotoServer
from tests.support.processes import delete_vhost, private_vhost, this_run
from tests.support.services import discover
from tests.template.fixture_service import campaign_lines, ship

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("fixture")
PUBLISH = ROOT / "docs" / "examples" / "publish.py"
pytestmark = [pytest.mark.template, pytest.mark.slow(minutes=6)]


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 1200,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `args` in `cwd`; on failure, fail with its output."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {done.returncode}\n--- stdout\n"
                    f"{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-6000:]}")
    return done


def lock(project: Path) -> None:
    """Lock `project` as its ./dev does: from uv's cache, else from the index."""
    if run(["uv", "lock", "--offline", "--quiet"], project, env=clean_env(),
           check=False).returncode:
        run(["uv", "lock", "--quiet"], project, env=clean_env())


def copier(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The copier of this environment (the dev group)."""
    return run([str(Path(sys.executable).with_name("copier")), *args], cwd)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without its virtual environment and `EO_` settings (the
    new project has its own), the same uv on the PATH, plus `extra`. The new project's
    environment is not compiled to bytecode (./dev's UV_COMPILE_BYTECODE=0: 40 s of CPU
    each; its processes compile what they import)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EO_", "VIRTUAL_ENV", "UV_PROJECT", "PYTHONPATH"))}
    env["UV_COMPILE_BYTECODE"] = "0"
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # what they compile is kept for the next
    uv = shutil.which("uv")
    if uv is not None:
        env["PATH"] = f"{Path(uv).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def add_endpoints(project: Path) -> dict[str, int]:
    """What a user does to add the fixture's two endpoints: its domain package, two
    registrations and their imports, and a test of them. Returns the lines added per
    file."""
    package = project / "domain" / "parcels"
    shutil.copytree(FIXTURE / "parcels", package)
    registry = project / "service" / "registry.py"
    text = registry.read_text()
    before = text.count("\n")
    text = text.replace(
        "from application.registry import Registration, Registry, ThirdPartyApi\n",
        "from application.registry import Registration, Registry, Role, ThirdPartyApi\n"
        "from domain.parcels import PARCELS, TRACKING\n")
    text = text.replace(
        "ENDPOINTS: tuple[Registration, ...] = (\n",
        "ENDPOINTS: tuple[Registration, ...] = (\n"
        "    Registration(PARCELS, role=Role.GATEWAY, blobs=True),\n"
        "    Registration(TRACKING, apis=(\"pickups\",)),\n")
    text = text.replace(
        "APIS: tuple[ThirdPartyApi, ...] = (\n",
        "APIS: tuple[ThirdPartyApi, ...] = (\n"
        "    ThirdPartyApi(\"pickups\"),\n")
    registry.write_text(text)
    # the team's own tests of their endpoints, written with the framework's test API
    shutil.copy(FIXTURE / "test_parcels.py", project / "tests" / "test_parcels.py")
    return {"domain/parcels/__init__.py": (package / "__init__.py").read_text().count("\n"),
            "service/registry.py": text.count("\n") - before,
            "tests/test_parcels.py": (FIXTURE / "test_parcels.py").read_text().count("\n")}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A service made from the template without the sample, with the fixture's endpoints
    added, committed in a git repository of its own (as a team would keep it)."""
    made = tmp_path_factory.mktemp("made")
    project = made / "parcel-service"
    # the README's first command, from another directory (the name is relative to it)
    run([str(ROOT / "dev"), "new", "parcel-service", "--defaults", "--data",
         "service_name=parcel-service", "--data", "keep_sample=false"], made, env=clean_env())
    added = add_endpoints(project)
    print(f"\nadding the fixture's endpoints took: {added}")
    # as the README says after registering endpoints: their Kubernetes objects (generated)
    run(["./dev", "manifests"], project, env=clean_env())
    run(["git", "init", "-q"], project)
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm",
         "made from the template"], project)
    return project


def test_the_new_service_has_no_sample_and_passes_its_own_checks(service: Path) -> None:
    assert not (service / "domain" / "sample").exists()
    assert not (service / "tools" / "demo").exists()
    assert not (service / "tests" / "sample").exists()
    pyproject = (service / "pyproject.toml").read_text()
    assert 'name = "parcel-service"' in pyproject
    assert "#%" not in pyproject
    project = tomllib.loads(pyproject)
    wanted = [*project["project"]["dependencies"],
              *(str(d) for group in project["dependency-groups"].values() for d in group)]
    # the sample's TPC-H data and its PDF invoices are gone; Spark stays (eo pipeline)
    assert not [d for d in wanted if d.startswith(("duckdb-extension-tpch", "fpdf2"))]
    assert any(str(d).startswith("pyspark") for d in project["dependency-groups"]["pipeline"])
    # the sample's groups are gone; `bench` and `pipeline` are the framework's tools
    assert set(project["dependency-groups"]) == {"dev", "bench", "pipeline"}
    assert (service / "tools" / "pipeline" / "audit.py").exists()
    assert not (service / "tools" / "tpch").exists()
    started = time.monotonic()
    # `./dev test` with its static checks (ruff, mypy, import contracts, the docs built
    # strictly) and pytest collecting every test module under the new name, which imports
    # every module of the framework they test; the framework's tests themselves are the
    # template's own, unchanged by copier, and ran on this code in the same suite (the
    # service's renamed processes run in test_the_new_endpoint_runs_on_postgresql_and_...)
    collected = run(["./dev", "test", "--collect-only", "-q", "-p", "no:cacheprovider",
                     "-n", "0"], service, env=clean_env())
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert "tests/test_parcels.py::test_faults_change_nothing[2]" in ids
    assert {i.split("::")[0].split("/")[1] for i in ids} >= {
        "unit", "contract", "integration", "tools", "test_parcels.py"}, sorted(ids)[:20]
    # the team's own tests of its endpoints (the test API, with faults) pass
    done = run(["uv", "run", "--frozen", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                "-n", "0", "tests/test_parcels.py"], service, env=clean_env())
    assert "PASSED tests/test_parcels.py::test_faults_change_nothing[2]" in done.stdout
    print(f"\nthe new service's checks, {len(ids)} tests collected, its own tests: "
          f"{time.monotonic() - started:.0f} s\n{done.stdout[-1500:]}")


def test_the_new_endpoint_runs_embedded(service: Path, tmp_path: Path) -> None:
    lines = [ship("p-1", 1200, str(uuid.uuid4())),
             ship("p-2", 800, (twice := str(uuid.uuid4())), "paris"),
             ship("p-2", 800, twice, "paris"),  # a producer's retry: the same message ID
             ship("p-3", -5, str(uuid.uuid4()))]  # refused: dead-lettered with its reason
    messages = tmp_path / "messages.jsonl"
    messages.write_text("\n".join(lines) + "\n")
    done = run(["./dev", "embedded", str(messages), "--format", "json"], service,
               env=clean_env(), check=False)
    assert done.returncode == 1, done.stderr  # the refused parcel is a dead letter
    report = json.loads(done.stdout)
    print(f"\n./dev embedded: settled {report['settled']}, dead letters "
          f"{report['dead_letters']}, at rest {report['at_rest']}")
    # four deliveries: two parcels processed, the retried copy a duplicate, p-3 refused
    assert report["settled"]["parcels"] == {"processed": 2, "duplicate": 1, "retried": 0,
                                            "dead_lettered": 1, "unsettled": 0}
    # the outbox re-publishes its stored output for the retried copy: tracking drops it;
    # each parcel's pickup is booked (the pickups API's answer: a follow-up)
    assert report["settled"]["tracking"]["processed"] == 4
    assert set(report["states"]["parcels"]) == {"p-1", "p-2"}
    assert {d: s["parcels"] for d, s in report["states"]["tracking"].items()} == {
        "lyon": ["p-1"], "paris": ["p-2"]}
    assert [len(s["pickups"]) for s in report["states"]["tracking"].values()] == [1, 1]
    [letter] = report["dead_letters"]["parcels"]
    assert "weight must be positive" in letter["reason"]
    assert len(report["blobs"]) == 2
    assert not any(report["at_rest"].values())


def test_the_new_endpoint_runs_on_postgresql_and_rabbitmq_and_passes_the_audit(
        service: Path) -> None:
    """The fixture's endpoints as processes on PostgreSQL, RabbitMQ and an S3 API, then `eo
    pipeline audit` of what they left (the protocol's findings for every endpoint, with the
    prefix the states name: no sample, no declaration): clean, exit 0."""
    services = discover()
    database = this_run("eo_template")
    moto = MotoServer()
    env = clean_env(EO_PROFILE="local",
                    EO_DATABASE_DSN=with_database(services.postgres_dsn, database),
                    EO_AMQP_URL=private_vhost(services.amqp_url, this_run("eo-template", "-")),
                    EO_BLOB_STORE="s3", EO_S3_ENDPOINT_URL=moto.start(),
                    EO_S3_BUCKET="parcel-labels", EO_S3_ACCESS_KEY="local",
                    EO_S3_SECRET_KEY="local", AWS_EC2_METADATA_DISABLED="true",
                    EO_SWEEP_INTERVAL_S="0.5")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        run(["./dev", "migrate"], service, env=env)
        logs = {name: (service / "var" / f"{name}.log") for name in ("parcels", "tracking")}
        logs["parcels"].parent.mkdir(parents=True, exist_ok=True)
        for name, log in logs.items():  # default status ports: the two must not collide
            with log.open("wb") as out:
                procs.append(subprocess.Popen(["./dev", "consume", "--endpoint", name],
                                              cwd=service, env=env, stdout=out,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        while not all('"consumer.started"' in log.read_text(errors="replace")
                      for log in logs.values()):
            assert all(p.poll() is None for p in procs), [f.read_text() for f in logs.values()]
            assert time.monotonic() < deadline, "the consumers did not start"
            time.sleep(0.2)
        twice = str(uuid.uuid4())
        for parcel, grams, message_id in (("p-1", 500, str(uuid.uuid4())),
                                          ("p-2", 700, twice), ("p-2", 700, twice)):
            run([sys.executable, str(PUBLISH), env["EO_AMQP_URL"], "parcels", "Ship",
                 json.dumps({"parcel": parcel, "grams": grams, "destination": "lyon"}),
                 message_id], ROOT)
        states = asyncio.run(_tracked(env["EO_DATABASE_DSN"], want=2, timeout_s=60))
        assert states == {"lyon": ["p-1", "p-2"]} or states == {"lyon": ["p-2", "p-1"]}
        urls = {json.loads(line)["status_url"] for log in logs.values()
                for line in log.read_text().splitlines()
                if '"consumer.started"' in line}
        print(f"\nlocal profile: tracking {states}; status ports {sorted(urls)}")
        assert len(urls) == 2
        stop(procs)
        audit = run(["./dev", "pipeline", "audit", "--output", "var/audit", "--older-than", "0",
                     "--partitions", "2"], service, env=env, check=False)
        print(f"\n./dev pipeline audit: {audit.stdout[-2500:]}")
        assert audit.returncode == 0, audit.stdout[-4000:] + audit.stderr[-4000:]
        summary = json.loads((service / "var" / "audit" / "summary.json").read_text())
        assert summary["violations"] == 0
        assert summary["counts"] == dict.fromkeys(
            ("orphans", "missing_objects", "stale_tokens", "dead_letter_tokens",
             "stale_transactions"), 0)
        assert summary["prefixes"] == ["labels"]  # what the parcels' states name
        assert summary["dead_letters"] == {"parcels": 0, "tracking": 0}
        listing = next(s for s in summary["stages"] if s["name"] == "list the bucket")
        assert listing["rows"] == 2  # p-1's and p-2's labels, each named by its state
    finally:
        stop(procs)
        asyncio.run(drop_database(env["EO_DATABASE_DSN"]))
        delete_vhost(env["EO_AMQP_URL"])
        moto.stop()
        services.close()
    assert all(p.returncode == 0 for p in procs), [p.returncode for p in procs]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process still running, then wait (SIGKILL after 30 s)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def chaos_messages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The new service's campaign workload (`campaign_lines`): 16 parcels to two
    destinations, a producer's retry of one, and one the service refuses."""
    messages = tmp_path_factory.mktemp("chaos") / "messages.jsonl"
    messages.write_text("\n".join(campaign_lines()) + "\n")
    return messages


def chaos(service: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`./dev chaos *args` in `service` on the local PostgreSQL and RabbitMQ; its JSON
    report."""
    services = discover()
    report = service / "var" / f"chaos-{uuid.uuid4().hex[:8]}.json"
    report.parent.mkdir(exist_ok=True)
    try:
        done = run(["./dev", "chaos", *args, "--report", str(report)], service,
                   env=clean_env(EO_DATABASE_DSN=services.postgres_dsn,
                                 EO_AMQP_URL=services.amqp_url), check=False)
    finally:
        services.close()
    print(f"\n./dev chaos {' '.join(args)}: {done.stdout[-2500:]}")
    result = json.loads(report.read_text()) if report.exists() else {}
    report.unlink(missing_ok=True)
    return done, result


def test_the_new_service_passes_a_chaos_campaign(service: Path, chaos_messages: Path) -> None:
    """`./dev chaos` on the new service's own messages (no sample there), a workload of the
    shape a team's has (`campaign_lines`: a handler's rejection, a malformed message,
    outcomes that depend on the order, an endpoint fed only by another that calls a
    third-party API): the fence scenarios on every endpoint, then one run of real processes
    with faults, each checked against the fault-free embedded runs: 0 violations."""
    done, result = chaos(service, "--messages", str(chaos_messages), "--seed", "1",
                         "--duration", "600", "--runs", "1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert result["violations"] == []
    *fenced, one = result["per_run"]
    assert [r["scenario"] for r in fenced] == [
        f"fence ({half}) on {endpoint}" for endpoint in ("parcels", "tracking")
        for half in ("attempt guard", "compare-and-clear")]
    assert result["fence_skipped"] == {}
    for scenario in fenced:
        assert scenario["commits"] == scenario["expected_commits"] > 0
        assert scenario["faults"]["process exit (crash failpoint)"] == 2
    assert one["scenario"] == ""
    # p-x (its weight), the malformed one and one of the three nice parcels (its capacity),
    # at least: an insurance that came before its parcel is refused too
    assert one["dead_letters"] >= 3
    assert one["kept"]["tokens kept by dead letters"] == 1  # tracking's rejection's
    assert one["blobs"] == 19  # a label per parcel shipped, each named by a parcel's state
    assert result["order_independent"] is False  # partitions compared; no domain check here


async def _tracked(dsn: str, want: int, timeout_s: float) -> dict[str, list[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            rows = await conn.fetch("SELECT partition_key, state FROM eo_transaction_record "
                                    "WHERE endpoint = 'tracking' AND state IS NOT NULL")
            states = {r["partition_key"]: json.loads(r["state"])["parcels"] for r in rows}
            if sum(len(v) for v in states.values()) >= want or time.monotonic() > deadline:
                return states
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


def test_copier_update_brings_a_template_fix_into_the_service(service: Path,
                                                               tmp_path: Path) -> None:
    """A change of the template after the service was made (here: a line of the protocol's
    documentation, the registry's example and a new dependency, locked) reaches the service
    with `copier update` without a conflict; the service's own endpoints, registry and lock
    (relocked under its name by its first ./dev) stay as the team left them, and the lock
    takes the new dependency when relocked."""
    template = tmp_path / "template"
    run(["git", "clone", "-q", str(ROOT), str(template)], tmp_path)
    if run(["git", "status", "--porcelain"], ROOT).stdout.strip():
        # the working tree has changes not committed yet: the template is what is checked out
        run(["rsync", "-a", "--delete", "--exclude", ".git", "--exclude", ".venv",
             "--exclude", ".tools", f"{ROOT}/", f"{template}/"], tmp_path)
    commit = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam"]
    run(["git", "add", "-A"], template)
    run([*commit, "the template as it is"], template, check=False)
    made = tmp_path / "made"
    copier("copy", "--defaults", "--vcs-ref", "HEAD", "--data", "service_name=updated",
           "--data", "keep_sample=false", str(template), str(made))
    added = add_endpoints(made)
    # as the service's first ./dev does: its lock under its own name
    lock(made)
    run(["git", "init", "-q"], made)
    run(["git", "add", "-A"], made)
    run([*commit, "made"], made)
    fix = "\n<!-- a protocol fix of the template -->\n"
    with (template / "docs" / "protocol.md").open("a") as doc:
        doc.write(fix)
    # the template's own lines of the registry change next to where the team added theirs
    # (as `APIS` and `apis=APIS` once did: a conflict for every service that had endpoints)
    example = template / "service" / "registry.py"
    example.write_text(example.read_text().replace(
        "    # your endpoints, e.g.", "    # your endpoints (a template's new example), e.g."))
    # and a new dependency of the framework (one the lock holds already), locked
    pyproject = template / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(
        '    "httpx>=0.27",\n', '    "httpx>=0.27",\n    "idna>=3",\n', 1))
    lock(template)
    run([*commit, "a protocol fix"], template)
    copier("update", "--defaults", "--vcs-ref", "HEAD", cwd=made)
    assert (made / "docs" / "protocol.md").read_text().endswith(fix)
    conflicted = run(["git", "diff", "--name-only", "--diff-filter=U"], made).stdout.split()
    marked = run(["git", "grep", "-l", "-e", "^<<<<<<< ", "--", "."], made, check=False)
    assert conflicted == [], conflicted
    assert marked.stdout == "", marked.stdout
    registry = (made / "service" / "registry.py").read_text()
    assert "a template's new example" not in registry  # the team's file, as they left it
    assert "Registration(PARCELS, role=Role.GATEWAY, blobs=True)" in registry
    assert (made / "domain" / "parcels" / "__init__.py").exists()
    assert added["service/registry.py"] == 4  # an import, two registrations, an API
    # the service's lock, as its team left it, relocked for the template's new dependency
    assert '"idna>=3"' in (made / "pyproject.toml").read_text()
    lock(made)
    locked = (made / "uv.lock").read_text()
    root = locked[locked.index('[[package]]\nname = "updated"'):]
    assert '{ name = "idna" }' in root[:root.index("\n[[package]]")]
