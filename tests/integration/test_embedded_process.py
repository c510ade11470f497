"""`eo embedded --format json` as a process on the counters service: its JSON report."""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.counters.registry import SPEC
from tests.support.processes import ROOT, eo_command

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively


def _line(queue: str, message_id: int | None, type_: str, counter: str, amount: int) -> str:
    line: dict[str, Any] = {"queue": queue, "type": type_,
                            "body": {"counter": counter, "amount": amount}}
    if message_id is not None:
        line["message_id"] = f"00000000-0000-0000-0000-{message_id:012}"
    return json.dumps(line)


LINES = [
    _line("front", 1, "Add", "c1", 1),
    _line("front", 2, "Add", "c1", 2),
    _line("front", 3, "Spend", "c1", 4),  # the embedded bank holds no account: refused
    _line("front", 4, "Add", "c2", 8),
    _line("front", 4, "Add", "c2", 8),  # the producer sent it twice
    _line("counter", 5, "Add", "c3", 16),  # the runner creates its token, as a sender would
    _line("front", None, "Add", "c3", 32),  # no message ID: dead-lettered
    "not json",  # not a message at all: rejected
]


def test_eo_embedded_reports_the_counters_run_as_json(tmp_path: Path) -> None:
    messages = tmp_path / "messages.jsonl"
    messages.write_text("\n".join(LINES) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EO_")}
    env.update(EO_SERVICE=SPEC, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [*eo_command(), "embedded", str(messages), "--format", "json",
         "--blob-dir", str(tmp_path / "blobs")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr  # a dead letter and a rejected line
    report = json.loads(done.stdout)

    assert report["service"] == "counters"
    assert report["input"]["lines"] == len(LINES)
    assert report["input"]["published"] == len(LINES) - 1
    [rejected] = report["input"]["rejected"]
    assert rejected["line"] == len(LINES)
    assert rejected["reason"].startswith("not a message")
    settled = {name: {k: v for k, v in counts.items() if v}
               for name, counts in report["settled"].items()}
    # the line without a message ID is dead-lettered before processing: counted as one
    assert settled == {"front": {"processed": 4, "duplicate": 1, "dead_lettered": 1},
                       # 3 Adds relayed, one sent directly, the Spend and its Spent; the
                       # relayed copy of the duplicate finds its token gone
                       "counter": {"processed": 6, "duplicate": 1},
                       "audit": {"processed": 1}}

    counters = report["states"]["counter"]
    assert {k: s["total"] for k, s in counters.items()} == {"c1": 3, "c2": 8, "c3": 16}
    assert (counters["c1"]["spent"], counters["c1"]["refused"]) == ([], [4])
    assert report["states"]["audit"] == {"c1": {"reports": [
        {"counter": "c1", "amount": 4, "status": 409, "total": 3}]}}
    assert report["states"]["bank"] == {}

    copies: dict[str, set[str]] = defaultdict(set)
    for output in report["outputs"]:
        copies[output["message_id"]].add(json.dumps(output, sort_keys=True))
    assert all(len(c) == 1 for c in copies.values()), copies  # every copy identical (I2)
    sent = sorted((json.loads(next(iter(c)))["to"], json.loads(next(iter(c)))["type"])
                  for c in copies.values())
    assert sent == [("audit", "Reported"), *[("counter", "Add")] * 3, ("counter", "Spend"),
                    ("counter", "Spent")]

    [dead] = report["dead_letters"]["front"]
    assert (dead["type"], dead["reason"]) == ("Add", "no message_id")
    assert sum(len(letters) for letters in report["dead_letters"].values()) == 1
    assert report["at_rest"] == {
        "tokens in flight": 0, "unfinished transaction records": 0, "side-effect records": 0,
        "deferred clean-ups": 0, "requests on callees": 0, "unrelayed inbox rows": 0}
    receipts = sorted(key for state in counters.values() for key in state["receipts"])
    assert report["blobs"] == receipts
    assert len(receipts) == 5  # four Adds and the Spend
    assert sorted(str(p.relative_to(tmp_path / "blobs"))
                  for p in (tmp_path / "blobs").rglob("*") if p.is_file()) == receipts
