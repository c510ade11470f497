"""A RabbitMQ cluster of its own on this machine, for the production-fault campaigns: `size`
nodes started beside any running broker (never touching it), clustered, then killed,
restarted or paused one at a time, and removed with their directories.

Each node has its own node name (`eo-<tag>-<n>@localhost`), AMQP and distribution ports (free
ports of 127.0.0.1, outside the CLI tools' range 35672-35682), configuration, environment
and plugins files, database and log directories, all under `root` and owned by the
`rabbitmq` user, which Debian's server drops to; and the cluster has its own Erlang cookie
(in the nodes' `HOME`), so its nodes and CLI calls cannot reach another node of the machine.
Starting a node needs root (`runuser`) and Debian's `rabbitmq-server`: `available()` says
whether this machine can.

Measured on the project's 2-core machine: a node is up in about 10 s idle and 30 s under
load; `start` boots the nodes together and joins the others to the first.

With `also_on` (an address of this host, e.g. a network namespace's host end:
tools/faults/network.py), each node also listens for AMQP there, on the same port (`url_on`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tools.faults import free_port

SERVER = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CTL = Path("/usr/lib/rabbitmq/bin/rabbitmqctl")
QUEUES = Path("/usr/lib/rabbitmq/bin/rabbitmq-queues")
#: how long a node may take to boot (seconds): about 30 s under load here
START_TIMEOUT_S = 180.0
#: the Erlang distribution's tick (seconds): a paused node is declared down after about
#: this long (Erlang's default, 60 s, would make a pause a minute-long outage)
NET_TICKTIME_S = 10
#: RabbitMQ's `dead_letter_worker_publisher_confirm_timeout`, in seconds: how long a quorum
#: queue's at-least-once dead-lettering waits for the target queue's confirm before it sends
#: again. Its default, 180 s, held the retries a retry queue had expired into a work queue
#: whose leader was killed for 3 minutes, invisible to `list_queues` (eo chaos --production,
#: seed 45 run 60: 13 retries); docs/operations.md asks production for this value too.
DLX_CONFIRM_TIMEOUT_S = 10


def available() -> str | None:
    """None when this machine can start nodes, else why not (for a test's skip reason)."""
    if not SERVER.exists() or not CTL.exists():
        return "Debian's rabbitmq-server is not installed"
    if os.geteuid() != 0:
        return "starting RabbitMQ nodes as the rabbitmq user needs root"
    if shutil.which("runuser") is None:
        return "runuser (util-linux) is missing"
    return None


@dataclass
class RabbitNode:
    """One node of the cluster: its name, ports and directory, and its server process
    while it runs."""

    name: str
    amqp_port: int
    dist_port: int
    directory: Path
    #: a plain `Popen`, not an asyncio process: the cluster outlives the event loops that
    #: use it (a test module's, a campaign's)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    paused: bool = False

    @property
    def url(self) -> str:
        """The node's AMQP URL (the default user, which reaches it over loopback)."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/"

    def url_on(self, host: str) -> str:
        """The node's AMQP URL at `host` (the cluster's `also_on`)."""
        return f"amqp://guest:guest@{host}:{self.amqp_port}/"

    @property
    def address(self) -> str:
        """`127.0.0.1:<AMQP port>`."""
        return f"127.0.0.1:{self.amqp_port}"

    @property
    def running(self) -> bool:
        """Whether the node's server process is alive (a paused node is)."""
        return self.process is not None and self.process.poll() is None

    def beam_pid(self) -> int | None:
        """The Erlang VM's pid (the pid file the node writes once booting), or None."""
        with contextlib.suppress(OSError, ValueError):
            return int((self.directory / "pid").read_text().strip())
        return None


class RabbitCluster:
    """`size` RabbitMQ nodes clustered in a directory of their own (see the module
    docstring). Use as an async context manager, or call `start` and `remove`. Raises
    RuntimeError when a node does not boot or join, with the end of its log."""

    def __init__(self, root: Path | None = None, size: int = 3, tag: str | None = None,
                 also_on: str | None = None) -> None:
        """`root`: the cluster's directory (every directory above it must let the rabbitmq
        user through; /tmp does); None: a new one under the system's temporary directory.
        `also_on`: an IPv4 address of this host the nodes listen on besides 127.0.0.1."""
        self.also_on = also_on
        if size < 1:
            raise ValueError("a cluster has at least one node")
        self.root = root or Path(tempfile.mkdtemp(prefix="eo-rabbit-cluster-"))
        self.tag = tag or f"{os.getpid()}-{secrets.token_hex(2)}"
        self.cookie = secrets.token_hex(16)
        taken: set[int] = set()
        self.nodes = [RabbitNode(f"eo-{self.tag}-{n}@localhost", free_port(taken),
                                 free_port(taken), self.root / f"node{n}")
                      for n in range(1, size + 1)]

    async def __aenter__(self) -> RabbitCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.remove()

    @property
    def urls(self) -> list[str]:
        """Every node's AMQP URL, first node first."""
        return [node.url for node in self.nodes]

    def node(self, name: str) -> RabbitNode:
        """The node named `name` (KeyError otherwise)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    async def start(self) -> None:
        """Boot every node and join the others to the first (`rabbitmqctl join_cluster`)."""
        await asyncio.to_thread(self._prepare)
        try:
            await asyncio.gather(*(self._boot(node) for node in self.nodes))
            first = self.nodes[0]
            for node in self.nodes[1:]:
                await self.ctl(node, "stop_app")
                await self.ctl(node, "join_cluster", first.name)
                await self.ctl(node, "start_app")
        except BaseException:
            await self.remove()
            raise

    def _prepare(self) -> None:
        home = self.root / "home"
        home.mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        for node in self.nodes:
            for sub in ("mnesia", "log"):
                (node.directory / sub).mkdir(parents=True, exist_ok=True)
            extra = (f"listeners.tcp.other = {self.also_on}:{node.amqp_port}\n"
                     if self.also_on else "")
            (node.directory / "rabbitmq.conf").write_text(
                f"listeners.tcp.local = 127.0.0.1:{node.amqp_port}\n{extra}"
                # new queues' leaders spread over the nodes (production's advice): with the
                # default, the declaring client's node leads them all
                "queue_leader_locator = balanced\n"
                # a node that was paused (a frozen VM) comes back into a partitioned
                # metadata store: with the default (`ignore`) and with `pause_minority` (it
                # never saw the partition) the cluster stays split and its nodes disagree,
                # on a queue's counts among others; `autoheal` restarts the losing side
                "cluster_partition_handling = autoheal\n"
                # the default user may log in from `also_on`'s side too
                + ("loopback_users.guest = false\n" if self.also_on else ""))
            (node.directory / "advanced.config").write_text(
                "[{rabbit, [{dead_letter_worker_publisher_confirm_timeout, "
                f"{DLX_CONFIRM_TIMEOUT_S * 1000}}}]}}].\n")
            (node.directory / "env.conf").write_text("ERL_EPMD_ADDRESS=127.0.0.1\n")
            (node.directory / "enabled_plugins").write_text("[].\n")
        subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(self.root)], check=True)

    def _env(self, node: RabbitNode) -> dict[str, str]:
        d = node.directory
        return {
            "HOME": str(self.root / "home"),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "env.conf"),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(d / "feature_flags"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": f"-kernel net_ticktime {NET_TICKTIME_S}",
            "ERL_FLAGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    async def _boot(self, node: RabbitNode) -> None:
        with contextlib.suppress(FileNotFoundError):
            (node.directory / "pid").unlink()
        node.process = await asyncio.to_thread(self._spawn, node)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while True:  # `await_startup` fails at once until the node has registered with epmd
            try:
                await self.ctl(node, "await_startup", "--timeout",
                               str(max(1, int(deadline - loop.time()))),
                               timeout_s=START_TIMEOUT_S + 10)
                break
            except RuntimeError as exc:
                if not node.running or loop.time() >= deadline:
                    tail = await asyncio.to_thread(self.log_tail, node)
                    raise RuntimeError(f"{exc}\n{tail}") from exc
                await asyncio.sleep(1.0)
        node.paused = False

    def _spawn(self, node: RabbitNode) -> subprocess.Popen[bytes]:
        with (node.directory / "server.out").open("ab") as out:
            return subprocess.Popen(
                ["runuser", "-u", "rabbitmq", "--", "env", "-i",
                 *(f"{k}={v}" for k, v in self._env(node).items()), str(SERVER)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)

    def log_tail(self, node: RabbitNode, lines: int = 20) -> str:
        """The end of the node's server output and log, for an error message."""
        parts = []
        for path in (node.directory / "server.out",
                     node.directory / "log" / f"{node.name}.log"):
            with contextlib.suppress(OSError):
                parts.append("\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(parts)

    async def ctl(self, node: RabbitNode, *args: str, tool: Path = CTL,
                  timeout_s: float = 60.0) -> str:
        """Run `rabbitmqctl -n <node> <args>` (or another CLI `tool`) as the rabbitmq user
        with the cluster's cookie; its stdout. Raises RuntimeError when it fails or takes
        over `timeout_s` seconds."""
        env = self._env(node)
        proc = await asyncio.create_subprocess_exec(
            "runuser", "-u", "rabbitmq", "--", "env", "-i",
            f"HOME={env['HOME']}", f"PATH={env['PATH']}",
            f"RABBITMQ_CONF_ENV_FILE={env['RABBITMQ_CONF_ENV_FILE']}",
            str(tool), "-q", "-n", node.name, *args,
            stdin=subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"{tool.name} {' '.join(args)} on {node.name}: no answer in "
                               f"{timeout_s:.0f} s") from None
        if proc.returncode != 0:
            raise RuntimeError(f"{tool.name} {' '.join(args)} on {node.name} failed: "
                               f"{(err or out).decode(errors='replace').strip()[-2000:]}")
        return out.decode(errors="replace")

    async def leader_of(self, queue: str, vhost: str = "/", wait_s: float = 15.0) -> str:
        """The name of the node leading quorum queue `queue` now, or the home node of a
        classic one (asked of the running, unpaused nodes; while the queue elects a leader,
        after a node's loss, asked again for up to `wait_s` seconds). Raises RuntimeError
        when no node names one in that time."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            for node in self.nodes:
                if not node.running or node.paused:
                    continue
                with contextlib.suppress(RuntimeError):  # a node still starting: the next
                    out = await self.ctl(node, "list_queues", "-p", vhost, "name", "leader",
                                         "pid", "--no-table-headers", timeout_s=10)
                    for line in out.splitlines():
                        name, leader, pid = [*line.split("\t"), "", ""][:3]
                        if name == queue and (leader.strip() or pid.strip()):
                            # a classic queue has no leader: its process's pid names its
                            # node
                            return leader.strip() or pid.strip().strip("<>").rsplit(".", 3)[0]
            if asyncio.get_running_loop().time() >= deadline:
                raise RuntimeError(f"no node names a leader of queue {queue!r}")
            await asyncio.sleep(0.5)

    async def kill(self, node: RabbitNode) -> None:
        """kill -9 the node's Erlang VM (its queues' leaders move to the others)."""
        pid = node.beam_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if node.process is not None:
            with contextlib.suppress(ProcessLookupError):
                node.process.kill()
            await asyncio.to_thread(node.process.wait)
        node.paused = False

    async def restart(self, node: RabbitNode) -> None:
        """Boot a killed node again on its own directories: it rejoins the cluster."""
        if node.running:
            await self.kill(node)
        await self._boot(node)

    async def pause(self, node: RabbitNode) -> None:
        """Stop the node's VM (SIGSTOP) without killing it: its connections hang and, after
        about `NET_TICKTIME_S`, the others declare it down."""
        pid = node.beam_pid()
        if pid is None:
            raise RuntimeError(f"{node.name} has no pid to pause")
        os.kill(pid, signal.SIGSTOP)
        node.paused = True

    async def resume(self, node: RabbitNode) -> None:
        """Continue a paused node (SIGCONT)."""
        pid = node.beam_pid()
        if pid is not None:
            os.kill(pid, signal.SIGCONT)
        node.paused = False

    async def remove(self) -> None:
        """Kill every node and remove the cluster's directory."""
        for node in self.nodes:
            if node.paused:
                await self.resume(node)
            await self.kill(node)
        await asyncio.to_thread(shutil.rmtree, self.root, True)

