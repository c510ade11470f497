"""`eo`'s tools (`demo`, `chaos`, `bench`, `pipeline`, ...): listed by `eo --help` when this
installation has them, imported only when invoked (their dependency groups are not the
service's), from the `tools` package."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from entrypoints.commands import fail

#: The tools' commands: name -> (module, attribute: a Typer app, short help). Listed by
#: `eo --help` without importing them.
TOOLS: dict[str, tuple[str, str, str]] = {
    "demo": ("tools.demo.cli", "demo_app",
             "The sample end to end with duplicates and faults, checked by its oracle."),
    "chaos": ("tools.chaos.cli", "chaos_app",
              "Randomized fault campaign with real processes on your service's workload "
              "(--messages, --workload): fence scenarios for every endpoint, then random "
              "runs, within --duration."),
    "bench": ("tools.bench.cli", "bench_app",
              "What exactly-once costs: the paths side by side on PostgreSQL and RabbitMQ."),
    "pipeline": ("tools.pipeline.cli", "pipeline_app",
                 "The data pipeline on Spark for every endpoint: ingest into a gateway, the "
                 "exactly-once audit, the orphan sweep."),
    "local-services": ("tools.local_services", "local_services_app",
                       "The local profile's shared services: an S3 API that outlives one "
                       "process, the settings to export."),
    "manifests": ("tools.manifests", "manifests_app",
                  "Generate the Kubernetes objects of the registry's endpoints (deploy/k8s)."),
}
#: The dependency group each tool needs beyond the service's own.
TOOL_GROUPS = {"demo": "demo", "chaos": "dev", "bench": "dev", "pipeline": "pipeline",
               "local-services": "dev", "manifests": "dev"}


class LazyTool(TyperCommand):
    """A tool's command, imported when invoked (its short help is known without)."""

    def __init__(self, name: str, module: str, attribute: str, short_help: str) -> None:
        super().__init__(name, help=short_help, short_help=short_help)
        self._module, self._attribute = module, attribute

    # the click types of these overrides are typer's vendored click, which it does not
    # export: `Any` here, as in the methods they override
    def _load(self) -> Any:
        try:
            app = getattr(importlib.import_module(self._module), self._attribute)
        except ImportError as exc:
            group = TOOL_GROUPS.get(self.name or "", "dev")
            raise fail(f"`eo {self.name}` needs the `{group}` dependency group ({exc}): "
                       f"`uv sync --group {group}`, or run it through ./dev", 2) from exc
        command = typer.main.get_command(app)
        command.name = self.name
        return command

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        return self._load().make_context(info_name, args, parent=parent, **extra)


class WithTools(TyperGroup):
    """`eo`'s commands plus the tools present in this installation (lazily loaded)."""

    def _tools(self) -> Iterator[str]:
        for name, (module, _, _) in TOOLS.items():
            try:
                found = importlib.util.find_spec(module) is not None
            except ImportError:  # the tools package itself is absent
                found = False
            if found:
                yield name

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *self._tools()]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in TOOLS and cmd_name in set(self._tools()):
            module, attribute, short_help = TOOLS[cmd_name]
            command = LazyTool(cmd_name, module, attribute, short_help)
        return command
