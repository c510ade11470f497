"""A PostgreSQL primary and a streaming standby of their own on this machine, for the
production-fault campaigns: started beside the machine's server (never touching it), failed
over by killing the primary and promoting the standby, the old primary brought back as the new
standby (`pg_rewind`), and removed with their directories.

Each server runs Debian's PostgreSQL binaries as the `postgres` user on a free port of
127.0.0.1 with trust authentication for local connections, its own data directory and socket
directory under the pair's root. Replication is synchronous (`synchronous_standby_names =
'*'`: a commit returns once the standby has flushed it) or asynchronous; with synchronous
replication the pair behaves as Patroni's non-strict `synchronous_mode`: a primary without a
standby (after a failover, until the old primary rejoins) commits alone, and is made
synchronous again when the standby is back. The services reach the pair through a multi-host
DSN with `target_session_attrs=read-write` (`dsn`), which asyncpg follows to the primary.

With `also_on` (an address of this host, e.g. a network namespace's host end:
tools/faults/network.py), the servers also listen there, with trust authentication for its
/16 (`dsn(host=...)`).

`available()` says whether this machine can run one (root, the binaries).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools.faults import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"
#: bound on a server's start, stop, promotion (seconds)
STEP_TIMEOUT_S = 120.0


def available() -> str | None:
    """None when this machine can run a pair, else why not (for a test's skip reason)."""
    if not (BIN / "postgres").exists():
        return f"PostgreSQL's binaries are not in {BIN}"
    if os.geteuid() != 0:
        return f"running servers as the {USER} user needs root"
    if shutil.which("runuser") is None:
        return "runuser (util-linux) is missing"
    return None


@dataclass
class PgServer:
    """One server of the pair: its name, port and directories."""

    name: str
    port: int
    directory: Path

    @property
    def data(self) -> Path:
        """The data directory."""
        return self.directory / "data"

    @property
    def sockets(self) -> Path:
        """The Unix socket directory."""
        return self.directory / "run"

    def postmaster_pid(self) -> int | None:
        """The postmaster's pid while it runs (its `postmaster.pid`), else None."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().splitlines()[0])
            os.kill(pid, 0)
            return pid
        return None

    def conninfo(self) -> str:
        """A libpq connection string to this server (replication and `pg_rewind`)."""
        return f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres"


class PostgresPair:
    """A primary and a standby (see the module docstring). Use as an async context manager,
    or call `start` and `remove`. Methods raise RuntimeError with the server's log tail when
    a step fails."""

    def __init__(self, root: Path | None = None, synchronous: bool = True,
                 also_on: str | None = None) -> None:
        """`root`: the pair's directory (every directory above it must let the postgres user
        through); None: a new one under the system's temporary directory. `also_on`: an IPv4
        address of this host the servers listen on besides 127.0.0.1."""
        self.also_on = also_on
        self.root = root or Path(tempfile.mkdtemp(prefix="eo-postgres-pair-"))
        self.synchronous = synchronous
        taken: set[int] = set()
        self.servers = [PgServer(f"pg{n}", free_port(taken), self.root / f"pg{n}")
                        for n in (1, 2)]
        #: the server that is primary now (a failover changes it)
        self.primary = self.servers[0]

    async def __aenter__(self) -> PostgresPair:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.remove()

    @property
    def standby(self) -> PgServer:
        """The other server."""
        return self.servers[1] if self.primary is self.servers[0] else self.servers[0]

    def dsn(self, database: str = "postgres", host: str = "127.0.0.1") -> str:
        """A multi-host DSN of both servers that connects to the primary, wherever it is;
        at `host` (127.0.0.1, or the pair's `also_on`)."""
        hosts = ",".join(f"{host}:{s.port}" for s in self.servers)
        return f"postgresql://{USER}@{hosts}/{database}?target_session_attrs=read-write"

    def server_dsn(self, server: PgServer, database: str = "postgres") -> str:
        """A DSN of `server` alone."""
        return f"postgresql://{USER}@127.0.0.1:{server.port}/{database}"

    async def run(self, *args: str, timeout_s: float = STEP_TIMEOUT_S) -> str:
        """Run a PostgreSQL binary (`args[0]`, in `BIN`) as the postgres user; its output.
        Raises RuntimeError when it fails or takes over `timeout_s` seconds."""
        proc = await asyncio.create_subprocess_exec(
            "runuser", "-u", USER, "--", str(BIN / args[0]), *args[1:],
            stdin=subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, cwd=str(self.root))
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RuntimeError(f"{' '.join(args[:2])}: no end in {timeout_s:.0f} s") from None
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}): "
                               f"{text.strip()[-2000:]}")
        return text

    async def start(self) -> None:
        """initdb the primary (with data checksums, which `pg_rewind` needs), start it, copy
        it to the standby (`pg_basebackup -R`) and start that."""
        await asyncio.to_thread(self._directories)
        try:
            primary, standby = self.servers
            await self.run("initdb", "-D", str(primary.data), "-U", USER, "--auth=trust",
                           "--data-checksums", "-E", "UTF8", "--locale=C.UTF-8")
            await asyncio.to_thread(self._configure, primary)
            await self.start_server(primary)
            await self.run("pg_basebackup", "-D", str(standby.data), "-R", "-X", "stream",
                           "-d", primary.conninfo())
            await asyncio.to_thread(self._configure, standby)
            await self.start_server(standby)
            if self.synchronous:
                await self.make_synchronous(primary)
        except BaseException:
            await self.remove()
            raise

    def _directories(self) -> None:
        for server in self.servers:
            server.sockets.mkdir(parents=True, exist_ok=True)
        subprocess.run(["chown", "-R", f"{USER}:{USER}", str(self.root)], check=True)

    def _configure(self, server: PgServer) -> None:
        """The server's own settings, appended (a later line wins): its port and sockets,
        replication, and no synchronous standby yet."""
        listen = ",".join(filter(None, ["127.0.0.1", self.also_on]))
        with (server.data / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# eo PostgresPair\nport = {server.port}\n"
                       f"listen_addresses = '{listen}'\n"
                       f"unix_socket_directories = '{server.sockets}'\n"
                       "wal_level = replica\nmax_wal_senders = 5\nwal_log_hints = on\n"
                       "hot_standby = on\nfsync = on\nmax_connections = 100\n"
                       "wal_keep_size = '256MB'\nlogging_collector = off\n")
        hba = server.data / "pg_hba.conf"
        other = (f"host all all {ipaddress.ip_network(f'{self.also_on}/16', strict=False)} "
                 "trust\n" if self.also_on else "")
        hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n" + other +
                       "local replication all trust\nhost replication all 127.0.0.1/32 trust\n")
        subprocess.run(["chown", "-R", f"{USER}:{USER}", str(server.directory)], check=True)

    async def start_server(self, server: PgServer) -> None:
        """Start `server` (`pg_ctl start -w`), logging to its directory."""
        await self.run("pg_ctl", "start", "-w", "-t", str(int(STEP_TIMEOUT_S)),
                       "-D", str(server.data), "-l", str(server.directory / "server.log"))

    async def sql(self, server: PgServer, statement: str) -> str:
        """Run `statement` on `server` with psql; its unaligned output."""
        return (await self.run("psql", "-X", "-A", "-t", "-h", "127.0.0.1", "-p",
                               str(server.port), "-U", USER, "-d", "postgres", "-c",
                               statement)).strip()

    async def make_synchronous(self, primary: PgServer) -> None:
        """Commits on `primary` wait for a standby's flush from now on."""
        await self.sql(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
        await self.sql(primary, "SELECT pg_reload_conf()")

    async def kill_primary(self) -> PgServer:
        """kill -9 the primary's postmaster (its backends exit with it); returns it."""
        killed = self.primary
        pid = killed.postmaster_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            for _ in range(200):  # its backends notice the postmaster's death
                if not (killed.data / "postmaster.pid").exists() or \
                        killed.postmaster_pid() is None:
                    break
                await asyncio.sleep(0.05)
        return killed

    async def promote(self) -> PgServer:
        """Promote the standby (`pg_ctl promote -w`): it is the primary, alone (asynchronous
        until a standby rejoins). Returns it."""
        new = self.standby
        await self.run("pg_ctl", "promote", "-w", "-t", str(int(STEP_TIMEOUT_S)),
                       "-D", str(new.data))
        if self.synchronous:
            await self.sql(new, "ALTER SYSTEM SET synchronous_standby_names = ''")
            await self.sql(new, "SELECT pg_reload_conf()")
        self.primary = new
        return new

    async def failover(self) -> PgServer:
        """kill -9 the primary and promote the standby (started first if it was stopped: it
        then has only what it had received before); returns the new primary."""
        await self.kill_primary()
        if self.standby.postmaster_pid() is None:
            await self.start_server(self.standby)
        return await self.promote()

    async def rejoin(self) -> PgServer:
        """Bring the old primary (stopped) back as the standby of the new one: `pg_rewind`
        from the new primary, `standby.signal` and its `primary_conninfo`, start; then, with
        synchronous replication, commits wait for it again. Returns it."""
        old = self.standby
        if old.postmaster_pid() is not None:
            await self.run("pg_ctl", "stop", "-m", "immediate", "-D", str(old.data))
        with contextlib.suppress(FileNotFoundError):
            (old.data / "postmaster.pid").unlink()
        # pg_rewind reads the source's timeline from its control file, which a promoted
        # server updates at its first checkpoint
        await self.sql(self.primary, "CHECKPOINT")
        await self.run("pg_rewind", "--target-pgdata", str(old.data),
                       "--source-server", self.primary.conninfo())
        await asyncio.to_thread(self._follow, old)
        await self.start_server(old)
        if self.synchronous:
            await self.make_synchronous(self.primary)
        return old

    def _follow(self, server: PgServer) -> None:
        (server.data / "standby.signal").touch()
        with (server.data / "postgresql.auto.conf").open("a") as auto:
            auto.write(f"primary_conninfo = '{self.primary.conninfo()}'\n"
                       "synchronous_standby_names = ''\n")
        self._configure(server)

    async def restart_immediate(self, server: PgServer) -> None:
        """`pg_ctl restart -m immediate`: a crash and recovery of one server."""
        await self.run("pg_ctl", "restart", "-w", "-m", "immediate", "-t",
                       str(int(STEP_TIMEOUT_S)), "-D", str(server.data), "-l",
                       str(server.directory / "server.log"))

    async def stop_standby(self) -> None:
        """Stop the standby (`pg_ctl stop -m fast`): the primary's commits no longer reach
        it. With asynchronous replication they are acknowledged all the same, and a failover
        now loses them; with synchronous replication they wait for it."""
        await self.run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.standby.data))

    def log_tail(self, server: PgServer, lines: int = 20) -> str:
        """The end of `server`'s log."""
        with contextlib.suppress(OSError):
            text = (server.directory / "server.log").read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    async def remove(self) -> None:
        """Stop both servers (immediately) and remove the pair's directory."""
        for server in self.servers:
            pid = server.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGQUIT)  # immediate shutdown
        for server in self.servers:
            for _ in range(100):
                if server.postmaster_pid() is None:
                    break
                await asyncio.sleep(0.05)
        await asyncio.to_thread(shutil.rmtree, self.root, True)
