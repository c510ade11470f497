"""The operators' two HTTP servers in process (httpx's ASGI transport, the counters service's
memory adapters): the dead-letter API (entrypoints/dead_letter_api.py, `eo dead-letters
serve`) and the operator's page with the same API under `/api` (entrypoints/operator_page.py,
`eo operator`). Nothing answers without a token but the page itself (the OpenAPI documents
included; no Swagger UI or ReDoc); bad input (IDs past PostgreSQL's bigint, ages past 100
years) gets a 422 naming the field and the limit, never the input echoed back; every
response forbids framing, sniffing and referrers. The same
servers as processes: tests/integration/test_dead_letter_process.py,
tests/integration/test_operator_page.py (in a browser)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from adapters.memory.dead_letter_store import MemoryDeadLetterStore
from entrypoints.dead_letter_api import create_dead_letter_app
from entrypoints.operator_page import create_operator_app
from tests.support.counters.harness import counters

TOKEN = "alice-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TOO_BIG_ID = "99999999999999999999"  # past PostgreSQL's bigint: asyncpg overflowed, a 500


async def _status() -> dict[str, Any]:
    return {"service": "counters", "endpoints": {}}


def _app(server: str) -> FastAPI:
    system = counters()
    operations = system.system.dead_letters(MemoryDeadLetterStore(system.clock))
    if server == "dead-letters":
        return create_dead_letter_app(operations, {"alice": TOKEN})
    return create_operator_app(operations, {"alice": TOKEN}, _status)


#: each server, and where its dead-letter API is
SERVERS = {"dead-letters": "", "operator": "/api"}


@pytest.fixture(params=list(SERVERS))
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """(a client of the server, the prefix of its dead-letter API)."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(request.param)),
                                 base_url="http://operator") as client:
        yield client, SERVERS[request.param]


async def test_nothing_answers_without_a_token_but_the_page_that_asks_for_it(
        server: tuple[httpx.AsyncClient, str]) -> None:
    client, api = server
    documents = ["/openapi.json", f"{api}/openapi.json"]
    uis = [f"{root}{ui}" for root in {"", api}
           for ui in ("/docs", "/docs/oauth2-redirect", "/redoc")]
    routes = [f"{api}/dead-letters", f"{api}/dead-letters/1", *(["/api/status"] if api else [])]
    for path in [*documents, *uis, *routes]:
        answer = await client.get(path)
        assert answer.status_code in (401, 404), (path, answer.status_code)
    for path in uis:  # turned off: they load their scripts from a CDN
        assert (await client.get(path, headers=AUTH)).status_code == 404, path
    schema = (await client.get(f"{api}/openapi.json", headers=AUTH)).json()
    assert "/dead-letters/{dead_letter_id}" in schema["paths"]
    if api:
        assert "/api/status" in (await client.get("/openapi.json", headers=AUTH)).json()["paths"]
        page = await client.get("/")  # the browser loads it without a token, then asks for one
        assert (page.status_code, page.headers["content-type"]) == (200,
                                                                    "text/html; charset=utf-8")


@pytest.mark.parametrize(("method", "path", "body", "field", "limit"), [
    ("GET", f"/dead-letters/{TOO_BIG_ID}", None, "dead_letter_id", "9223372036854775807"),
    ("GET", "/dead-letters/0", None, "dead_letter_id", "1"),
    ("POST", f"/dead-letters/{TOO_BIG_ID}/replay", None, "dead_letter_id",
     "9223372036854775807"),
    ("POST", f"/dead-letters/{TOO_BIG_ID}/discard", {"why": "duplicate"}, "dead_letter_id",
     "9223372036854775807"),
    ("GET", "/dead-letters?older_than_s=1e308", None, "older_than_s", "3155760000"),
    ("GET", "/dead-letters?newer_than_s=inf", None, "newer_than_s", "finite"),
    ("GET", "/dead-letters?older_than_s=nan", None, "older_than_s", "finite"),
    ("POST", "/dead-letters/replay", {"ids": [2**63], "all": True}, "ids",
     "9223372036854775807"),
    ("POST", "/dead-letters/discard", {"older_than_s": 1e308, "why": "old", "all": True},
     "older_than_s", "3155760000"),
])
async def test_ids_and_ages_out_of_range_are_a_422_naming_the_field_and_the_limit(
        server: tuple[httpx.AsyncClient, str], method: str, path: str, body: Any,
        field: str, limit: str) -> None:
    client, api = server
    answer = await client.request(method, api + path, json=body, headers=AUTH)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert field in error
    assert limit in error


async def test_a_validation_error_never_echoes_the_input_back(
        server: tuple[httpx.AsyncClient, str]) -> None:
    client, api = server
    why = "x" * 5_000_000
    for path in ("/dead-letters/1/discard", "/dead-letters/discard"):
        answer = await client.post(api + path, json={"why": why, "all": True}, headers=AUTH)
        assert answer.status_code == 422
        assert len(answer.content) < 2000, answer.content[:200]
        assert "why" in answer.json()["error"]
        assert "at most 1000 characters" in answer.json()["error"]
    # many invalid items: a bounded list of errors, the rest counted
    answer = await client.post(api + "/dead-letters/replay", headers=AUTH,
                               json={"ids": ["x"] * 100_000, "all": True})
    assert answer.status_code == 422
    assert len(answer.content) < 4000
    assert "and 99999 more" in answer.json()["error"]


def _hashes(page: str, tag: str) -> set[str]:
    return {"'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"
            for text in re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)}


async def test_every_response_forbids_framing_sniffing_and_referrers(
        server: tuple[httpx.AsyncClient, str]) -> None:
    client, api = server
    answers = [await client.get(f"{api}/dead-letters", headers=AUTH),  # 200
               await client.get(f"{api}/dead-letters"),  # 401
               await client.get(f"{api}/nowhere", headers=AUTH),  # 404
               await client.get(f"{api}/dead-letters/x", headers=AUTH),  # 422
               await client.post(f"{api}/dead-letters/replay", json={}, headers=AUTH)]  # 400
    if api:
        answers.append(await client.get("/"))
    assert [a.status_code for a in answers] == [200, 401, 404, 422, 400, 200][:len(answers)]
    for answer in answers:
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["referrer-policy"] == "no-referrer"
        policy = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy
    if api:  # the page runs its own inline script and style, and nothing else
        page = answers[-1]
        directives = dict(d.strip().split(" ", 1)
                          for d in page.headers["content-security-policy"].split(";"))
        assert set(directives["script-src"].split()) == _hashes(page.text, "script")
        assert set(directives["style-src"].split()) == _hashes(page.text, "style")
        assert directives["default-src"] == "'none'"
