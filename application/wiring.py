"""What a profile gives the application: its adapters, as one typed value (`Adapters`: the only
thing that differs between the embedded, local and production profiles), and the protocol's
tunables, as one value made once from the settings (`Tunables`). `application.workers`
assembles every endpoint's workers from the two; entrypoints/profiles/ builds `Adapters`
once per profile."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta

from application import defaults
from application.failpoints import Failpoints
from application.http_callee import HttpCallee
from application.ports import (
    BlobStore,
    Clock,
    DeadLetterPublisher,
    DocumentRenderer,
    EventSink,
    HttpRequests,
    IdGenerator,
    Inbox,
    MessageDispatcher,
    RequestStore,
    StateStream,
    StoreInspection,
    ThirdPartyApis,
    TokenStore,
    Tracer,
    TransactionalStore,
)
from application.ports.null_tracer import NULL_TRACER


@dataclass(frozen=True)
class Tunables:
    """The protocol's tunables (docs/configuration.md; `EO_*` variables of the same names,
    seconds and days turned into `timedelta`). The defaults are `application.defaults`'."""

    conflict_retries: int = defaults.CONFLICT_RETRIES
    cleanup_grace: timedelta = defaults.CLEANUP_GRACE
    stale_after: timedelta = defaults.STALE_AFTER
    #: processed-message rows, relayed inbox rows, tombstones, a state stream's entries
    retention: timedelta = defaults.RETENTION
    #: the bound of a partition's state in bytes (None: unbounded)
    max_state_bytes: int | None = None
    max_attempts: int = defaults.MAX_ATTEMPTS
    retry_delays_s: tuple[float, ...] = defaults.RETRY_DELAYS_S
    max_body_bytes: int = defaults.MAX_BODY_BYTES
    dead_letter_body_bytes: int = defaults.DEAD_LETTER_BODY_BYTES
    #: deliveries processed as one unit, and how long a batch waits to fill (seconds)
    batch_size: int = 1
    batch_wait_s: float = 0.0
    #: a consumer's deliveries in flight (None: `application.settlement.default_prefetch`)
    prefetch: int | None = None
    #: a gateway's inbox rows relayed per round
    inbox_batch: int = 200
    dead_letter_retention: timedelta = timedelta(days=14)
    #: per third-party API name, a key retention shorter than the registry's
    api_key_retention: Mapping[str, timedelta] = field(default_factory=dict)


@dataclass(frozen=True)
class Adapters:
    """The adapters a service's endpoints are assembled from, by port.

    - `stores`: a transactional store per endpoint (callees included); `requests`: the
      stored requests of each callee; `inboxes`: each gateway's; `streams`: each endpoint on
      the `state` strategy's state stream;
    - `inspection`: read-only views of all of them (reports, `eo states`, at-rest checks);
    - `colocated_tokens`: `tokens` is the token table of the stores' database (protocol
      3.2's fast path);
    - `http`: the endpoints' HTTP client to their callees: those in this process through
      `local_callees` (callee name -> its `HttpCallee`, filled by `Workers`), the others at
      `callee_urls` (callee name -> base URL);
    - `blobs`, `renderer`: None when no endpoint makes blobs;
    - `dead_letter_publisher`: where inbox relays dead-letter rows they cannot relay (None:
      such a row stays pending);
    - `apis`: the third-party APIs the registry declares (None: none declared);
    - `failpoints`: protocol 10's (None: off, as `Failpoints.from_spec` gives it); `tracer`:
      spans (`NULL_TRACER`: tracing off).
    """

    clock: Clock
    ids: IdGenerator
    events: EventSink
    dispatcher: MessageDispatcher
    tokens: TokenStore
    stores: Mapping[str, TransactionalStore]
    inspection: StoreInspection
    requests: Mapping[str, RequestStore] = field(default_factory=dict)
    inboxes: Mapping[str, Inbox] = field(default_factory=dict)
    streams: Mapping[str, StateStream] = field(default_factory=dict)
    colocated_tokens: bool = False
    blobs: BlobStore | None = None
    renderer: DocumentRenderer | None = None
    http: HttpRequests | None = None
    callee_urls: Mapping[str, str] = field(default_factory=dict)
    local_callees: MutableMapping[str, HttpCallee] = field(default_factory=dict)
    dead_letter_publisher: DeadLetterPublisher | None = None
    apis: ThirdPartyApis | None = None
    failpoints: Failpoints | None = None
    tracer: Tracer = NULL_TRACER
