"""Assembling an endpoint's processor, sweeper and callee from its ports: each collaborator
gets only the ports it uses. The composition roots (entrypoints/) and the tests build through
these functions."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from application import defaults
from application.api_caller import ApiCaller
from application.claim_check import ClaimCheck, ReadApart, ReadWithTheRecord
from application.consumption import (
    ConsumedByTheClear,
    Consumption,
    DeletedBeforeTheClear,
)
from application.failpoints import Failpoints, or_no_failpoints
from application.finisher import Finisher
from application.handler_runner import HandlerRunner
from application.http_callee import HttpCallee
from application.http_caller import HttpCaller
from application.outbox_path import OutboxPath
from application.outgoing_tokens import CreatedBeforeTheCommit, InsertedByTheCommit, OutgoingTokens
from application.ports import Inbox, IncomingTokens, Ports, RequestStore
from application.preparation import Preparation
from application.processor import Path, Processor
from application.side_effects import SideEffects
from application.state_path import StatePath
from application.strategy import Strategy
from application.sweeper import Sweeper
from application.token_batch import TokenBatch
from application.token_path import AddressedTokens, TokenPath
from application.transactional_path import PathParts, Steps
from domain.decisions import Endpoint


def incoming_tokens(name: str, ports: Ports) -> IncomingTokens:
    """The tokens endpoint `name` consumes: `ports.incoming` (a callee's stored requests), or
    its addressed tokens in `ports.tokens`."""
    return ports.incoming or AddressedTokens(ports.tokens, name)


def build_finisher(name: str, ports: Ports, failpoints: Failpoints | None = None,
                   cleanup_grace: timedelta = defaults.CLEANUP_GRACE,
                   strategy: Strategy = Strategy.TOKEN) -> Finisher:
    """The `finish` of endpoint `name` (protocol 3.1) with its side-effect kinds; on the
    outbox strategy it consumes no token (its messages come with none). `failpoints`: None
    for none configured, as `Failpoints.from_spec` gives it (so for every builder here)."""
    fp = or_no_failpoints(failpoints)
    effects = SideEffects(ports.tokens, ports.dispatcher, ports.blobs, ports.http, fp)
    return Finisher(name, ports.store, consumption(name, ports, strategy), effects,
                    ports.clock, ports.events, fp, cleanup_grace, ports.tracer)


def consumption(name: str, ports: Ports, strategy: Strategy = Strategy.TOKEN) -> Consumption:
    """How endpoint `name`'s `finish` consumes its incoming token: the one place where
    whether the tokens share the partition store's database decides it (protocol 3.2)."""
    if strategy is not Strategy.TOKEN:
        return DeletedBeforeTheClear(None)  # the outbox path: its messages have no token
    if ports.colocated_tokens and ports.incoming is None:
        return ConsumedByTheClear()
    return DeletedBeforeTheClear(incoming_tokens(name, ports))


def outgoing_tokens(ports: Ports) -> OutgoingTokens:
    """Where outgoing messages' tokens are made: by the commit when they share the
    partition store's database (protocol 3.2), else before it, in the token store."""
    return InsertedByTheCommit() if ports.colocated_tokens else CreatedBeforeTheCommit(
        ports.tokens)


def claim_check(ports: Ports) -> ClaimCheck:
    """Where the token path reads its tokens: with the transaction record when they share
    the partition store's database (protocol 3.2), else apart."""
    return ReadWithTheRecord() if ports.colocated_tokens else ReadApart()


def build_processor(
    endpoint: Endpoint[Any],
    ports: Ports,
    strategy: Strategy = Strategy.TOKEN,
    failpoints: Failpoints | None = None,
    conflict_retries: int = defaults.CONFLICT_RETRIES,
    cleanup_grace: timedelta = defaults.CLEANUP_GRACE,
    max_state_bytes: int | None = None,
) -> Processor:
    """A new worker of `endpoint` on `ports` with `strategy`: its own partition locks, as a
    separate process would have (competing workers meet only in the stores). Raises
    ValueError for co-located tokens on a store that holds none, or the state strategy
    without a state stream. The HTTP callee passes `failpoints.scoped("callee.")`.
    `max_state_bytes`: the bound of a partition's state (`HandlerRunner`)."""
    if ports.colocated_tokens and not ports.store.holds_tokens:
        raise ValueError("colocated_tokens needs a transactional store that holds tokens")
    failpoints = or_no_failpoints(failpoints)
    name, runner = endpoint.name, HandlerRunner(endpoint, max_state_bytes)
    finisher, batch = None, None
    path: Path
    if strategy is Strategy.STATE:
        if ports.state_stream is None:
            raise ValueError(f"endpoint {name}: the state strategy needs a state stream")
        path = StatePath(name, runner, ports.state_stream, ports.dispatcher,
                         ports.clock, ports.ids, ports.events, failpoints, ports.tracer)
    else:
        finisher = build_finisher(name, ports, failpoints, cleanup_grace, strategy)
        api = (ApiCaller(name, ports.apis, ports.api_policies, ports.clock, ports.events,
                         failpoints, tracer=ports.tracer) if ports.api_policies else None)
        preparation = Preparation(name, ports.store, outgoing_tokens(ports), ports.clock,
                                  ports.ids, failpoints, ports.blobs, ports.http,
                                  ports.services, ports.renderer, ports.token_receivers,
                                  ports.tracer, api)
        own = incoming_tokens(name, ports)
        caller = HttpCaller(ports.http, own, ports.store, failpoints, api)
        steps = Steps(PathParts(name, runner, ports.store, preparation, finisher, caller,
                                ports.clock, ports.ids, ports.events, failpoints,
                                ports.tracer))
        if strategy is Strategy.TOKEN:
            path = TokenPath(steps, own, claim_check(ports))
            if ports.colocated_tokens and ports.incoming is None:  # batches need both
                batch = TokenBatch(steps)
        else:
            path = OutboxPath(steps, ports.store, ports.dispatcher, ports.clock)
    return Processor(name, path, runner, ports.events, conflict_retries, finisher, batch,
                     ports.tracer)


def build_callee(endpoint: Endpoint[Any], ports: Ports, requests: RequestStore,
                 request_type: str, failpoints: Failpoints | None = None,
                 conflict_retries: int = defaults.CONFLICT_RETRIES,
                 cleanup_grace: timedelta = defaults.CLEANUP_GRACE,
                 max_state_bytes: int | None = None) -> HttpCallee:
    """The HTTP callee of `endpoint` (protocol 6): its stored requests are its tokens, so its
    processor runs the token path on `requests` (never a co-located token table); the tokens
    of the messages it sends go to `ports.tokens` as anyone's. `failpoints` are the callee's
    (`callee.` names: pass `failpoints.scoped("callee.")`)."""
    callee_ports = replace(ports, incoming=requests, colocated_tokens=False)
    processor = build_processor(endpoint, callee_ports, Strategy.TOKEN, failpoints,
                                conflict_retries, cleanup_grace, max_state_bytes)
    return HttpCallee(processor, requests, ports.store, ports.clock, request_type,
                      or_no_failpoints(failpoints))


def build_sweeper(name: str, ports: Ports, finisher: Finisher,
                  stale_after: timedelta = defaults.STALE_AFTER,
                  grace: timedelta = defaults.CLEANUP_GRACE,
                  retention: timedelta = defaults.RETENTION,
                  requests: RequestStore | None = None, inbox: Inbox | None = None) -> Sweeper:
    """The sweeper of endpoint `name` (protocol 8), finishing through `finisher`."""
    return Sweeper(name, ports.store, finisher, ports.clock, ports.events, stale_after, grace,
                   retention, requests, inbox)
