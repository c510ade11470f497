"""`StoreInspection` on the memory stores (the embedded profile and the test API)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.memory.inbox import MemoryInbox
from adapters.memory.request_store import MemoryRequestStore
from adapters.memory.state_stream import MemoryStateStream
from adapters.memory.token_store import MemoryTokenStore
from adapters.memory.transactional_store import MemoryTransactionalStore
from application.ports import AtRest, StoreInspection


class MemoryInspection(StoreInspection):
    """The memory stores of one service, by endpoint: a transactional store for each
    (`stores`), a state stream for each on the `state` strategy (`streams`: their states are
    read there), stored requests per callee, an inbox per gateway, and the token store."""

    def __init__(self, tokens: MemoryTokenStore, stores: Mapping[str, MemoryTransactionalStore],
                 streams: Mapping[str, MemoryStateStream],
                 requests: Mapping[str, MemoryRequestStore],
                 inboxes: Mapping[str, MemoryInbox]) -> None:
        self.tokens, self.stores, self.streams = tokens, stores, streams
        self.requests, self.inboxes = requests, inboxes

    def snapshot(self, endpoint: str) -> dict[str, Any]:
        """`states(endpoint)` now, without waiting (the memory stores answer at once):
        partition key -> state, in key order. Raises KeyError for an unknown endpoint."""
        reader = self.streams.get(endpoint) or self.stores[endpoint]
        return dict(sorted(reader.states().items()))

    async def states(self, endpoint: str, limit: int | None = None,
                     partition: str | None = None) -> dict[str, Any]:
        found = [(p, s) for p, s in self.snapshot(endpoint).items() if partition in (None, p)]
        return dict(found if limit is None else found[:limit])

    async def at_rest(self) -> AtRest:
        rest = AtRest(tokens=await self.tokens.count())
        for name, store in self.stores.items():
            counts = {"unfinished": await store.unfinished_count(),
                      "side_effect_records": store.record_count(),
                      "deferred_cleanups": await store.cleanup_count()}
            for what, n in counts.items():
                if n:
                    getattr(rest, what)[name] = n
            committed = [p.tr.committed_at for p in store.partitions.values()
                         if p.tr.is_committed and p.tr.committed_at is not None]
            if committed:
                rest.oldest_unfinished_s[name] = (
                    store.clock.now() - min(committed)).total_seconds()
        for name, requests in self.requests.items():
            if n := await requests.count():
                rest.requests[name] = n
        for name, inbox in self.inboxes.items():
            if n := await inbox.count_pending():
                rest.inbox_rows[name] = n
        return rest
