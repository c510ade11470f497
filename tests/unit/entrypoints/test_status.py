"""The status port's socket (entrypoints/status.py `listening_socket`): the first free port
from a start port when none is set, a taken explicit port refused naming its setting, port 0
for any free one."""

from __future__ import annotations

import inspect
import socket
from collections.abc import Iterator

import pytest

from entrypoints.settings import FIRST_STATUS_PORT
from entrypoints.status import bound_port, listening_socket

HOST = "127.0.0.1"


@pytest.fixture
def held() -> Iterator[int]:
    """A port this test holds (bound and listening) while it runs."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    sock.listen(1)
    try:
        yield bound_port(sock)
    finally:
        sock.close()


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


def _accepts(port: int) -> bool:
    with socket.create_connection((HOST, port), timeout=2):
        return True


def test_unset_port_takes_the_first_free_one_from_the_start_port(held: int) -> None:
    sock = listening_socket(HOST, None, first=held, tries=20)
    try:
        port = bound_port(sock)
        assert held < port < held + 20  # the held port is skipped...
        assert not any(_free(p) for p in range(held + 1, port))  # ...and no free one
        assert _accepts(port)  # bound and listening already: no probe-then-bind race
        assert not sock.getblocking()  # ready for uvicorn's event loop
    finally:
        sock.close()


def test_unset_port_starts_at_the_well_known_status_port() -> None:
    first = inspect.signature(listening_socket).parameters["first"].default
    assert first == FIRST_STATUS_PORT == 9464


def test_unset_port_with_the_whole_range_taken_raises_naming_the_setting(held: int) -> None:
    with pytest.raises(OSError, match=f"^EO_METRICS_PORT: cannot listen on {HOST}:"
                                      f"{held}-{held}: "):
        listening_socket(HOST, None, first=held, tries=1)


@pytest.mark.parametrize("setting", ["EO_METRICS_PORT", "EO_CALLEES__BANK__PORT"])
def test_an_explicit_taken_port_raises_naming_the_setting(held: int, setting: str) -> None:
    with pytest.raises(OSError, match=f"^{setting}: cannot listen on {HOST}:{held}: "):
        listening_socket(HOST, held, first=held + 1, setting=setting)


def test_port_0_gets_a_free_port() -> None:
    sock = listening_socket(HOST, 0)
    try:
        port = bound_port(sock)
        assert port != 0
        assert _accepts(port)
    finally:
        sock.close()
