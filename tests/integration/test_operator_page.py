"""The operator's page (`eo operator`, issue 26) in a real browser: Debian's chromium driven by
Playwright, against real `eo consume` processes of the counters service on PostgreSQL and
RabbitMQ. A message is dead-lettered (its handler fails), the operator signs in (a wrong token
is refused), sees the dead letter with its reason and the endpoint's state, fixes the cause
(the consumer restarted without the failure), clicks Replay, and sees it processed: the
dead letter leaves the page, the counter holds the amount once, no token is left. The page
works under its Content-Security-Policy (no framing, its own inline script and style only):
the browser blocks nothing.

`EO_OPERATOR_SCREENSHOT=<path>` keeps a screenshot of the page with the dead letter (the one
in docs/images/ was taken so). A database and a virtual host of this module's own."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import MappingProxyType

import asyncpg
import pytest

from adapters.postgres.token_store import PostgresTokenStore
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from tests.support.counters.endpoints import Add, Tally
from tests.support.processes import (
    Fleet,
    Rabbit,
    Where,
    fresh_fleet,
    states,
    until,
    where_for,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="the operator page's test drives Debian's chromium (apt-get install chromium; "
           "./dev test installs it as root)"), pytest.mark.slow]  # processes and a browser

TOKEN = "alice-operator-token-0123456789"


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for("eo_it_operator_page", "eo-it-operator-page") as found:
        yield found


@pytest.fixture
async def fleet(where: Where, tmp_path: Path) -> AsyncIterator[Fleet]:
    async with fresh_fleet(where, tmp_path) as started:
        yield started


async def test_an_operator_sees_a_dead_letter_and_replays_it_after_the_fix(
        fleet: Fleet, rabbit: Rabbit, pool: asyncpg.Pool) -> None:
    from playwright.async_api import async_playwright, expect

    tokens = PostgresTokenStore(pool)
    broken = fleet.start("counter", EO_DEAD_LETTER_COLLECT="true", EO_MAX_ATTEMPTS="1",
                         EO_FAILPOINTS="after_handler=raise")  # the cause, fixed below
    await fleet.ready(broken)
    letter = Envelope(uuid.uuid4(), "Add", encode(Add("op", 4)),
                      MappingProxyType({TOKEN_HEADER: "1"}))
    await tokens.create("counter", [letter])
    await rabbit.publish("counter", letter.body, str(letter.message_id), letter.type,
                         dict(letter.headers))

    async def kept() -> bool:
        return await pool.fetchval("SELECT count(*) FROM eo_dead_letter") == 1

    await until(kept, 30, "the dead letter moved into the store", fleet, rabbit)
    broken.popen.terminate()  # the fix: the consumer without the failure
    assert await fleet.exit_code(broken, 20) == 0, broken.tail()
    healthy = fleet.start("counter", EO_DEAD_LETTER_COLLECT="true")
    await fleet.ready(healthy)
    assert healthy.url is not None
    page = fleet.spawn("operator", ["operator"], {
        "EO_OPERATOR_TOKENS": json.dumps({"alice": TOKEN}), "EO_OPERATOR_PORT": "0",
        "EO_OPERATOR_METRICS_URLS": json.dumps([healthy.url])},
        url=("operator.serving", "url"), ready_path="/")
    await fleet.ready(page)
    assert page.url is not None

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox"] if os.geteuid() == 0 else [])
        try:
            tab = await browser.new_page(viewport={"width": 1400, "height": 700})
            refused: list[str] = []  # what the page's Content-Security-Policy blocked
            tab.on("console", lambda m: refused.append(m.text)
                   if "Content Security Policy" in m.text else None)
            loaded = await tab.goto(page.url + "/?refresh_ms=500")
            assert loaded is not None
            assert loaded.headers["x-frame-options"] == "DENY"
            assert "frame-ancestors 'none'" in loaded.headers["content-security-policy"]
            await tab.fill("#token", "not-a-token")
            await tab.click("text=Sign in")
            await expect(tab.locator("#refused")).to_have_text(
                "That token is not an operator's.")
            await tab.fill("#token", TOKEN)
            await tab.click("text=Sign in")

            row = tab.locator("#dead-letters tbody tr").first
            await expect(row.locator("td.reason")).to_contain_text(
                "retries exhausted after 1 attempts")
            await expect(row).to_contain_text(str(letter.message_id))
            counter = tab.locator('#endpoints tr[data-endpoint="counter"]')
            await expect(counter).to_contain_text("dead 1")
            await expect(tab.locator("#totals")).to_contain_text(
                "tokens kept by dead letters: 1")
            await expect(tab.locator("#totals")).to_contain_text(
                "consumers' metrics read: 1 of 1")
            if shot := os.environ.get("EO_OPERATOR_SCREENSHOT"):
                await tab.screenshot(path=shot, full_page=True)

            await row.locator("text=Replay").click()
            await expect(tab.locator("#message")).to_contain_text("replay done")
            await expect(tab.locator("#dead-letters tbody")).to_have_text("none")
            await expect(counter).to_contain_text("replayed 1")
            await expect(tab.locator("#totals")).to_contain_text(
                "tokens in flight: 0 · tokens kept by dead letters: 0", timeout=15_000)
            await expect(counter).to_contain_text("transaction.committed", timeout=15_000)
            assert not refused  # the policy lets the page's own script and style run
        finally:
            await browser.close()

    tally = (await states(pool, "counter", Tally)).get("op")
    assert tally is not None
    assert tally.total == 4  # processed once
    assert await tokens.count() == 0
    (replayed,) = page.events("dead_letter.replayed")
    assert replayed["by"] == "alice"
