"""The caller's half of HTTP request/response (protocol 6): response classification."""

from __future__ import annotations

from application.errors import PermanentError, TransientError
from application.failpoints import Failpoints
from application.ports import HttpRequests
from domain.context import HttpResponse

#: Response header marking a stored business response.
STORED_RESPONSE_HEADER = "EO-Stored-Response"


async def collect_response(
    http: HttpRequests, url: str, failpoints: Failpoints | None
) -> HttpResponse | None:
    """POST the stored request at `url` and classify the answer (protocol 6, step 2).

    Returns the stored business response whatever its status (a 409 refusal included), or
    None for a 404 without the stored-response header (the caller decides: duplicate when
    its follow-up token is gone, else permanent). Raises `TransientError` for 5xx (and the
    port raises it for network errors) and `PermanentError` for any other 4xx.
    """
    result = await http.post(url)
    if failpoints:
        await failpoints.hit("after_post")
    if result.stored:
        return HttpResponse(status=result.status, body=result.body)
    if result.status == 404:
        return None
    if result.status >= 500:
        raise TransientError(f"callee answered {result.status} for {url}")
    raise PermanentError(f"callee answered {result.status} for {url}: {dict(result.body)}")
