"""What ships with the service beside its code (security review, Low items): images pinned by
digest, uv pinned, and a `./dev` that never runs sudo without asking."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_image_is_pinned_by_digest() -> None:
    compose = (ROOT / "deploy" / "compose.yaml").read_text()
    images = re.findall(r"^\s*image:\s*(\S+)", compose, re.M)
    assert images, "compose names its images"
    assert [i for i in images if not re.search(r"@sha256:[0-9a-f]{64}$", i)] == []
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=\S+@sha256:[0-9a-f]{64}$", dockerfile, re.M)
    assert re.findall(r"^FROM (\S+)", dockerfile, re.M) == ["${PYTHON_IMAGE}"] * 2
    assert re.search(r'"uv==\d+\.\d+\.\d+"', dockerfile)
    assert re.search(r'"uv==\d+\.\d+\.\d+"', (ROOT / "dev").read_text())


def _fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_dev_asks_before_sudo_and_only_says_how_when_nobody_can_answer(tmp_path: Path) -> None:
    """Not root, no terminal, the JDBC driver missing: ./dev says how to install it and goes
    on; it never runs sudo (the review: it ran `sudo apt-get install` without asking)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name in ("sudo", "apt-get"):
        _fake(bin_dir, name, f'echo "{name} $*" >> {calls}')
    _fake(bin_dir, "id", "echo 1000")
    _fake(bin_dir, "uv", 'case "$1" in run) shift; shift; echo "ran $*";; esac')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "EO_DEV_JDBC_JAR_DEFAULT": str(tmp_path / "missing.jar")}
    env.pop("EO_SPARK_JDBC_JAR", None)
    # a project of its own with the pipeline tool, so a service made without the sample runs it too
    project = tmp_path / "project"
    (project / "tools" / "pipeline").mkdir(parents=True)
    shutil.copy(ROOT / "dev", project / "dev")
    done = subprocess.run(["bash", str(project / "dev"), "pipeline", "--help"], cwd=project,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "sudo apt-get install -y -qq libpostgresql-jdbc-java" in done.stderr
    assert not calls.exists()  # neither sudo nor apt-get ran
    assert "ran eo pipeline --help" in done.stdout


def test_every_rendered_file_is_the_projects_own_file() -> None:
    """copier renders `X.jinja`; where the project has `X` itself, `X.jinja` is a symlink to it,
    so the template stays one working project and the two cannot drift (a copy that lost its
    symlinks rendered a Dockerfile whose whole text was "Dockerfile")."""
    for jinja in ROOT.rglob("*.jinja"):
        parts = jinja.relative_to(ROOT).parts
        if any(part in {".venv", ".tools", ".git", "var"} for part in parts):
            continue
        rendered = jinja.with_suffix("")
        if rendered.exists() and not jinja.is_symlink():
            raise AssertionError(f"{'/'.join(parts)} is a copy, not a symlink to {rendered.name}")
        if jinja.is_symlink():
            assert jinja.resolve() == rendered.resolve(), jinja


def test_every_compose_service_on_the_production_profile_passes_its_settings() -> None:
    """Production refuses guest credentials, passwordless DSNs and plain-HTTP callees unless
    a setting allows each: the compose file, which runs the production profile, must start
    (it did not when the refusals came: orders calls payments over compose's network)."""
    import yaml

    from entrypoints.settings import load_settings

    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    checked = []
    for name, service in compose["services"].items():
        environment = {k: re.sub(r"\$\{(\w+)(:\?[^}]*)?\}", lambda m: f"x-{m.group(1)}", str(v))
                       for k, v in (service.get("environment") or {}).items()}
        if environment.get("EO_PROFILE") != "production" or not service.get("command"):
            continue
        overrides = {k.removeprefix("EO_").lower(): v for k, v in environment.items()
                     if k.startswith("EO_") and "__" not in k}
        callees: dict[str, dict[str, str]] = {}
        for k, v in environment.items():
            if k.startswith("EO_CALLEES__"):
                _, callee, field = k.split("__")
                callees.setdefault(callee.lower(), {})[field.lower()] = v
        load_settings(**overrides, callees=callees)
        checked.append(name)
    assert "migrate" in checked, checked
    if "orders" in compose["services"]:  # the sample's: it calls payments over http://
        assert "orders" in checked, checked


def test_compose_renders_to_valid_yaml_with_and_without_the_sample() -> None:
    """copier renders compose.yaml with its line statements (`#%`): both answers must give
    a file compose can read (a service made without the sample got an indented, unquoted
    `EO_GATEWAYS: ${...: ...}` line that YAML refused)."""
    import jinja2
    import yaml

    source = (ROOT / "deploy" / "compose.yaml").read_text()
    env = jinja2.Environment(line_statement_prefix="#%", keep_trailing_newline=True,
                             autoescape=False)  # YAML, not HTML
    # In a service made from the template, compose.yaml is already rendered: check the one
    # answer it was made with (whether the sample is there).
    answers = (True, False) if "\n#% if" in source else ((ROOT / "domain" / "sample").is_dir(),)
    for keep_sample in answers:
        rendered = env.from_string(source).render(keep_sample=keep_sample,
                                                  service_name="my-service")
        services = yaml.safe_load(rendered)["services"]
        assert ("orders" in services) is keep_sample
        assert services["rabbitmq"]["environment"]["EO_GATEWAYS"]


def test_the_dockerfile_builds_offline_and_says_what_it_is() -> None:
    """The image's findings (issue 26): a `# syntax=` line makes BuildKit fetch a frontend
    (offline builds fail); no health check; no OCI labels; a fixed status port, which a
    second container on the host's network cannot take."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert not re.search(r"^#\s*syntax\s*=", dockerfile, re.M | re.I)
    assert re.search(r"^HEALTHCHECK .*\n\s+CMD \[.*/health", dockerfile, re.M)
    labels = set(re.findall(r"org\.opencontainers\.image\.([\w.]+)=", dockerfile))
    assert {"title", "description", "version", "revision", "licenses", "base.name"} <= labels
    assert "EO_METRICS_PORT=" not in dockerfile
    assert "UV_NATIVE_TLS=1" in dockerfile


def test_ci_builds_and_runs_the_image() -> None:
    assert "./dev image" in (ROOT / ".ci" / "run").read_text()
    assert "image) exec deploy/image/check" in (ROOT / "dev").read_text()
    assert os.access(ROOT / "deploy" / "image" / "check", os.X_OK)
