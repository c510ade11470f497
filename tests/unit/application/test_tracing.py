"""Tracing of the protocol's steps (application.ports.Tracer on OpenTelemetry, spans kept by
an in-memory exporter): a message's span continues the trace its headers carry, its outputs
carry the attempt's trace context as part of the committed message, a batch links every
message's trace, and nothing is traced or added when tracing is off."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from types import MappingProxyType

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from adapters.memory.apis import SandboxApis
from application.assembly import build_processor
from application.envelope import TOKEN_HEADER, TRACEPARENT_HEADER, Envelope
from application.errors import PermanentError
from application.outcome import Outcome
from application.ports import ApiPolicy
from application.ports.null_tracer import NULL_TRACER
from application.processor import Processor
from entrypoints.tracing import Tracing, tracing_from
from tests.support.counter import COUNTER, PLAIN_COUNTER
from tests.support.shipping import SHIPPING, Ship
from tests.support.world import World

#: a W3C trace context an upstream sender's attempt would have written
UPSTREAM_TRACE = "0af7651916cd43dd8448eb211c80319c"
UPSTREAM = {TRACEPARENT_HEADER: f"00-{UPSTREAM_TRACE}-b7ad6b7169203331-01"}


@pytest.fixture
def exported() -> Iterator[tuple[Tracing, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracing = tracing_from("test", environ={}, exporter=exporter)
    assert tracing is not None
    try:
        yield tracing, exporter
    finally:
        tracing.close()


def _processor(world: World, tracing: Tracing | None, **kwargs: object) -> Processor:
    ports = replace(world.ports(), tracer=tracing.tracer if tracing else NULL_TRACER)
    return build_processor(world.endpoint, ports, world.strategy, **kwargs)  # type: ignore[arg-type]


async def _send(world: World, partition: str, n: int,
                headers: dict[str, str] | None = None) -> Envelope:
    envelope = Envelope(uuid.UUID(int=n), "Add", f'{{"partition":"{partition}","amount":{n}}}'
                        .encode(), MappingProxyType({TOKEN_HEADER: "1", **(headers or {})}))
    await world.tokens.create(world.endpoint.name, [envelope])
    return envelope


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _trace_of(traceparent: str) -> str:
    return traceparent.split("-")[1]


async def test_a_message_continues_its_trace_and_its_output_carries_the_attempt() -> None:
    exporter = InMemorySpanExporter()
    tracing = tracing_from("test", environ={}, exporter=exporter)
    assert tracing is not None
    try:
        world = World(COUNTER, seed=1)  # a blob: the artifact's registration is a span too
        delivery = await _send(world, "p", 1, UPSTREAM)
        assert await _processor(world, tracing).process(delivery) is Outcome.PROCESSED
    finally:
        tracing.close()
    spans = exporter.get_finished_spans()
    [process] = _by_name(spans, "process counter")
    [attempt] = _by_name(spans, "attempt")
    [commit] = _by_name(spans, "commit")
    [finish] = _by_name(spans, "finish")
    [publish] = _by_name(spans, "publish message")
    [create] = _by_name(spans, "create blob")
    assert {format(s.context.trace_id, "032x") for s in spans} == {UPSTREAM_TRACE}
    assert _parent(process) == 0xb7ad6b7169203331
    assert dict(process.attributes or {})["eo.outcome"] == "processed"
    assert dict(process.attributes or {})["messaging.message.id"] == str(delivery.message_id)
    for child in (commit, finish, create):
        assert _parent(child) == attempt.context.span_id
    assert _parent(attempt) == process.context.span_id
    assert _parent(publish) == finish.context.span_id
    [(destination, output)] = world.dispatcher.sent
    assert destination == "audit"
    # the output's trace context is the attempt's: committed with the message
    traceparent = output.headers[TRACEPARENT_HEADER]
    assert _trace_of(traceparent) == UPSTREAM_TRACE
    assert traceparent.split("-")[2] == format(attempt.context.span_id, "016x")
    # and the token the commit inserted holds the same headers the delivery carried
    stored = await world.tokens.get("audit", output.message_id)
    assert stored is not None
    assert stored.headers[TRACEPARENT_HEADER] == traceparent


async def test_a_batch_links_every_message_and_each_message_keeps_its_own_trace(
        exported: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracing, exporter = exported
    world = World(PLAIN_COUNTER, seed=2, colocated=True)
    other = "4bf92f3577b34da6a3ce929d0e0e4736"
    first = await _send(world, "p", 1, UPSTREAM)
    second = await _send(world, "q", 2, {TRACEPARENT_HEADER: f"00-{other}-00f067aa0ba902b7-01"})
    processor = _processor(world, tracing)
    assert processor.batches
    assert await processor.process_batch([first, second]) == [Outcome.PROCESSED] * 2
    spans = exporter.get_finished_spans()
    [batch] = _by_name(spans, "process batch counter")
    assert {format(link.context.trace_id, "032x") for link in batch.links} == {UPSTREAM_TRACE,
                                                                                other}
    messages = _by_name(spans, "process counter")
    assert {format(s.context.trace_id, "032x") for s in messages} == {UPSTREAM_TRACE, other}
    assert all(s.attributes is not None and s.attributes["eo.outcome"] == "processed"
               for s in messages)
    [commit] = _by_name(spans, "commit")  # one statement for both
    assert _parent(commit) == batch.context.span_id
    spans_by_trace = {format(s.context.trace_id, "032x"): s for s in messages}
    for _, output in world.dispatcher.sent:  # each output in its own message's trace
        incoming = output.headers["eo-causation-id"]
        trace = UPSTREAM_TRACE if incoming == first.id_text else other
        assert _trace_of(output.headers[TRACEPARENT_HEADER]) == trace
        assert output.headers[TRACEPARENT_HEADER].split("-")[2] == format(
            spans_by_trace[trace].context.span_id, "016x")


async def test_a_failure_marks_the_message_span_failed(
        exported: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracing, exporter = exported
    world = World(PLAIN_COUNTER, seed=3)
    bad = Envelope(uuid.UUID(int=9), "Add", b'{"partition": 1}', MappingProxyType(
        {TOKEN_HEADER: "1", **UPSTREAM}))
    await world.tokens.create(world.endpoint.name, [bad])
    with pytest.raises(PermanentError):
        await _processor(world, tracing).process(bad)
    [process] = _by_name(exporter.get_finished_spans(), "process counter")
    assert process.status.status_code is StatusCode.ERROR
    assert any(event.name == "exception" for event in process.events)


async def test_without_a_tracer_nothing_is_traced_and_outputs_carry_no_trace_context(
        exported: tuple[Tracing, InMemorySpanExporter]) -> None:
    _, exporter = exported
    world = World(PLAIN_COUNTER, seed=4)
    delivery = await _send(world, "p", 1, UPSTREAM)
    assert await _processor(world, None).process(delivery) is Outcome.PROCESSED
    assert exporter.get_finished_spans() == ()
    [(_, output)] = world.dispatcher.sent
    assert TRACEPARENT_HEADER not in output.headers


async def test_a_third_party_call_is_a_client_span_in_the_follow_ups_trace(
        exported: tuple[Tracing, InMemorySpanExporter]) -> None:
    tracing, exporter = exported
    world = World(SHIPPING, seed=7, apis=SandboxApis(),
                  api_policies={"carrier": ApiPolicy(timedelta(hours=1))})
    ship = await world.send(Ship("o-1", 10))
    assert await _processor(world, tracing).process(ship) is Outcome.PROCESSED
    [follow_up] = [e for _, e in world.dispatcher.sent if e.type == "Booked"]
    assert await _processor(world, tracing).process(follow_up) is Outcome.PROCESSED
    [call] = _by_name(exporter.get_finished_spans(), "call carrier")
    attributes = dict(call.attributes or {})
    assert attributes["eo.idempotency_key"] == follow_up.id_text
    assert attributes["http.response.status_code"] == 201
    assert _trace_of(follow_up.headers[TRACEPARENT_HEADER]) == format(
        call.context.trace_id, "032x")
