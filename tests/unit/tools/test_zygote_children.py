"""The zygote's bookkeeping of its children's exits (tools/zygote.py `Children`)."""

from __future__ import annotations

from tools.zygote import Children


def test_a_child_that_reuses_an_old_childs_pid_is_not_seen_exited() -> None:
    """The kernel hands a reaped pid out again (pid_max 32,768 here): an hour's `eo chaos`
    campaign saw a restarted consumer "exit 0" at once, the old child's code, and started a
    second one beside it."""
    children = Children()
    first = children.forked(4242)
    children.exited(4242, 0)
    second = children.forked(4242)
    assert children.codes.get(first) == 0
    assert children.codes.get(second) is None  # running
    children.exited(4242, 70)
    assert (children.codes[first], children.codes[second]) == (0, 70)
