"""Broker URLs: safe to log (`redacted`), and a cluster's nodes as URLs (`broker_urls`).
Imports no driver: settings and start-up use it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from yarl import URL


def redacted(url: str) -> str:
    """`url` with its password replaced by `******`, safe to log."""
    parsed = URL(url)
    return str(parsed.with_password("******")) if parsed.password else url


def broker_urls(url: str, addresses: Sequence[str] = ()) -> list[str]:
    """`url`, then `url` with the host and port of each of `addresses` (`host:port`,
    `[v6]:port`): a cluster's nodes, with the URL's user, password, vhost and options.
    Raises ValueError for an address that is not host:port."""
    urls = [url]
    for address in addresses:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"{address!r} is not host:port")
        urls.append(str(URL(url).with_host(host.strip("[]")).with_port(int(port))))
    return urls


async def first_answering(urls: Sequence[str], connect: Callable[[str], Awaitable[None]],
                          errors: tuple[type[BaseException], ...],
                          failed: Callable[[str, BaseException], None] | None = None) -> str:
    """`await connect(url)` for each of `urls` in order until one returns; that URL. A failure
    of `errors` is told to `failed(url, error)` and the next URL tried; when every one
    failed, the last failure is raised (another error at once)."""
    failure: BaseException | None = None
    for url in urls:
        try:
            await connect(url)
        except errors as exc:
            failure = exc
            if failed is not None:
                failed(url, exc)
            continue
        return url
    if failure is None:
        raise ValueError("no URL to connect to")
    raise failure


async def connect_first(urls: str | Sequence[str], **options: Any) -> Any:
    """An aio-pika connection (`aio_pika.connect(url, **options)`, within 10 s unless
    `timeout` says otherwise: a paused node accepts the TCP connection and never answers)
    to the first of `urls` (one URL, or a cluster's nodes) that answers: tools and commands
    that open a connection of their own reach the cluster while a node is down. Raises the
    last node's error when none answers."""
    import aio_pika  # settings import this module: the driver only where a command connects

    options.setdefault("timeout", 10.0)

    connected: list[Any] = []

    async def connect(url: str) -> None:
        connected.append(await aio_pika.connect(url, **options))

    await first_answering([urls] if isinstance(urls, str) else urls, connect,
                          (OSError, TimeoutError, aio_pika.exceptions.AMQPError))
    return connected[0]
