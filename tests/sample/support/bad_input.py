"""The bad-input campaign's deliveries (tests/sample/chaos/test_bad_input.py): what is sent (`Spec`,
made concrete by `materialise`), the hypothesis strategy `delivery_specs` over every kind of
input, and `campaign()`, the deterministic list of specs one seed gives.

`campaign()` runs the strategy as a `@given` test with a fixed `@seed`, no example database
and the generate phase only, collecting each example: the same campaign on every run (of one
hypothesis version), as varied as hypothesis's generation makes it, edge cases first.
`EO_TEST_BADINPUT_SEED` draws another campaign.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from adapters.rabbitmq.dispatcher import text_headers
from application.codec import encode
from application.envelope import (
    ATTEMPTS_HEADER,
    ENDPOINT_HEADER,
    REASON_HEADER,
    REQUEST_URL_HEADER,
    TOKEN_HEADER,
)
from application.wire_text import clean
from domain.sample.messages import (
    AddItem,
    OrderConfirmed,
    OrderRejected,
    PaymentResult,
    PlaceOrder,
    RemoveItem,
    SubmitOrder,
)
from service.registry import REGISTRY
from tests.support.processes import MAX_BODY_BYTES

#: The sample's endpoints with a work queue (`eo consume`), where the campaign delivers.
ENDPOINTS = tuple(REGISTRY.consuming())
SEED = int(os.environ.get("EO_TEST_BADINPUT_SEED", "20261121"))
#: Specs drawn; duplicated valid messages add copies on top.
EXAMPLES = 320
#: Our own header on every delivery (no `x-` prefix: the consumer keeps it on dead-letter
#: copies), so a dead letter is matched to what was sent even without a usable message ID.
SEQ_HEADER = "bad-input-seq"
#: Headers whose meaning changes the outcome; the campaign sets them only on purpose.
PROTOCOL_HEADERS = frozenset({TOKEN_HEADER, REQUEST_URL_HEADER, "eo-no-message-id", SEQ_HEADER})
ID_NAMESPACE = uuid.UUID("6f1d0c2e-5b1a-4c1e-9a57-b2d0c0a1e5f3")
KEY_BASE = 7_000_000  # order and customer keys of valid messages: KEY_BASE + spec index

PROCESSED, DUPLICATE, DEAD = "processed", "duplicate", "dead_lettered"
COMMANDS = {"PlaceOrder": PlaceOrder, "AddItem": AddItem, "RemoveItem": RemoveItem,
            "SubmitOrder": SubmitOrder}
ACCEPTS: dict[str, frozenset[str]] = {
    "gateway": frozenset(COMMANDS),
    "orders": frozenset({*COMMANDS, "PaymentResult"}),
    "ledger": frozenset({"OrderConfirmed", "OrderRejected"}),
}
TOKEN_ENDPOINTS = ("orders", "ledger")


# ---------------------------------------------------------------------------------------------
# what is sent


@dataclass(frozen=True)
class Spec:
    """One logical input as hypothesis drew it.

    - `kind`: the family of bad (or good) input, the unit of the figures;
    - `endpoint`: whose work queue it goes to;
    - `message`: a domain message whose keys `materialise` replaces by unique ones (valid
      kinds), else None and `body` is sent as it is;
    - `id_form`: how the AMQP `message_id` is written: canonical, upper, braces, urn, hex
      (all parse as the same UUID), `absent` (published without one), or `garbage:<text>`;
    - `token`: a token row (the sender's) is created with `type` and the body, as
      `token_headers` say, before the delivery is published;
    - `copies`: deliveries with the same message ID;
    - `expect`: processed (one copy, the others duplicates), duplicate (all copies), or
      dead_lettered (all copies) with an `eo-reason` matching `reason`.
    """

    kind: str
    endpoint: str
    type: str | None
    expect: str
    reason: str = ""
    message: Any = None
    body: bytes = b""
    headers: Mapping[str, Any] = field(default_factory=dict)
    id_form: str = "canonical"
    token: bool = False
    token_headers: Mapping[str, str] = field(default_factory=lambda: {TOKEN_HEADER: "1"})
    copies: int = 1


@dataclass(frozen=True)
class Planned:
    """A spec made concrete: its index, message (unique keys), body, the UUID its message ID
    parses to (None: absent or garbage) and the AMQP `message_id` as published."""

    index: int
    spec: Spec
    message: Any
    body: bytes
    uuid: uuid.UUID | None
    message_id: str | None
    seqs: tuple[int, ...] = ()


def _written(value: uuid.UUID, form: str) -> str:
    return {"canonical": str(value), "upper": str(value).upper(), "braces": f"{{{value}}}",
            "urn": value.urn, "hex": value.hex}[form]


def _with_keys(message: Any, key: int) -> Any:
    if isinstance(message, OrderConfirmed | OrderRejected):
        return replace(message, order_key=key, customer_key=key)
    return replace(message, order_key=key)


def materialise(specs: list[Spec]) -> list[Planned]:
    """Unique message IDs (uuid5 of the seed and index) and keys (KEY_BASE + index), and
    one sequence number per delivery."""
    planned, seq = [], 0
    for index, spec in enumerate(specs):
        message = _with_keys(spec.message, KEY_BASE + index) if spec.message else None
        body = encode(message) if message is not None and not spec.body else spec.body
        value: uuid.UUID | None = uuid.uuid5(ID_NAMESPACE, f"{SEED}/{index}")
        if spec.id_form == "absent":
            value, message_id = None, None
        elif spec.id_form.startswith("garbage:"):
            value, message_id = None, spec.id_form.removeprefix("garbage:")
        else:
            assert value is not None
            message_id = _written(value, spec.id_form)
        planned.append(Planned(index, spec, message, body, value, message_id,
                               tuple(range(seq, seq + spec.copies))))
        seq += spec.copies
    return planned


# ---------------------------------------------------------------------------------------------
# the strategies

_TEXT = st.characters(blacklist_categories=("Cs",))  # encodable as UTF-8
_PLAIN = st.characters(blacklist_categories=("Cs", "Cc"))  # and storable in PostgreSQL text
_MONEY = st.decimals(min_value=0, max_value=10**6, places=2, allow_nan=False,
                     allow_infinity=False)
_ZERO = st.just(0)  # keys: replaced by `materialise`

order_commands = st.one_of(
    st.builds(PlaceOrder, _ZERO, st.integers(1, 10**6), st.dates(),
              st.text(_PLAIN, max_size=15), st.integers(1, 7)),
    st.builds(AddItem, _ZERO, st.integers(1, 7), st.integers(1, 10**6), _MONEY, _MONEY,
              st.decimals(0, 1, places=2), st.decimals(0, 1, places=2)),
    st.builds(RemoveItem, _ZERO, st.integers(1, 7)),
    st.builds(SubmitOrder, _ZERO, st.integers(0, 3)),
)
ledger_events = st.one_of(
    st.builds(OrderConfirmed, _ZERO, _ZERO, _MONEY, st.text(_PLAIN, max_size=40)),
    st.builds(OrderRejected, _ZERO, _ZERO, _MONEY, st.text(_PLAIN, max_size=40)),
)
VALID = {"gateway": order_commands, "orders": order_commands, "ledger": ledger_events}
#: Valid messages of another endpoint than the one they are sent to (unknown type there).
FOREIGN = {"gateway": st.one_of(ledger_events, st.builds(PaymentResult, _ZERO)),
           "orders": ledger_events, "ledger": order_commands}

#: Every value an AMQP field table carries (bytes go as bytearray: pamqp's byte array).
amqp_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=32), st.text(_TEXT, max_size=20),
    st.binary(max_size=16).map(bytearray),
    st.decimals(min_value=-10**6, max_value=10**6, places=2),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1),
                 timezones=st.just(UTC)),
)
amqp_values = st.recursive(
    amqp_scalars, lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(_PLAIN, min_size=1, max_size=8), inner, max_size=3)),
    max_leaves=6)
header_names = st.one_of(
    st.sampled_from([ATTEMPTS_HEADER, REASON_HEADER, ENDPOINT_HEADER, "eo-retry-reason",
                     "x-death", "x-delivery-count", "content-type"]),
    st.text(_PLAIN, min_size=1, max_size=20)).filter(lambda n: n not in PROTOCOL_HEADERS)


def _clean_value(value: Any) -> bool:
    """Whether a header `value` is clean text once the consumer reads it: a kept header that
    is not (U+0000, bytes that are not UTF-8) dead-letters the delivery, which the hostile
    bytes test covers (tests/integration/test_hostile_producer.py)."""
    return clean(text_headers({"h": value})["h"])


#: Headers of wrong names and types that must not change the outcome (a protocol header's
#: value among them clean text: see `_clean_value`).
garbage_headers = st.dictionaries(header_names, amqp_values, max_size=4).filter(
    lambda headers: all(_clean_value(v) for k, v in headers.items() if k.startswith("eo-")))
#: `eo-token` of a token-path message whose token exists: present, of any type.
token_values = st.one_of(st.just("1"), amqp_values.filter(_clean_value))
valid_id_forms = st.sampled_from(["canonical", "upper", "braces", "urn", "hex"])
endpoints = st.sampled_from(ENDPOINTS)


def _parses_as_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


garbage_ids = st.text(_TEXT, min_size=1, max_size=60).filter(
    lambda t: not _parses_as_uuid(t) and len(t.encode()) <= 255)

invalid_json = st.one_of(
    st.sampled_from([b"", b"{", b"{\"order_key\": 1,", b"[1, 2", b"nul", b"{'a': 1}",
                     b"\xff\xfe{}", b"{\"a\": NaN}", b"1 2", b"[" * 300]),
    st.text(_TEXT, max_size=60).map(lambda t: ("{" + t).encode()),
    order_commands.map(lambda m: encode(m)[:-1]),  # cut before the closing brace
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
              st.text(_TEXT, max_size=10)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(_TEXT, max_size=10), inner, max_size=3)),
    max_leaves=8)
_WRONG = st.sampled_from([None, [], {}, [1], {"a": 1}])


@st.composite
def wrong_shape(draw: st.DrawFn, message: Any) -> bytes:
    """JSON of `message` with one field dropped or of a type no lax conversion accepts,
    or any JSON value that is not such an object at all."""
    how = draw(st.sampled_from(["drop", "retype", "other"]))
    if how == "other":
        value = draw(json_values.filter(lambda v: not isinstance(v, dict) or not v))
        return json.dumps(value).encode()
    data = json.loads(encode(message))
    name = draw(st.sampled_from(sorted(data)))
    if how == "drop":
        del data[name]
    else:
        data[name] = draw(_WRONG)
    return json.dumps(data).encode()


@st.composite
def delivery_specs(draw: st.DrawFn) -> Spec:
    """One spec of any kind, for any endpoint it applies to (see `Spec`)."""
    kind = draw(st.sampled_from([
        "oversized", "no-message-id", "no-message-id-mark", "garbage-message-id", "no-type",
        "random-bytes", "invalid-json", "wrong-shape", "unknown-type", "wrong-endpoint",
        "rejected-by-handler", "bad-request-url", "no-token-header", "no-token-row",
        "text-with-nul", "valid", "valid", "valid-duplicated"]))
    headers = draw(garbage_headers)
    endpoint = draw(endpoints)
    token_path = endpoint in TOKEN_ENDPOINTS
    if kind in ("rejected-by-handler",):
        endpoint, token_path = "orders", True
    if kind in ("text-with-nul", "bad-request-url"):
        endpoint, token_path = "orders", True
    if kind in ("no-token-header", "no-token-row") and not token_path:
        endpoint, token_path = draw(st.sampled_from(TOKEN_ENDPOINTS)), True
    if token_path and kind not in ("no-token-header",):
        headers = {**headers, TOKEN_HEADER: draw(token_values)}
    type_ = draw(st.sampled_from(sorted(ACCEPTS[endpoint])))
    common = {"kind": kind, "endpoint": endpoint, "headers": headers}

    if kind == "oversized":
        size = draw(st.integers(MAX_BODY_BYTES + 1, MAX_BODY_BYTES + 4096))
        body = draw(st.sampled_from([b"x", b"\x00", b"{\"pad\": \"x\"}"])) * size
        return Spec(**common, type=type_, body=body[:size], expect=DEAD,
                    reason=rf"^body of {size} bytes exceeds the limit of {MAX_BODY_BYTES}$")
    if kind == "no-message-id":
        return Spec(**{**common, "headers": {TOKEN_HEADER: "1"}}, type=type_,
                    message=draw(VALID[endpoint]), id_form="absent", expect=DEAD,
                    reason="^no message_id$")
    if kind == "no-message-id-mark":  # the mark a dead letter without an ID carries
        return Spec(**{**common, "headers": {**headers, "eo-no-message-id": "true"}},
                    type=type_, message=draw(VALID[endpoint]), expect=DEAD,
                    reason="^no message_id$")
    if kind == "garbage-message-id":
        garbage = draw(garbage_ids)
        return Spec(**common, type=type_, message=draw(VALID[endpoint]),
                    id_form="garbage:" + garbage, expect=DEAD,
                    # an ID a store cannot keep as text (U+0000) is refused as such first
                    reason=r"^message_id .* is not a UUID$" if clean(garbage) else
                    r"^message_id '.*' holds U\+0000 or bytes that are not UTF-8: not text a "
                    r"store can keep$")
    if kind == "no-type":
        return Spec(**common, type=draw(st.sampled_from([None, ""])),
                    message=draw(VALID[endpoint]), expect=DEAD, reason="^no type$")
    if kind in ("random-bytes", "invalid-json", "wrong-shape"):
        if kind == "random-bytes":
            body = draw(st.binary(max_size=300))
        elif kind == "invalid-json":
            body = draw(invalid_json)
        else:
            cls = (COMMANDS | {"PaymentResult": PaymentResult, "OrderConfirmed":
                               OrderConfirmed, "OrderRejected": OrderRejected})[type_]
            template = draw(VALID[endpoint].filter(lambda m: isinstance(m, cls))
                            if endpoint != "orders" or type_ != "PaymentResult"
                            else st.builds(PaymentResult, _ZERO))
            body = draw(wrong_shape(template))
        return Spec(**common, type=type_, body=body, token=token_path, expect=DEAD,
                    reason=rf"^malformed {type_}: ")
    if kind == "unknown-type":
        alphabet = _TEXT if not token_path else _PLAIN  # a token row's type is PostgreSQL text
        unknown = draw(st.text(alphabet, min_size=1, max_size=30).filter(
            lambda t: t not in ACCEPTS[endpoint] and len(t.encode()) <= 255))
        return Spec(**common, type=unknown, message=draw(VALID[endpoint]), token=token_path,
                    expect=DEAD, reason="^unknown message type ")
    if kind == "wrong-endpoint":
        foreign = draw(FOREIGN[endpoint])
        return Spec(**common, type=type(foreign).__name__, message=foreign, token=token_path,
                    expect=DEAD, reason="^unknown message type ")
    if kind == "rejected-by-handler":  # well-formed, refused by the orders handler
        message = draw(st.one_of(
            st.builds(PlaceOrder, _ZERO, st.integers(1, 10**6), st.dates(),
                      st.text(_PLAIN, max_size=5), st.integers(-(10**6), -1)),
            st.builds(AddItem, _ZERO, st.integers(-(10**6), 0), st.integers(1, 10**6),
                      _MONEY, _MONEY, _MONEY, _MONEY),
            st.builds(RemoveItem, _ZERO, st.integers(-(10**6), 0)),
            st.builds(PaymentResult, _ZERO)))
        return Spec(**common, type=type(message).__name__, message=message, token=True,
                    expect=DEAD, reason="^rejected by handler: ")
    if kind == "bad-request-url":  # a follow-up whose sender stored a useless request URL
        url = draw(st.one_of(
            st.uuids().map(lambda u: f"inproc://payments/requests/{u}"),  # unknown request
            st.text(_PLAIN, max_size=20).map(lambda t: f"inproc://payments/requests/{t}"),
            st.text(_PLAIN, max_size=30)))
        reason = (r"^(request \S+ unknown on the callee|no request ID in |"
                  r"no in-process callee for )")
        return Spec(**common, type="PaymentResult", message=PaymentResult(0), token=True,
                    token_headers={TOKEN_HEADER: "1", REQUEST_URL_HEADER: url}, expect=DEAD,
                    reason=reason)
    if kind == "no-token-header":
        message = draw(VALID[endpoint])
        return Spec(**common, type=type(message).__name__, message=message, token=True,
                    expect=DEAD, reason="^no token header")
    if kind == "text-with-nul":  # valid JSON the orders state cannot hold in PostgreSQL
        message = draw(st.builds(PlaceOrder, _ZERO, st.integers(1, 10**6), st.dates(),
                                 st.text(_PLAIN, max_size=5).map(lambda t: t + "\x00"),
                                 st.integers(1, 7)))
        return Spec(**common, type="PlaceOrder", message=message, token=True, expect=DEAD,
                    reason=r"^PostgreSQL refused the data: .*\\u0000")
    if kind == "no-token-row":  # a copy of something consumed long ago: a duplicate
        return Spec(**common, type=type_, body=draw(st.binary(max_size=100)),
                    id_form=draw(valid_id_forms), expect=DUPLICATE)
    message = draw(VALID[endpoint])
    copies = draw(st.integers(2, 3)) if kind == "valid-duplicated" else 1
    return Spec(**common, type=type(message).__name__, message=message, token=token_path,
                id_form=draw(valid_id_forms), copies=copies, expect=PROCESSED)


def campaign(examples: int = EXAMPLES, at_seed: int = SEED) -> list[Spec]:
    """The specs hypothesis generates for `delivery_specs` in `examples` examples at
    `at_seed`: deterministic, no shrinking, no example database."""
    drawn: list[Spec] = []

    @seed(at_seed)
    @settings(max_examples=examples, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(delivery_specs())
    def collect(spec: Spec) -> None:
        drawn.append(spec)

    collect()
    return drawn
