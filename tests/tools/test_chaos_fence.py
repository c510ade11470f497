"""The fence scenarios of `eo chaos` (tools/chaos/fence.py): the message pairs
(tools/chaos/fence_pairs.py) come from the fault-free run of the workload, and the script
stages its steps in order and names the one that did not happen. (The scenarios on real
processes, and the mutations of the fence they catch, run in the template test, on the service
made from the template.)"""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from application.observability import FAULT_INJECTED, MESSAGE_DUPLICATE
from entrypoints.service_spec import resolve_service
from entrypoints.settings import load_settings
from tests.support.counters.chaos import WORKLOAD
from tests.support.counters.registry import REGISTRY
from tools.chaos import fence, fence_pairs
from tools.chaos.fence import FencePair, Script, StepMissed, stage_fence
from tools.chaos.fence_pairs import find_pairs, partition_of
from tools.chaos.workload import OutsideMessage

CRASH = 17


async def test_each_pair_is_two_messages_the_fault_free_run_commits_on_one_partition() -> None:
    """Every consuming endpoint gets a pair, whatever feeds it: `front` the outside
    messages, `counter` what the gateway forwards (a Spend also makes it commit the bank's
    answer, a follow-up after its first commit), `audit` only what `counter` sends it after
    the bank's answer."""
    settings = load_settings()
    service = resolve_service(settings, REGISTRY)
    messages = WORKLOAD.draw(random.Random(3), 16)
    pairs, skipped = await find_pairs(settings, service, messages,
                                      WORKLOAD.seed_states(messages))
    assert (set(pairs), skipped) == ({"front", "counter", "audit"}, {})
    assert {pairs["audit"].first.type, pairs["audit"].second.type} == {"Spend"}
    steps = await fence_pairs.steps_of(fence_pairs.embedded_settings(settings), service,
                                       messages, WORKLOAD.seed_states(messages), ["counter"])
    spends = [step.arrivals["counter"] for m, step in zip(messages, steps, strict=True)
              if m.type == "Spend"]
    # a Spend: one first arrival at counter, the bank's answer after it; each a candidate
    assert spends
    assert all(len(a.first) == 1 and a.later == 1 for a in spends)
    for endpoint, pair in pairs.items():
        assert pair.first in messages
        assert pair.second in messages
        assert messages.index(pair.first) < messages.index(pair.second)
        if endpoint == "front":  # the boundary: the outside messages themselves
            assert {partition_of(REGISTRY["front"], m.type, m.body)
                    for m in (pair.first, pair.second)} == {pair.partition}
        # the gateway forwards each message to the counter of its partition
        assert pair.partition == partition_of(REGISTRY["front"], pair.first.type,
                                              pair.first.body)


async def test_an_endpoint_without_a_pair_is_named_with_the_reason() -> None:
    """One Add per counter: no partition of `counter` sees two messages; no Spend: nothing
    reaches `audit`."""
    settings = load_settings()
    service = resolve_service(settings, REGISTRY)
    messages = [OutsideMessage("front", str(uuid.UUID(int=n + 1)), "Add",
                               json.dumps({"counter": f"c{n}", "amount": 1}).encode())
                for n in range(3)]
    pairs, skipped = await find_pairs(settings, service, messages,
                                      WORKLOAD.seed_states(messages))
    assert pairs == {}
    assert "no partition of its 3 receives two messages" in skipped["counter"]
    assert "no partition of its 3 receives two messages" in skipped["front"]
    assert "sends it nothing" in skipped["audit"]


class FakeFleet:
    """Two consumers as the script sees them: Y crashes at its commit, X pauses at the
    failpoint its rule names until its gate opens, then drops M1 as a duplicate."""

    def __init__(self, gates: Path, y_exits: int = CRASH, x_pauses: bool = True) -> None:
        self.gates, self.y_exits, self.x_pauses = gates, y_exits, x_pauses
        self.calls: list[tuple[str, str]] = []
        self.running: dict[str, str] = {}

    def start(self, name: str, env: Mapping[str, str]) -> None:
        self.calls.append(("start", f"{name}: {env['EO_FAILPOINTS']}"))
        self.running[name] = env["EO_FAILPOINTS"]
        assert env["EO_PREFETCH"] == "1"
        assert env["EO_BATCH_SIZE"] == "1"

    def exit_code(self, name: str) -> int | None:
        return self.y_exits if name.endswith("-1") and self.published() else None

    def published(self) -> bool:
        return any(kind == "publish" for kind, _ in self.calls)

    def log(self, name: str) -> list[dict[str, Any]]:
        rule = self.running.get(name, "")
        if not name.endswith("-0") or "wait:x" not in rule or not self.x_pauses:
            return []
        point = rule.split("=")[0]
        records: list[dict[str, Any]] = [{"event": FAULT_INJECTED, "failpoint": point}]
        if (self.gates / "x").exists():
            records.append({"event": MESSAGE_DUPLICATE})
        return records

    async def publish(self, messages: Sequence[OutsideMessage]) -> None:
        self.calls.append(("publish", ",".join(m.message_id for m in messages)))

    def script(self) -> Script:
        return Script(self.start, self.exit_code, self.log, self.publish, self.gates)


def _pair() -> FencePair:
    return FencePair("counter", "c1", OutsideMessage("front", "m1", "Add", b"{}"),
                     OutsideMessage("front", "m2", "Add", b"{}"))


async def _no_wait(_seconds: float) -> None:
    return None


@pytest.mark.parametrize(("half", "point"), list(fence.HALVES.items()))
async def test_the_script_stages_the_steps_in_order(tmp_path: Path, half: str, point: str
                                                    ) -> None:
    fleet = FakeFleet(tmp_path)
    await stage_fence(fleet.script(), _pair(), half, CRASH, _no_wait)
    assert fleet.calls == [("start", "counter-1: after_commit=crash@1"), ("publish", "m1"),
                           ("start", f"counter-0: {point}=wait:x@1"),
                           ("start", "counter-1: after_commit=crash@1"), ("publish", "m2")]
    assert (tmp_path / "x").exists()  # X was let go


async def test_a_step_that_does_not_happen_is_named_and_x_is_let_go(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StepMissed, match=r"1\. counter-1 commits M1 and crashes: counter-1 "
                                         r"exited 1, not by its crash failpoint"):
        await stage_fence(FakeFleet(tmp_path, y_exits=1).script(), _pair(), "attempt guard",
                          CRASH, _no_wait)
    monkeypatch.setattr(fence, "STEP_TIMEOUT_S", 0.05)

    async def sleep(seconds: float) -> None:
        import asyncio
        await asyncio.sleep(seconds)

    (tmp_path / "b").mkdir()
    with pytest.raises(StepMissed, match=r"2\. counter-0 takes M1 and pauses at after_tr_load: "
                                         r"did not happen within 0 s"):
        await stage_fence(FakeFleet(tmp_path / "b", x_pauses=False).script(), _pair(),
                          "attempt guard", CRASH, asyncio.sleep)
    assert (tmp_path / "b" / "x").exists()
