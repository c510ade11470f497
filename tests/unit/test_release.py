"""The template's release as the project states it: `TEMPLATE_VERSION` is the changelog's
newest entry, and `eo --version` prints it with the service's own version."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from entrypoints.cli import app
from entrypoints.version import TEMPLATE_VERSION, service_version

ROOT = Path(__file__).resolve().parents[2]
SEMVER = re.compile(r"^\d+\.\d+\.\d+(-dev)?$")


def test_the_template_version_is_the_changelogs_newest_release() -> None:
    """Released: the newest entry is dated and is the version; between releases it is the
    next one, "(unreleased)", and the version is it with `-dev`."""
    assert SEMVER.match(TEMPLATE_VERSION), TEMPLATE_VERSION
    headings = re.findall(r"^## (\S+) \(([^)]*)\)$",
                          (ROOT / "docs" / "changelog.md").read_text(), re.M)
    assert headings, "docs/changelog.md has no release"
    version, when = headings[0]
    assert version == TEMPLATE_VERSION.removesuffix("-dev"), headings[:3]
    if TEMPLATE_VERSION.endswith("-dev"):
        assert when == "unreleased", headings[:3]
    else:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", when), headings[:3]
    for older, dated in headings[1:]:  # every older entry was released
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", dated), (older, dated)


def test_eo_version_prints_the_service_and_the_template_release() -> None:
    shown = CliRunner().invoke(app, ["--version"])
    assert shown.exit_code == 0, shown.output
    assert shown.output.strip().endswith(
        f" {service_version()} (exactly-once-template {TEMPLATE_VERSION})"), shown.output
    assert service_version() != "unknown"  # installed by ./dev: the project's pyproject
