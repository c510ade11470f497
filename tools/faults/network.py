"""A network namespace of its own for the processes a production-fault campaign runs, joined
to this host by a veth pair, and the link's faults: a slow link, lost packets, a one-way cut.

The processes run in the namespace (`command` prefixes theirs with `ip netns exec`) and reach
servers that listen on the host's end of the pair (`host_address`, a /30 of 10.231.0.0/16
chosen free; the campaign's own RabbitMQ nodes and PostgreSQL servers listen there besides
127.0.0.1). Nothing else is routed: the namespace reaches the host's end only.

The faults, on this machine's kernel, whose `tc` has `tbf` but not `netem` ("Specified qdisc
kind is unknown" for netem, fq_codel, prio and sfq):

- `slow(rate_kbit)`: a token-bucket rate limit on both ends (`tc qdisc ... tbf`): a slow
  link, whose queue adds latency as soon as traffic exceeds the rate;
- `loss(percent)`: nftables drops that share of packets at random (`numgen random`) in the
  chosen directions: TCP retransmits them after its timeout (200 ms and more), which is how
  loss looks to an application;
- `cut(to_servers, from_servers)`: every packet of a direction dropped (a one-way cut: a
  consumer whose requests reach the server and whose replies do not, or the reverse);
- `heal()`: all of them removed.

Needs root, iproute2 (`ip`, `tc`) and nftables (`nft`; Debian's `nftables` package):
`available()` says whether this machine has them.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence

#: where the pairs' /30 subnets are taken from
SUBNETS = ipaddress.ip_network("10.231.0.0/16")
#: the nftables table the faults live in (inside the namespace)
TABLE = "eo_faults"


def available() -> str | None:
    """None when this machine can make namespaces with faults, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"{tool} is missing (Debian: apt-get install {package})"
    return None


def _run(*args: str) -> str:
    """Run a command; its stdout. Raises RuntimeError with its stderr when it fails."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of `SUBNETS` that overlaps no address of this host's namespace."""
    used = [ipaddress.ip_interface(line.split()[3]).network
            for line in _run("ip", "-o", "-4", "addr", "show").splitlines()]
    for _ in range(100):
        start = int(SUBNETS.network_address) + 4 * secrets.randbelow(SUBNETS.num_addresses // 4)
        candidate = ipaddress.IPv4Network((start, 30))
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise RuntimeError(f"no free /30 in {SUBNETS}")


class Namespace:
    """A namespace and its veth pair (see the module docstring). Use as an async context
    manager, or call `create` and `remove`. Methods raise RuntimeError naming the command
    that failed."""

    def __init__(self, tag: str | None = None) -> None:
        tag = tag or secrets.token_hex(3)
        self.name = f"eo-{tag}"
        self.host_if, self.inner_if = f"eo{tag}h", f"eo{tag}n"  # at most 15 characters
        subnet = _free_subnet()
        hosts = list(subnet.hosts())
        self.host_address, self.inner_address = str(hosts[0]), str(hosts[1])
        self.prefix_length = subnet.prefixlen
        self.created = False

    async def __aenter__(self) -> Namespace:
        await self.create()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.remove()

    def command(self, *args: str) -> list[str]:
        """`args` as a command run in the namespace."""
        return ["ip", "netns", "exec", self.name, *args]

    async def create(self) -> None:
        """Make the namespace, the pair and their addresses, and the faults' empty table."""
        await asyncio.to_thread(self._create)

    def _create(self) -> None:
        _run("ip", "netns", "add", self.name)
        self.created = True
        _run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.inner_if)
        _run("ip", "link", "set", self.inner_if, "netns", self.name)
        _run("ip", "addr", "add", f"{self.host_address}/{self.prefix_length}",
             "dev", self.host_if)
        _run("ip", "link", "set", self.host_if, "up")
        inner = ["ip", "netns", "exec", self.name]
        _run(*inner, "ip", "addr", "add", f"{self.inner_address}/{self.prefix_length}",
             "dev", self.inner_if)
        _run(*inner, "ip", "link", "set", self.inner_if, "up")
        _run(*inner, "ip", "link", "set", "lo", "up")
        _run(*inner, "nft", f"add table inet {TABLE}; "
             f"add chain inet {TABLE} out {{ type filter hook output priority 0; }}; "
             f"add chain inet {TABLE} in {{ type filter hook input priority 0; }}")

    async def slow(self, rate_kbit: int) -> None:
        """Limit both directions to `rate_kbit` kbit/s (tbf, a 32 kB burst, packets waiting
        up to a second before they are dropped)."""
        def limit() -> None:
            spec = ("tbf", "rate", f"{rate_kbit}kbit", "burst", "32kb", "latency", "1000ms")
            _run("tc", "qdisc", "replace", "dev", self.host_if, "root", *spec)
            _run(*self.command("tc", "qdisc", "replace", "dev", self.inner_if, "root", *spec))
        await asyncio.to_thread(limit)

    async def loss(self, percent: int, to_servers: bool = True, from_servers: bool = True,
                   ports: Sequence[int] = ()) -> None:
        """Drop `percent` % of the packets at random, in the directions asked (only those
        of the servers' TCP `ports`, when given)."""
        if not 0 < percent <= 100:
            raise ValueError("percent must be in 1..100")
        await self._drop(f"numgen random mod 100 < {percent} drop", to_servers, from_servers,
                         ports)

    async def cut(self, to_servers: bool = True, from_servers: bool = False,
                  ports: Sequence[int] = ()) -> None:
        """Drop every packet of the directions asked (one of them: a one-way cut; only
        those of the servers' TCP `ports`, when given: one server cut, the others not)."""
        await self._drop("drop", to_servers, from_servers, ports)

    async def _drop(self, rule: str, to_servers: bool, from_servers: bool,
                    ports: Sequence[int]) -> None:
        def add() -> None:
            for chain, on in (("out", to_servers), ("in", from_servers)):
                if on:
                    address = "daddr" if chain == "out" else "saddr"
                    port = "dport" if chain == "out" else "sport"
                    only = (f"tcp {port} {{ {', '.join(str(p) for p in ports)} }} "
                            if ports else "")
                    _run(*self.command("nft", f"add rule inet {TABLE} {chain} ip {address} "
                                              f"{self.host_address} {only}{rule}"))
        await asyncio.to_thread(add)

    async def heal(self) -> None:
        """Remove every fault: the rate limits and the drop rules."""
        def heal() -> None:
            for chain in ("out", "in"):
                _run(*self.command("nft", f"flush chain inet {TABLE} {chain}"))
            for command in (["tc", "qdisc", "del", "dev", self.host_if, "root"],
                            self.command("tc", "qdisc", "del", "dev", self.inner_if, "root")):
                subprocess.run(command, capture_output=True, check=False)  # none: no error
        await asyncio.to_thread(heal)

    async def remove(self) -> None:
        """Remove the namespace (its end of the pair and every rule go with it) and the
        host's end."""
        def remove() -> None:
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True,
                           check=False)
            if self.created:
                subprocess.run(["ip", "netns", "del", self.name], capture_output=True,
                               check=False)
                self.created = False
        await asyncio.to_thread(remove)
