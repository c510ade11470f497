"""The service's image as the processes of a test: `ImageFleet` starts `eo consume` and
`eo serve` in containers of the image named by `EO_TEST_IMAGE` (podman, the host's network,
so a container reaches the test's PostgreSQL, RabbitMQ and S3 API as the host does, and each
picks its own ports as a process does), with the settings `Fleet.env` gives a process.
`deploy/image/check` builds the image and runs these tests (tests/image/,
tests/sample/image/); without `EO_TEST_IMAGE` they are skipped.

Typical use::

    fleet = ImageFleet(where, blob_dir, log_dir, service=DEFAULT_SERVICE, image=IMAGE)
    ledger = fleet.start("ledger", EO_S3_ENDPOINT_URL=s3)   # podman run ... consume
    await fleet.ready(ledger)                                # its /ready answers 200
    ledger.popen.send_signal(signal.SIGTERM)                 # podman passes it on
    fleet.kill_all()                                         # podman rm -f what is left
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from entrypoints.settings import DEFAULT_SERVICE
from tests.support.processes import CONSUMER_URL, Fleet, Proc, Where, this_run

#: the image under test (`deploy/image/check` sets it), or None: the tests are skipped
IMAGE = os.environ.get("EO_TEST_IMAGE")

needs_image = pytest.mark.skipif(
    IMAGE is None or shutil.which("podman") is None,
    reason="EO_TEST_IMAGE names no image, or podman is missing: `deploy/image/check` "
           "builds the image and runs these tests")


def podman(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`podman <args>` (with the configuration `deploy/image/podman.sh` exported), its output
    as text; never raises on a non-zero status (the caller asserts it)."""
    return subprocess.run(["podman", *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False)


def run_image(image: str, *args: str, env: Mapping[str, str] | None = None,
              entrypoint: str | None = None, timeout_s: float = 120
              ) -> subprocess.CompletedProcess[str]:
    """`podman run --rm` of `image` on the host's network with `env` and `args`."""
    options = [f"--env={k}={v}" for k, v in (env or {}).items()]
    if entrypoint is not None:
        options.append(f"--entrypoint={entrypoint}")
    return podman("run", "--rm", "--network=host", *options, image, *args,
                  timeout_s=timeout_s)


@dataclass
class ImageFleet(Fleet):
    """`Fleet` whose processes are containers of `image`: the settings of `Fleet.env` that a
    service reads (`EO_*`, not the tests' `EO_TEST_*`, nor `EO_BLOB_DIR`: the image's own)
    go in as the container's environment. A process's `popen` is its `podman run`, which
    passes SIGTERM on to the service and exits with its status."""

    image: str = ""
    containers: list[str] = field(default_factory=list)

    def spawn(self, name: str, args: list[str], extra_env: Mapping[str, str | None],
              url: tuple[str, str] = CONSUMER_URL, ready_path: str = "/ready") -> Proc:
        env = {k: v for k, v in self.env(**extra_env).items()
               if k.startswith("EO_") and not k.startswith("EO_TEST_") and k != "EO_BLOB_DIR"}
        container = this_run(f"eo-image-{name}", "-")
        self.containers.append(container)
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                # read-only, as the Kubernetes manifests run it (podman mounts /tmp as tmpfs)
                ["podman", "run", "--rm", "--network=host", "--read-only",
                 f"--name={container}",
                 *(f"--env={k}={v}" for k, v in env.items()), self.image, *args],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = Proc(name, popen, log, url[0], url[1], ready_path)
        self.procs.append(proc)
        return proc

    def container_of(self, proc: Proc) -> str:
        """The name of `proc`'s container."""
        return self.containers[self.procs.index(proc)]

    def kill_all(self) -> None:
        """Remove every container this fleet started (killing what still runs), then reap
        their `podman run` processes."""
        for container in self.containers:
            podman("rm", "--force", "--time=0", container, timeout_s=60)
        super().kill_all()


@contextlib.contextmanager
def s3_api() -> Iterator[str]:
    """An S3 API on the host (moto, a free port of 127.0.0.1) as the containers reach it
    (the host's network); its URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def image_fleet(where: Where, log_dir: Path) -> AsyncIterator[ImageFleet]:
    """An `ImageFleet` of the service's registry on `where`, its logs in `log_dir`; every
    container it started is removed at the end."""
    assert IMAGE is not None
    started = ImageFleet(where, log_dir / "blobs", log_dir, service=DEFAULT_SERVICE,
                         image=IMAGE)
    try:
        yield started
    finally:
        await asyncio.to_thread(started.kill_all)
