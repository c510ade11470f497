"""The payments callee's HTTP API under bad input (issue 5): schemathesis against the OpenAPI
document of a real `eo serve --endpoint payments` process (uvicorn on a free port, database
`eo_badinput_callee_<pid>`), and hand-written client errors.

schemathesis generates requests for every operation of the `/openapi.json` the process
serves, schema-valid and schema-violating (bodies, path parameters, headers, missing
credentials), with the bearer token supplied, and checks each answer: no 5xx, the status code
and headers documented, the body conforming to the documented schema, schema-valid requests
accepted, authentication not ignored. One check is left out, `negative_data_rejection`: the
callee decodes bodies the way every message of the template is decoded (pydantic's lax mode:
"12" is an integer), so a body the document calls invalid may be stored; that is a choice, not
a fault. schemathesis's Python API is used (each operation's `as_strategy` under a
derandomised `@given`), not `schemathesis.pytest.from_fixture`: with pytest 9 that fails
(`'Function' object has no attribute '_nodeid'`), and the document only exists once the
process runs. Unsupported methods, which only the pytest runner's coverage phase would send,
are among the hand-written client errors.

Random UUIDs rarely meet, so half of the generated request IDs are replaced by one of four
shared IDs (DELETE, tested first, uses only the fourth): PUT, POST and
GET then also meet stored requests, stored responses and tombstones, so 200, 409, 410 and
stored responses are checked too. Customers 0 and 1 (hypothesis's favourite keys) have
accounts, so some POSTs are approved (stored 200) and others refused (stored 409).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import negative_data_rejection
from schemathesis.config import SchemathesisConfig

from application.codec import to_jsonable
from domain.sample.payments import open_account
from entrypoints.settings import DEFAULT_SERVICE
from tests.support.processes import Fleet, Where, reset, where_for

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

DATABASE = "eo_badinput_callee"
VHOST = "eo-badinput"
TOKEN = "badinput-callee-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY_LIMIT = 4096
EXAMPLES = 100  # per operation
SHARED_IDS = tuple(uuid.UUID(int=0xBAD0 + i) for i in range(4))

#: schemathesis cases run, by "METHOD path status" (printed at the end of the module)
CASES: Counter[str] = Counter()


@pytest.fixture(scope="module")
def where() -> Iterator[Where]:
    with where_for(DATABASE, VHOST) as found:
        yield found


async def _open_accounts(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for customer in (0, 1):
            await conn.execute(
                "INSERT INTO eo_transaction_record (endpoint, partition_key, state) "
                "VALUES ('payments', $1, $2::jsonb)", str(customer),
                json.dumps(to_jsonable(open_account(customer, Decimal(10**6), Decimal(0)))))
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def base_url(where: Where, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running `eo serve --endpoint payments` on an emptied database: its base URL. At the
    end it must stop on SIGTERM with exit code 0, so no request left it broken."""
    asyncio.run(reset(where, endpoints=()))
    asyncio.run(_open_accounts(where.dsn))
    log_dir = tmp_path_factory.mktemp("callee")
    fleet = Fleet(where, log_dir, log_dir, service=DEFAULT_SERVICE)  # the sample
    payments = fleet.serve("payments", TOKEN, max_body_bytes=BODY_LIMIT)
    try:
        asyncio.run(fleet.ready(payments, timeout_s=60))
        assert payments.url is not None
        yield payments.url
        print(f"\nschemathesis cases against the callee: {sum(CASES.values())}, "
              f"{dict(sorted(CASES.items()))}")
        assert payments.alive(), payments.tail()
        payments.popen.terminate()
        assert asyncio.run(fleet.exit_code(payments, 20)) == 0, payments.tail()
    finally:
        fleet.kill_all()


#: The operations of the document, each tested on its own.
OPERATIONS = [("/requests/{request_id}", method) for method in ("DELETE", "PUT", "POST", "GET")]
OPERATIONS.append(("/health", "GET"))


@pytest.fixture(scope="module")
def callee_schema(base_url: str) -> Any:
    """The OpenAPI document as the process serves it, loaded by schemathesis. A schema-valid
    request may meet a request stored under its ID with another body (409) or a tombstone
    (410): protocol answers, not a rejection of the body (no 5xx, 3xx, 403 or 429 either).
    A POST (it has no body) may also meet a stored request the handler refuses, e.g. a
    negative amount a PUT stored (the document cannot say amounts are non-negative): its 422
    ("the request was rejected") refuses that stored request, not the POST."""
    accepted = ["2xx", "401", "404", "409", "410"]
    config = SchemathesisConfig.from_dict({
        "checks": {"positive_data_acceptance": {"expected-statuses": accepted}},
        "operations": [{"include-method": "POST", "checks": {"positive_data_acceptance": {
            "expected-statuses": [*accepted, "422"]}}}]})
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json", config=config,
                                         headers=AUTH)


def test_every_operation_of_the_document_is_tested(callee_schema: Any) -> None:
    """The parametrisation below covers the whole served document: a new route is tested
    or this fails."""
    served = {(op.ok().path, op.ok().method.upper()) for op in callee_schema.get_all_operations()}
    assert served == set(OPERATIONS)


def _shared(method: str, request_id: object) -> uuid.UUID | None:
    """The shared ID a generated request ID stands for (half of the valid ones), or None.
    DELETE, tested first, deletes only the fourth: PUTs then meet a tombstone there."""
    try:
        number = uuid.UUID(str(request_id)).int % 8
    except ValueError:
        return None
    if number < len(SHARED_IDS) and (method != "DELETE" or number == len(SHARED_IDS) - 1):
        return SHARED_IDS[number]
    return None


@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_the_callee_answers_every_generated_request_as_documented(
    callee_schema: Any, base_url: str, path: str, method: str,
) -> None:
    """Requests generated from the served document for one operation, schema-valid and
    schema-violating (hypothesis, derandomised), each get a documented status (never a 5xx),
    documented headers and a body matching the response schema: schemathesis's checks but
    `negative_data_rejection` (see the module docstring). The process must still answer."""
    operation = callee_schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                      operation.as_strategy(GenerationMode.NEGATIVE))

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases)
    def answers_as_documented(case: Any) -> None:
        shared = _shared(method, (case.path_parameters or {}).get("request_id"))
        if shared is not None:
            case.path_parameters["request_id"] = str(shared)
        response = case.call_and_validate(base_url=base_url, headers=AUTH, timeout=30,
                                          excluded_checks=[negative_data_rejection])
        CASES[f"{method} {path} {response.status_code}"] += 1

    answers_as_documented()
    assert httpx.get(f"{base_url}/health", timeout=30).status_code == 200


# ---------------------------------------------------------------------------------------------
# client errors, by hand


def _client_errors() -> list[tuple[str, str, dict[str, str], Any, int]]:
    """(what, method, headers, body, expected status) of requests a client gets wrong."""
    good = b'{"order_key": 1, "customer_key": 2, "amount": "3.50"}'
    json_type = {"Content-Type": "application/json"}
    return [
        ("no token", "PUT", json_type, good, 401),
        ("wrong token", "PUT", {**json_type, "Authorization": "Bearer nope"}, good, 401),
        ("not a bearer credential", "GET", {"Authorization": f"Basic {TOKEN}"}, None, 401),
        ("bearer without a token", "POST", {"Authorization": "Bearer"}, None, 401),
        ("oversized body", "PUT", {**AUTH, **json_type}, b"{" + b" " * BODY_LIMIT + b"}", 413),
        ("oversized chunked body", "PUT", {**AUTH, **json_type},
         iter([b"{", b" " * BODY_LIMIT, b"}"]), 413),
        ("request ID not a UUID", "PUT", {**AUTH, **json_type}, good, 422),
        ("malformed JSON", "PUT", {**AUTH, **json_type}, b'{"order_key": 1,', 422),
        ("JSON of the wrong shape", "PUT", {**AUTH, **json_type}, b'[1, 2]', 422),
        ("a field of the wrong type", "PUT", {**AUTH, **json_type},
         b'{"order_key": [], "customer_key": 2, "amount": "3.50"}', 422),
        ("not UTF-8", "PUT", {**AUTH, **json_type}, b"\xff\xfe\x00{", 422),
        ("no body", "PUT", dict(AUTH), b"", 422),
        ("amount NaN", "PUT", {**AUTH, **json_type},
         b'{"order_key": 1, "customer_key": 2, "amount": "NaN"}', 422),
        ("unknown path", "GET", dict(AUTH), None, 404),
        ("unsupported method", "PATCH", dict(AUTH), good, 405),
    ]


@pytest.mark.parametrize(("what", "method", "headers", "body", "status"), _client_errors(),
                         ids=[case[0] for case in _client_errors()])
def test_a_client_error_is_a_4xx_with_a_message_never_a_5xx(
    base_url: str, what: str, method: str, headers: dict[str, str], body: Any, status: int,
) -> None:
    """Each request a client gets wrong is refused with its own 4xx and a JSON body whose
    `error` says what is wrong; the process answers the next request normally."""
    path = {"request ID not a UUID": "/requests/not-a-uuid",
            "unknown path": "/nothing/here"}.get(what, f"/requests/{uuid.uuid4()}")
    with httpx.Client(base_url=base_url, timeout=30) as client:
        response = client.request(method, path, headers=headers, content=body)
        assert response.status_code == status, (what, response.status_code, response.text)
        error = response.json().get("error")
        assert isinstance(error, str), (what, response.text)
        assert error.strip(), what
        if status == 401:
            assert response.headers.get("WWW-Authenticate") == "Bearer"
        if status == 405:
            assert response.headers.get("Allow") == "DELETE, GET, POST, PUT"
        assert client.get("/health").status_code == 200


def test_the_document_describes_the_request_body_and_every_refusal(base_url: str) -> None:
    """The OpenAPI document gives the PUT body's real schema (so generated bodies can be
    valid) and documents 401, 405, 413, 422 and 503 with `{"error": ...}` on every route."""
    assert httpx.get(f"{base_url}/openapi.json", timeout=30).status_code == 401
    document = httpx.get(f"{base_url}/openapi.json", headers=AUTH, timeout=30).json()
    operations = document["paths"]["/requests/{request_id}"]
    body = operations["put"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["order_key", "customer_key", "amount"]
    for method in ("put", "post", "get", "delete"):
        responses = operations[method]["responses"]
        for status in ("401", "405", "413", "422", "503"):
            schema_ = responses[status]["content"]["application/json"]["schema"]
            assert schema_["required"] == ["error"], (method, status)
