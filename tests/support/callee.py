"""The counters' `bank` callee served over real HTTP (uvicorn on port 0, in this event loop,
on memory stores) with the httpx caller beside it: what the HTTP integration tests and the
`HttpRequests` contract suite share."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from adapters.http.client import HttpxRequests, http_client_resource
from application.codec import encode
from entrypoints.callee_app import create_callee_app
from entrypoints.status import StatusServer, listening_socket
from tests.support.counters.endpoints import Account, Withdraw
from tests.support.counters.harness import Counters, counters

TOKEN, ACCOUNT, LIMIT = "s3cret-token", "acct", 4096


def withdrawal(amount: int, account: str = ACCOUNT) -> bytes:
    """The JSON body of a bank request withdrawing `amount` from `account`."""
    return encode(Withdraw(account, amount))


class BankView:
    """What a test reads of the bank: its handler runs and the test account's balance."""

    counters: Counters

    def runs(self) -> int:
        return self.counters.runs("bank")

    def balance(self) -> int:
        account = self.counters.state("bank", ACCOUNT)
        assert isinstance(account, Account)
        return account.balance


@dataclass
class Callee(BankView):
    """A served bank: the counters on memory stores, base URL, raw client and the adapter."""

    counters: Counters
    base: str
    client: httpx.AsyncClient
    http: HttpxRequests

    def url(self, request_id: uuid.UUID | str) -> str:
        return f"{self.base}/requests/{request_id}"


@asynccontextmanager
async def serve(failpoints: str | None = None, balance: int = 500, timeout_s: float = 5.0,
                token: str = TOKEN) -> AsyncIterator[Callee]:
    """uvicorn on 127.0.0.1 (port 0) in this event loop, serving the bank callee with bearer
    token `token`."""
    c = counters(failpoints)
    c.open_account(ACCOUNT, balance)
    server = StatusServer(create_callee_app(c.bank, token, LIMIT),
                          listening_socket("127.0.0.1", 0))
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    resource = http_client_resource(timeout_s)
    client = await anext(resource)
    try:
        yield Callee(c, base, client, HttpxRequests(client, {base: token}))
    finally:
        await resource.aclose()
        await server.stop()


