"""The operator's page (`eo operator`): one HTML page and the JSON it reads, behind the operators'
bearer tokens (`EO_OPERATOR_TOKENS`).

- `/`: the one route without a token (a browser loads it by address, without a header: it
  asks for the token), the page (operator_page.html): per endpoint its queues' depths, unfinished
  transactions and the oldest one's age, deferred clean-ups, dead letters by status and the
  rates of the protocol events; the tokens in flight and those dead letters keep; the dead
  letters waiting, with their reasons, and replay and discard buttons. The operator's token
  stays in the browser tab (sessionStorage); every call sends it as a bearer token.
- `/api/status`: what the page shows, as JSON (`Status`).
- `/api/dead-letters...`: the dead-letter API (entrypoints/dead_letter_api.py), mounted.

The event counts are summed from the `/metrics` of the consumers listed in
`EO_OPERATOR_METRICS_URLS` (their status URLs); the page turns two successive counts into
rates. Without them the page shows no rates.
"""

# no `from __future__ import annotations`: FastAPI reads the routes' annotations

import asyncio
import base64
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib.resources import files
from typing import Annotated, Any

import httpx
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse
from prometheus_client.parser import text_string_to_metric_families

from adapters.rabbitmq.topology import queue_depths
from application.dead_letters import DeadLetters
from application.ports import StoreInspection
from application.registry import Role
from entrypoints.dead_letter_api import (
    create_dead_letter_app,
    new_operator_app,
    operator_auth,
)
from entrypoints.service_spec import Service
from entrypoints.settings import Settings

#: seconds a scrape of one consumer's /metrics may take
SCRAPE_TIMEOUT_S = 3.0


def page_policy(page: str) -> str:
    """The Content-Security-Policy of the HTML `page`: its own inline `<script>` and
    `<style>` blocks (tags without attributes, by their SHA-256) and calls to its own
    origin, nothing else; no page may frame it."""

    def hashes(tag: str) -> str:
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page, re.DOTALL)
        digests = (base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()
                   for b in blocks)
        return " ".join(f"'sha256-{d}'" for d in digests) or "'none'"

    return (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; "
            "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
            "form-action 'none'")


async def event_counts(client: httpx.AsyncClient, urls: Sequence[str]
                       ) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """The sum over `urls` (status URLs) of `eo_events_total` by endpoint and event, and
    per URL "ok" or why its scrape failed (a consumer restarting: its counts start again)."""
    counts: dict[str, dict[str, float]] = {}
    scraped: dict[str, str] = {}

    async def scrape(url: str) -> str:
        response = await client.get(url.rstrip("/") + "/metrics", timeout=SCRAPE_TIMEOUT_S,
                                    follow_redirects=True)
        response.raise_for_status()
        return response.text

    texts = await asyncio.gather(*(scrape(u) for u in urls), return_exceptions=True)
    for url, text in zip(urls, texts, strict=True):
        if isinstance(text, BaseException):
            scraped[url] = f"{type(text).__name__}: {text}"
            continue
        scraped[url] = "ok"
        for family in text_string_to_metric_families(text):
            if family.name != "eo_events":
                continue
            for sample in family.samples:
                if sample.name == "eo_events_total":
                    endpoint = sample.labels.get("endpoint", "")
                    per = counts.setdefault(endpoint, {})
                    per[sample.labels["event"]] = per.get(sample.labels["event"], 0) + sample.value
    return counts, scraped


class Status:
    """`/api/status`: the service's state now, read from the databases, the broker, the
    dead-letter store and the consumers' metrics. Raises what those reads raise."""

    def __init__(self, settings: Settings, service: Service, dead_letters: DeadLetters,
                 inspection: StoreInspection, client: httpx.AsyncClient) -> None:
        self.settings, self.service = settings, service
        self.dead_letters, self.inspection, self.client = dead_letters, inspection, client

    async def __call__(self) -> dict[str, Any]:
        settings, registry = self.settings, self.service.registry
        consuming = registry.consuming()
        rest, depths, gauges, (events, scraped) = await asyncio.gather(
            self.inspection.at_rest(),
            queue_depths(settings.amqp(), consuming, settings.protocol.retry_delays_s),
            self.dead_letters.gauges(),
            event_counts(self.client, settings.operator.operator_metrics_urls))
        endpoints = {}
        for r in registry:
            depth = depths.get(r.name)
            endpoints[r.name] = {
                "role": str(r.role.value),
                "queues": None if depth is None else {
                    "work": depth.work, "retries": depth.retries,
                    "dead_letter": depth.dead_letter},
                "unfinished": rest.unfinished.get(r.name, 0),
                "oldest_unfinished_s": rest.oldest_unfinished_s.get(r.name, 0.0),
                "deferred_cleanups": rest.deferred_cleanups.get(r.name, 0),
                "dead_letters": gauges.counts.get(r.name, {}),
                "events": events.get(r.name, {}),
            }
        return {"at": datetime.now(UTC).isoformat(), "service": registry.service,
                "tokens_in_flight": rest.tokens - gauges.tokens,
                "dead_letter_tokens": gauges.tokens, "endpoints": endpoints,
                "metrics": scraped, "callees": registry.names(Role.CALLEE)}


def create_operator_app(dead_letters: DeadLetters, tokens: Mapping[str, str],
                        status: Callable[[], Awaitable[dict[str, Any]]]) -> FastAPI:
    """The page at `/`, `status` at `/api/status`, the dead-letter API under `/api`; every
    route but the page answers 401 without an operator's token (`tokens`: name -> token, at
    least one: ValueError otherwise), the OpenAPI documents (`/openapi.json`,
    `/api/openapi.json`) too. The page itself needs none: a browser loads it by address,
    without a header, and it asks for the token, which it sends with every call. Every
    response forbids framing (`SECURITY_HEADERS`); the page's policy runs its own inline
    script and style only (`page_policy`)."""
    operator = operator_auth(tokens)
    app = new_operator_app("Operator", __doc__ or "", operator)
    page = files("entrypoints").joinpath("operator_page.html").read_text()
    policy = page_policy(page)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page, headers={"Content-Security-Policy": policy})

    @app.get("/api/status")
    async def current(_by: Annotated[str, Depends(operator)]) -> dict[str, Any]:
        """The service's state now (see `Status`)."""
        return await status()

    app.mount("/api", create_dead_letter_app(dead_letters, tokens))
    return app
