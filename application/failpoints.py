"""Named failpoints (protocol 10): `name=action[@n|*n]` rules separated by `;`.

Actions: `crash` (end the process at once), `raise` (a `TransientError`), `sleep:<ms>`,
`drop_conn` (close the broker connection), `wait:<gate>` (pause until a file named `<gate>`
exists in the gates directory: a test opens the gate when what the pause waits for has
happened, however long that took on a loaded machine). `@n` fires on the n-th hit only, `*n`
on each of the first n hits, neither on every hit. Off unless configured: the collaborators
then hold `NO_FAILPOINTS`, whose hits do nothing, and call `hit` unconditionally.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from application.errors import TransientError

NAMES: frozenset[str] = frozenset(
    {
        "after_token_load", "after_tr_load", "after_token_check", "after_handler",
        # the outbox path's (application/outbox_path.py): its check is the processed row's
        "after_processed_check",
        "before_commit", "after_commit", "after_publish_all", "after_cleanup_aborted",
        "after_consume_token", "after_tr_clear", "before_ack",
        "after_put", "after_post", "before_delete", "after_delete", "after_api_call",
        "callee.after_commit", "callee.before_reply",
        # the state strategy's (application/state_path.py): it has no TR and no commit
        "after_state_load", "before_append", "after_append",
    }
)
#: Names taking a suffix: `after_register:<kind>`, `after_create:<kind>`, `after_publish:<k>`.
PREFIXES: tuple[str, ...] = ("after_register:", "after_create:", "after_publish:")

_RULE = re.compile(r"^(?P<name>[\w.:]+)="
                   r"(?P<action>crash|raise|drop_conn|sleep:\d+|wait:[\w-]+)"
                   r"(?:(?P<mode>[@*])(?P<n>\d+))?$")
#: How often a `wait:<gate>` pause looks for its gate (seconds).
GATE_POLL_S = 0.05


@dataclass(frozen=True)
class Rule:
    """One parsed rule: `action` fires on hit `n` (`@`), on hits 1..n (`*`), or always."""

    name: str
    action: str
    mode: str | None
    n: int

    def fires(self, hit: int) -> bool:
        """Whether the `hit`-th hit (1-based) of the name fires."""
        if self.mode == "@":
            return hit == self.n
        if self.mode == "*":
            return hit <= self.n
        return True


def needs_gates(rules: dict[str, Rule]) -> bool:
    """Whether a rule of `rules` waits for a gate (`wait:<gate>`), so needs a gates
    directory."""
    return any(r.action.startswith("wait:") for r in rules.values())


def parse(spec: str) -> dict[str, Rule]:
    """Parse an `EO_FAILPOINTS` value; raises ValueError naming the bad rule or name."""
    rules: dict[str, Rule] = {}
    for raw in filter(None, (part.strip() for part in spec.split(";"))):
        match = _RULE.match(raw)
        if match is None:
            raise ValueError(f"EO_FAILPOINTS: cannot parse rule {raw!r}")
        name = match["name"]
        if name not in NAMES and not name.startswith(PREFIXES):
            raise ValueError(f"EO_FAILPOINTS: unknown failpoint {name!r}")
        rules[name] = Rule(name, match["action"], match["mode"], int(match["n"] or 0))
    return rules


class Failpoints:
    """Active failpoints. `crash` and `drop_conn` call the hooks the entrypoint gives
    (`os._exit` and the broker's connection close in a process; raising `Crash` in tests)."""

    def __init__(
        self,
        rules: dict[str, Rule],
        crash: Callable[[str], None],
        drop_conn: Callable[[], Awaitable[None]] | None = None,
        prefix: str = "",
        on_fire: Callable[[str, str], None] | None = None,
        gates: Path | None = None,
    ) -> None:
        """`gates`: the directory of the `wait:<gate>` actions' gate files; ValueError when
        a rule waits and there is none."""
        if gates is None and needs_gates(rules):
            raise ValueError("EO_FAILPOINT_GATES: a wait:<gate> failpoint needs the directory "
                             "of its gate files")
        self._gates = gates
        self._prefix = prefix
        self._rules = rules
        self._crash = crash
        self._drop_conn = drop_conn
        #: told (name, action) before a rule's action runs (a log line: `fault.injected`)
        self._on_fire = on_fire
        self.hits: Counter[str] = Counter()
        self.fired: Counter[str] = Counter()

    @classmethod
    def from_spec(
        cls,
        spec: str | None,
        crash: Callable[[str], None],
        drop_conn: Callable[[], Awaitable[None]] | None = None,
        on_fire: Callable[[str, str], None] | None = None,
        gates: Path | None = None,
    ) -> Failpoints | None:
        """`Failpoints` for a non-empty spec, else None (the zero-cost "off"). Raises
        ValueError as `parse` does, or when a `wait:` rule has no `gates` directory."""
        if not spec or not spec.strip():
            return None
        return cls(parse(spec), crash, drop_conn, on_fire=on_fire, gates=gates)

    def scoped(self, prefix: str) -> Failpoints:
        """A view whose names get `prefix` (e.g. `callee.`), sharing rules and counters."""
        view = Failpoints(self._rules, self._crash, self._drop_conn, self._prefix + prefix,
                          self._on_fire, self._gates)
        view.hits, view.fired = self.hits, self.fired
        return view

    async def hit(self, name: str) -> None:
        """Count a hit of `name` and perform its action when the rule fires."""
        name = self._prefix + name
        rule = self._rules.get(name)
        if rule is None:
            return
        self.hits[name] += 1
        if not rule.fires(self.hits[name]):
            return
        self.fired[name] += 1
        if self._on_fire is not None:
            self._on_fire(name, rule.action)
        if rule.action == "crash":
            self._crash(name)
        elif rule.action == "raise":
            raise TransientError(f"failpoint {name}")
        elif rule.action == "drop_conn":
            if self._drop_conn is not None:
                await self._drop_conn()
        elif rule.action.startswith("wait:"):
            assert self._gates is not None  # checked by __init__
            gate = self._gates / rule.action.split(":", 1)[1]
            # the gate is a file another process creates: no event here to wait on
            while not await asyncio.to_thread(gate.exists):  # noqa: ASYNC110
                await asyncio.sleep(GATE_POLL_S)
        else:
            await asyncio.sleep(int(rule.action.split(":", 1)[1]) / 1000)


def _no_crash(name: str) -> None:
    raise AssertionError(f"failpoint {name}: no failpoint is configured, none can crash")


class NoFailpoints(Failpoints):
    """No failpoint configured: every `hit` does nothing and counts nothing, and a scoped
    view is itself. The default wherever failpoints are taken (`NO_FAILPOINTS`)."""

    def __init__(self) -> None:
        super().__init__({}, _no_crash)

    def scoped(self, prefix: str) -> Failpoints:
        """Itself: no name of any prefix is configured."""
        return self

    async def hit(self, name: str) -> None:
        """Nothing."""


NO_FAILPOINTS: Failpoints = NoFailpoints()


def or_no_failpoints(failpoints: Failpoints | None) -> Failpoints:
    """`failpoints`, or `NO_FAILPOINTS` for None (what `Failpoints.from_spec` returns for an
    empty spec): for the builders that take what `from_spec` gives as it is."""
    return NO_FAILPOINTS if failpoints is None else failpoints
