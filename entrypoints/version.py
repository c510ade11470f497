"""The versions a process reports: the template's release it carries (`TEMPLATE_VERSION`)
and the service's own (its distribution's version, from its `pyproject.toml`). `eo --version`
prints both, the processes' start lines (`consumer.started`, `callee.serving`) carry them as
`template_version` and `service_version`, and the image's labels name them.

`TEMPLATE_VERSION` is the template's semantic version, set by its release commit and tagged
`v<version>` (docs/upgrading.md, "Releasing the template"); between releases it is the next
release's with the pre-release suffix `-dev` (a service made from an untagged commit says
so). `copier update` brings a new one into a service with the framework it names. A
service's own version is its team's (`version` in its pyproject)."""

from __future__ import annotations

import functools
from importlib import metadata

#: the template's release this framework is (docs/changelog.md's newest entry; `-dev` while
#: that entry is unreleased)
TEMPLATE_VERSION = "0.3.0-dev"


@functools.cache
def service_distribution() -> str | None:
    """The installed distribution whose `eo` command this framework is (the service's
    project, named by its pyproject; the template's own when run from it; editable or not),
    or None when none is installed (run from a checkout without `uv sync`)."""
    for entry in metadata.entry_points(group="console_scripts", name="eo"):
        if entry.value.startswith("entrypoints.cli") and entry.dist is not None:
            return str(entry.dist.name)
    return None


def service_version() -> str:
    """The service's version (its distribution's), `unknown` when it is not installed."""
    name = service_distribution()
    if name is None:
        return "unknown"
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "unknown"


def versions() -> dict[str, str]:
    """`{"template_version": ..., "service_version": ...}`: the start lines' fields."""
    return {"template_version": TEMPLATE_VERSION, "service_version": service_version()}


def banner() -> str:
    """`eo --version`'s line: `<service> <its version> (exactly-once-template <version>)`."""
    return (f"{service_distribution() or 'eo'} {service_version()} "
            f"(exactly-once-template {TEMPLATE_VERSION})")
