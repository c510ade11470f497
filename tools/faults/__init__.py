"""Production's faults on one machine, on servers of their own: a RabbitMQ cluster
(`rabbit_cluster`), a PostgreSQL primary and standby (`pg_pair`)."""

from __future__ import annotations

import socket

#: RabbitMQ's CLI tools' own distribution ports (its default range): never a server's
CLI_PORTS = range(35672, 35683)


def free_port(taken: set[int]) -> int:
    """A free TCP port of 127.0.0.1 that is neither in `taken` nor a CLI tools' port."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken and port not in CLI_PORTS:
            taken.add(port)
            return port
