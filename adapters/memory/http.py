"""HTTP caller routed to in-process callees: the embedded profile's `HttpRequests`."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping

from application.errors import PermanentError, RequestDeleted, TransientError
from application.http_callee import HttpCallee
from application.ports import HttpRequests, HttpResult


class InProcessHttp(HttpRequests):
    """URLs `inproc://<callee>/requests/<uuid>` go straight to that callee's `HttpCallee`,
    with the same status handling an HTTP client adapter applies; any other URL goes to
    `outside` (the HTTP client of callees served elsewhere), if given."""

    def __init__(self, callees: Mapping[str, HttpCallee],
                 outside: HttpRequests | None = None) -> None:
        self.callees = callees
        self.outside = outside

    def _elsewhere(self, url: str) -> HttpRequests | None:
        return self.outside if not url.startswith("inproc://") else None

    def _route(self, url: str) -> tuple[HttpCallee, uuid.UUID]:
        scheme, _, rest = url.partition("://")
        service, _, path = rest.partition("/")
        callee = self.callees.get(service)
        if scheme != "inproc" or callee is None or not path.startswith("requests/"):
            raise PermanentError(f"no in-process callee for {url}")
        try:
            return callee, uuid.UUID(path.removeprefix("requests/"))
        except ValueError:  # a URL no retry can mend: the callee would answer 422
            raise PermanentError(f"no request ID in {url}") from None

    async def put(self, url: str, body: bytes) -> None:
        if (outside := self._elsewhere(url)) is not None:
            return await outside.put(url, body)
        callee, request_id = self._route(url)
        answer = await callee.put(request_id, body)
        if answer.status >= 500:
            raise TransientError(f"PUT {url}: {answer.status}")
        if answer.status == 410:  # our unique URL, deleted by a winner's clean-up
            raise RequestDeleted(f"PUT {url}: 410, deleted by another attempt's clean-up")
        if answer.status >= 300:
            raise PermanentError(f"PUT {url}: {answer.status} {json.dumps(dict(answer.body))}")

    async def post(self, url: str) -> HttpResult:
        if (outside := self._elsewhere(url)) is not None:
            return await outside.post(url)
        callee, request_id = self._route(url)
        answer = await callee.post(request_id)
        return HttpResult(answer.status, answer.body, answer.stored)

    async def delete(self, url: str) -> None:
        if (outside := self._elsewhere(url)) is not None:
            return await outside.delete(url)
        callee, request_id = self._route(url)
        answer = await callee.delete(request_id)
        if answer.status >= 500:
            raise TransientError(f"DELETE {url}: {answer.status}")
