"""The mutation suite's list (tests/mutation/mutations.py) stays true to the code and to the
protocol: every invariant and every failure-table row has a mutation, every mutation's text
is in its file exactly once, and its killers name tests that exist. The mutations themselves
run in CI (`./dev mutate`), not here."""

from __future__ import annotations

import re
from pathlib import Path

from tests.mutation.mutations import INVARIANTS, MUTATIONS, ROWS
from tests.mutation.run import apply

ROOT = Path(__file__).resolve().parents[2]


def test_every_invariant_and_every_failure_table_row_has_a_mutation() -> None:
    assert set(INVARIANTS) <= {i for m in MUTATIONS for i in m.invariants}
    assert set(ROWS) <= {r for m in MUTATIONS for r in m.rows}
    assert {i for m in MUTATIONS for i in m.invariants} <= set(INVARIANTS)
    assert {r for m in MUTATIONS for r in m.rows} <= set(ROWS)
    assert len({m.name for m in MUTATIONS}) == len(MUTATIONS)


def test_every_mutation_applies_once_and_changes_its_file(tmp_path: Path) -> None:
    for m in MUTATIONS:
        copy = tmp_path / m.name
        for file, _before, _after in m.edits:
            (copy / file).parent.mkdir(parents=True, exist_ok=True)
            (copy / file).write_text((ROOT / file).read_text())
        apply(m, copy)  # ValueError when a `before` text is not there exactly once
        assert all((copy / f).read_text() != (ROOT / f).read_text() for f, _b, _a in m.edits)


def test_every_killer_names_a_test_that_exists() -> None:
    for m in MUTATIONS:
        assert m.killers, m.name
        for killer in m.killers:
            path, _, name = killer.partition("::")
            source = (ROOT / path).read_text()
            if name:
                assert re.search(rf"^(async )?def {re.escape(name)}\(", source, re.M), killer
