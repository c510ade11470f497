"""The rule every migration after release 0.1.0 follows (docs/upgrading.md, "expand, then
contract"): its `upgrade()` only expands the schema, so the previous release's workers keep
working on it during a rolling upgrade, unless the module says otherwise:
`contracts = "<release>"` (it removes what no worker since that release uses) or
`breaking = "<why>"` (its release says "stop everything" in the changelog)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path
from types import ModuleType

VERSIONS = Path(__file__).resolve().parents[2] / "adapters" / "postgres" / "migrations" / \
    "versions"
#: the newest revision of release 0.1.0: the rule holds for those after it
LAST_UNRULED = "0013"
#: SQL (and alembic operations) that take away something the previous release may use
CONTRACTING = re.compile(
    r"\bDROP\s+(TABLE|COLUMN|CONSTRAINT|INDEX|TRIGGER|FUNCTION|TYPE|VIEW)\b|\bRENAME\b|"
    r"\bALTER\s+COLUMN\s+\w+\s+(SET\s+NOT\s+NULL|TYPE|SET\s+DATA\s+TYPE)\b|"
    r"\bop\.(drop_\w+|rename_table|alter_column)\(", re.IGNORECASE)


def contracting(source: str) -> list[str]:
    """The contracting statements of a migration module's `upgrade()` (its text), each the
    match found: empty for a migration that only expands."""
    tree = ast.parse(source)
    upgrade = next((node for node in tree.body
                    if isinstance(node, ast.FunctionDef) and node.name == "upgrade"), None)
    if upgrade is None:
        return []
    body = ast.get_source_segment(source, upgrade) or ""
    return [m.group(0) for m in CONTRACTING.finditer(body)]


def _module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checker_finds_a_contraction_and_passes_an_expansion() -> None:
    # 0010 re-keys two tables (a breaking release's, before the rule); 0013 only adds
    assert contracting((VERSIONS / "0010_producers.py").read_text())
    assert contracting((VERSIONS / "0013_dead_letter_per_message.py").read_text()) == []


def test_every_migration_after_the_first_release_only_expands_or_says_why() -> None:
    """None yet after 0013: the first one that contracts without saying so fails here."""
    for path in sorted(VERSIONS.glob("[0-9]*.py")):
        if path.name[:4] <= LAST_UNRULED:
            continue
        found = contracting(path.read_text())
        module = _module(path)
        if found:
            assert getattr(module, "contracts", None) or getattr(module, "breaking", None), (
                f"{path.name} contracts the schema ({found}) without `contracts = "
                "\"<release>\"` or `breaking = \"<why>\"` (docs/upgrading.md: expand, then "
                "contract)")
