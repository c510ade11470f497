"""Ports: what the protocol needs from the outside world, with the guarantees it relies on.

One module per concern; this package is their public face: `from application.ports import
X` for every port.
"""

from application.ports.dead_letters import DeadLetterQuery, DeadLetterStore, HeldDeadLetter
from application.ports.endpoint import Ports
from application.ports.inspection import AtRest, StoreInspection
from application.ports.messaging import (
    DeadLetterPublisher,
    Delivery,
    DeliverySource,
    Inbox,
    InboxClaim,
    MessageDispatcher,
)
from application.ports.observability import (
    Clock,
    EventSink,
    IdGenerator,
    Span,
    SpanKind,
    SpanValue,
    Tracer,
)
from application.ports.partitions import Clear, CommitRequest, Committed, Loaded, PartitionStore
from application.ports.side_effects import (
    ApiPolicy,
    ApiResult,
    BlobStore,
    DocumentRenderer,
    HttpRequests,
    HttpResult,
    ThirdPartyApis,
)
from application.ports.stores import (
    ProcessedMessages,
    StateStream,
    StoredReplies,
    StoreGauges,
    SweeperQueries,
    TransactionalStore,
)
from application.ports.tokens import IncomingTokens, PutResult, RequestStore, TokenStore

__all__ = [
    "ApiPolicy",
    "ApiResult",
    "AtRest",
    "BlobStore",
    "Clear",
    "Clock",
    "CommitRequest",
    "Committed",
    "DeadLetterPublisher",
    "DeadLetterQuery",
    "DeadLetterStore",
    "Delivery",
    "DeliverySource",
    "DocumentRenderer",
    "EventSink",
    "HeldDeadLetter",
    "HttpRequests",
    "HttpResult",
    "IdGenerator",
    "Inbox",
    "InboxClaim",
    "IncomingTokens",
    "Loaded",
    "MessageDispatcher",
    "PartitionStore",
    "Ports",
    "ProcessedMessages",
    "PutResult",
    "RequestStore",
    "Span",
    "SpanKind",
    "SpanValue",
    "StateStream",
    "StoreGauges",
    "StoreInspection",
    "StoredReplies",
    "SweeperQueries",
    "ThirdPartyApis",
    "TokenStore",
    "Tracer",
    "TransactionalStore",
]
