"""The network faults a campaign injects between its processes and its servers
(tools/faults/network.py), on a namespace of the test's own: an echo server on the host's end
of the pair, a client in the namespace. Each fault is seen from the client: a cut direction
stops connections, lost packets are retransmitted (no byte lost, the round trips slower), a
slow link takes at least as long as its rate allows. Skipped without root or nftables."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tools.faults.network import Namespace, available

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

CLIENT = """
import asyncio, json, sys, time
async def main(host, port, mode, n, connect_s):
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), connect_s)
    except (OSError, TimeoutError) as exc:
        print(json.dumps({"error": type(exc).__name__}))
        return
    started = time.monotonic()
    if mode == "echo":
        for _ in range(n):
            writer.write(b"x" * 100)
            await writer.drain()
            await asyncio.wait_for(reader.readexactly(100), 60)
    else:
        writer.write(b"y" * n)
        await writer.drain()
        await asyncio.wait_for(reader.readexactly(n), 60)
    print(json.dumps({"elapsed_s": time.monotonic() - started}))
    writer.close()
asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]),
                 float(sys.argv[5])))
"""


@pytest.fixture
async def link() -> AsyncIterator[tuple[Namespace, int]]:
    """A namespace and the port of an echo server on the host's end of its pair."""
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    async with Namespace() as namespace:
        server = await asyncio.start_server(echo, namespace.host_address, 0)
        try:
            yield namespace, server.sockets[0].getsockname()[1]
        finally:
            server.close()


async def client(link: tuple[Namespace, int], mode: str, n: int, connect_s: float = 2.0
                 ) -> dict[str, Any]:
    """The client's report, run in the namespace: `elapsed_s`, or the connection's `error`
    (none within `connect_s` seconds)."""
    namespace, port = link
    proc = await asyncio.create_subprocess_exec(
        *namespace.command(sys.executable, "-c", CLIENT, namespace.host_address, str(port),
                           mode, str(n), str(connect_s)), stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    return dict(json.loads(out))


async def test_a_cut_direction_stops_connections_and_healing_restores_them(
        link: tuple[Namespace, int]) -> None:
    namespace, _ = link
    assert "elapsed_s" in await client(link, "echo", 5)
    await namespace.cut(to_servers=True, from_servers=False)
    assert await client(link, "echo", 5) == {"error": "TimeoutError"}
    await namespace.heal()
    await namespace.cut(to_servers=False, from_servers=True)  # the replies lost alone
    assert await client(link, "echo", 5) == {"error": "TimeoutError"}
    await namespace.heal()
    assert "elapsed_s" in await client(link, "echo", 5)


async def test_a_cut_of_some_ports_leaves_the_others_reachable(
        link: tuple[Namespace, int]) -> None:
    """A consumer cut from the broker but not from the database: the cut names the broker's
    ports, and every other server still answers."""
    namespace, port = link
    await namespace.cut(True, True, ports=[port + 1 if port < 65535 else port - 1])
    assert "elapsed_s" in await client(link, "echo", 5)
    await namespace.cut(True, True, ports=[port])
    assert await client(link, "echo", 5) == {"error": "TimeoutError"}


async def test_lost_packets_are_retransmitted_later(link: tuple[Namespace, int]) -> None:
    namespace, _ = link
    await namespace.loss(20)
    # 20 round trips, 40 packets at least: none dropped about 1 time in 10,000; one dropped
    # waits for TCP's retransmission timeout (200 ms, doubling each time it is lost again:
    # 8 times in a row, 51 s, within the client's 60 s, about 1 time in 10,000)
    report = await client(link, "echo", 20, connect_s=60)
    assert report["elapsed_s"] >= 0.2, report


async def test_a_slow_link_carries_no_more_than_its_rate(link: tuple[Namespace, int]) -> None:
    namespace, _ = link
    await namespace.slow(rate_kbit=256)
    # 128 kB each way at 256 kbit/s past a 32 kB burst: 3 s at the least
    report = await client(link, "bulk", 128 * 1024)
    assert report["elapsed_s"] >= 2.0, report
