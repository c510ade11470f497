"""The caller's half of HTTP request/response (protocol 6): POSTing a follow-up's request and
classifying the answer, and the race of a 404 with `finish`."""

from __future__ import annotations

from application.api_caller import ApiCaller
from application.envelope import API_CALL_HEADER, REQUEST_URL_HEADER, Envelope, capped
from application.errors import Conflict, Duplicate, PermanentError, TransientError
from application.failpoints import NO_FAILPOINTS, Failpoints, or_no_failpoints
from application.ports import HttpRequests, IncomingTokens, PartitionStore
from domain.context import HttpResponse

#: Response header marking a stored business response.
STORED_RESPONSE_HEADER = "EO-Stored-Response"
#: The most of a callee's error body a permanent error (a dead-letter reason) quotes.
MAX_ERROR_BODY_CHARS = 200


async def collect_response(
    http: HttpRequests, url: str, failpoints: Failpoints | None = NO_FAILPOINTS
) -> HttpResponse | None:
    """POST the stored request at `url` and classify the answer (protocol 6, step 2).

    Returns the stored business response whatever its status (a 409 refusal included), or
    None for a 404 without the stored-response header (the caller decides: duplicate when
    its follow-up token is gone, else permanent). Raises `TransientError` for 5xx (and the
    port raises it for network errors) and `PermanentError` for any other 4xx.
    `failpoints`: None stands for none configured (as `Failpoints.from_spec` gives it).
    """
    result = await http.post(url)
    await or_no_failpoints(failpoints).hit("after_post")
    if result.stored:
        return HttpResponse(status=result.status, body=result.body)
    if result.status == 404:
        return None
    if result.status >= 500:
        raise TransientError(f"callee answered {result.status} for {url}")
    # a callee's body is its to choose: a bounded prefix goes into the dead-letter reason
    body = capped(str(dict(result.body)), MAX_ERROR_BODY_CHARS)
    raise PermanentError(f"callee answered {result.status} for {url}: {body}")


class HttpCaller:
    """What an endpoint that calls HTTP callees does with its follow-up messages.

    `http` is None when the endpoint calls nobody (a follow-up then is a permanent error);
    `tokens` and `store` are the endpoint's, read to decide a 404's meaning. A follow-up's
    request URL is trusted because it comes from the follow-up's token (the claim check our
    own endpoint wrote, addressed to this endpoint), never from a delivery's headers.
    """

    def __init__(self, http: HttpRequests | None, tokens: IncomingTokens, store: PartitionStore,
                 failpoints: Failpoints = NO_FAILPOINTS, api: ApiCaller | None = None) -> None:
        """`api`: the endpoint's third-party APIs (protocol 12), for follow-ups carrying a
        request to one of them."""
        self.http, self.tokens, self.store, self._fp = http, tokens, store, failpoints
        self.api = api

    async def follow_up_response(self, stored: Envelope, partition: str) -> HttpResponse | None:
        """The callee's stored response for a follow-up message, or a third-party API's
        answer for a follow-up carrying its request (`ApiCaller.call`, which raises as it
        documents); None for any other message.

        Raises `PermanentError` when no HTTP client is configured or the request is unknown
        to the callee while the follow-up's token exists, `Duplicate` when the token is gone,
        and `Conflict` when the 404 races with a concurrent copy's `finish`: that copy may be
        between its DELETE and its token delete, so the TR is read BEFORE the token (`finish`
        consumes the token before it clears the TR: an idle TR with the token still there
        means the request is really unknown). Protocol 6 checks the token alone, which races
        with finish (project amendment).
        """
        url = stored.header(REQUEST_URL_HEADER)
        if url is None:
            if stored.header(API_CALL_HEADER) is None:
                return None
            if self.api is None:
                raise PermanentError("third-party API follow-up received, but the endpoint "
                                     "calls no third-party API")
            return await self.api.call(stored)
        if self.http is None:
            raise PermanentError("HTTP follow-up received but no HTTP client is configured")
        result = await collect_response(self.http, url, self._fp)
        if result is not None:
            return result
        if (await self.store.load_tr(partition)).is_committed:
            raise Conflict(f"request {url} deleted by a committed copy")
        if not await self.tokens.exists(stored.message_id):
            raise Duplicate
        raise PermanentError(f"request {url} unknown on the callee")
