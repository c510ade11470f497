"""Instructions per message of the bench's consumers, counted by valgrind's callgrind:
`python -m tools.bench.instructions [--runs token-batched,minimal-batched] [--messages N]
[--database-dsn DSN] [--out DIR]`.

`eo bench` measures CPU time, which moves by a quarter between runs on a shared 2-core
machine: a change worth 2 % of the consumer's work cannot be seen there. The number of
instructions the consumer process executes for the same drain moves far less (on this
project's machine: the same figure to 0.1 % for one tree, 1-2 % between runs hours apart,
from how deliveries happen to fall into batches), whatever else the machine is doing. This
runs `eo bench`'s runs (`tools.bench.run.run_bench`, same queues, producer and sink) with
each consumer process under `valgrind --tool=callgrind`, its instrumentation switched on
once the process is ready (imports and connections are not counted), and divides the
process's instructions by the messages it processed (the drain's and the latency phase's:
at least 50, at half of a much slower throughput).

It needs valgrind (Debian's `valgrind` package: `valgrind`, `callgrind_control`); the
consumer runs 20 to 50 times slower under it, so a run of 2,000 messages takes about a
minute. It counts user-space instructions of the Python process only: not PostgreSQL's,
RabbitMQ's or the kernel's. The callgrind files stay in `--out` for `callgrind_annotate`.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path
from typing import Any

from tools.bench.consumers import spawn_worker
from tools.bench.report import Params
from tools.bench.run import run_bench

#: the consumer starts 20-50 times slower under callgrind
START_TIMEOUT_S = 600.0
#: the drain's time bound grows by this (`Params.slowdown`): 2,000 messages drained in about
#: a minute on one machine and not in the plain run's 160 s on a slower one
CALLGRIND_SLOWDOWN = 10.0


def callgrind_total(path: Path) -> int:
    """The instruction count (`Ir`) of a callgrind output file; ValueError when it has
    none (the process did not finish writing it)."""
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"{path}: no instruction total")


async def measure(params: Params, out: Path) -> dict[str, float]:
    """{run label: instructions per processed message} for the runs of `params` (one
    consumer process each), the callgrind files in `out`. Raises RuntimeError without
    valgrind, or as `run_bench` does."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    if any(processes != 1 for _, processes in params.runs):
        raise ValueError("instruction counts are per consumer process: one process per run")
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)

    async def spawn(config: dict[str, Any]) -> asyncio.subprocess.Process:
        target = out / f"{config['path']}.callgrind"
        await asyncio.to_thread(target.unlink, missing_ok=True)
        prefix = ("valgrind", "--tool=callgrind", "--instr-atstart=no",
                  f"--callgrind-out-file={target}")
        proc = await spawn_worker(config, prefix, START_TIMEOUT_S)
        switched = await asyncio.create_subprocess_exec(
            "callgrind_control", "--instr=on", str(proc.pid),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        if await switched.wait() != 0:
            raise RuntimeError(f"callgrind_control could not reach pid {proc.pid}")
        return proc

    result = await run_bench(params, spawn=spawn)
    return {run.label: callgrind_total(out / f"{run.path}.callgrind") / run.at_rest["processed"]
            for run in result.runs}


def main() -> None:
    """Print the instructions per message of each run (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="token-batched,minimal-batched")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--database-dsn", default=Params.database_dsn)
    parser.add_argument("--out", type=Path, default=Path("var/instructions"))
    options = parser.parse_args()
    params = Params(messages=options.messages, partitions=options.partitions,
                    batch_size=options.batch_size, database_dsn=options.database_dsn,
                    latency_messages=50, slowdown=CALLGRIND_SLOWDOWN,
                    runs=tuple((path, 1) for path in options.runs.split(",")))
    counts = asyncio.run(measure(params, options.out))
    print(f"instructions per message, consumer process ({options.messages} messages, "
          f"{options.partitions} partitions, batches of {options.batch_size}; callgrind "
          f"files in {options.out}):")
    for label, count in counts.items():
        print(f"  {label:16} {count / 1000:8.1f} k")


if __name__ == "__main__":
    main()
