"""An in-process moto S3 server: the `local` profile's blob endpoint when none is set, and
the tests'."""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moto.server import ThreadedMotoServer


class MotoServer:
    """moto's S3 API served over HTTP from a daemon thread on `host`:`port` (port 0: a free
    one, chosen by the OS).

    Everything is kept in memory and lost when the process exits. moto's backends are
    process-wide: every `MotoServer` in one process serves the same buckets. moto handles a
    few hundred requests per second: enough for a demo and tests, not for a benchmark.
    With `quiet`, werkzeug's per-request log lines are dropped (the `werkzeug` logger is set
    to WARNING for the whole process).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, quiet: bool = True) -> None:
        self.host = host
        self.port = port
        self.quiet = quiet
        self._server: ThreadedMotoServer | None = None
        self._endpoint_url: str | None = None

    @property
    def endpoint_url(self) -> str | None:
        """`http://host:port` while serving, else None."""
        return self._endpoint_url

    def start(self) -> str:
        """Serve (idempotent) and return the endpoint URL, `http://host:port`.

        Sets AWS_EC2_METADATA_DISABLED=true unless already set, so that a client without
        credentials fails at once instead of probing the EC2 metadata service. Raises OSError
        when a fixed `port` is taken.
        """
        if self._endpoint_url is not None:
            return self._endpoint_url
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
        if self.port:
            # ThreadedMotoServer binds in its thread and would wait forever for a port in use.
            with socket.create_server((self.host, self.port)):
                pass
        if self.quiet:
            logging.getLogger("werkzeug").setLevel(logging.WARNING)
        # Imported here: moto is heavy, and only this profile and the tests need it.
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=not self.quiet)
        server.start()
        host, port = server.get_host_and_port()
        self._server = server
        self._endpoint_url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return self._endpoint_url

    def stop(self) -> None:
        """Stop serving and wait for the thread (idempotent; moto's data stays in memory)."""
        server, self._server, self._endpoint_url = self._server, None, None
        if server is not None:
            server.stop()
