"""`ThirdPartyApis` by API name: each declared API to its own adapter (an in-process sandbox
provider, or httpx to its URL)."""

from __future__ import annotations

from collections.abc import Mapping

from application.errors import PermanentError
from application.ports import ApiResult, ThirdPartyApis


class RoutedApis(ThirdPartyApis):
    """`ThirdPartyApis` by API name: each API to the adapter `routes` gives it."""

    def __init__(self, routes: Mapping[str, ThirdPartyApis]) -> None:
        self.routes = dict(routes)

    async def send(self, api: str, method: str, path: str, body: bytes | None,
                   idempotency_key: str) -> ApiResult:
        """The result of `routes[api]`; raises `PermanentError` for an API not declared."""
        route = self.routes.get(api)
        if route is None:
            raise PermanentError(f"third-party API {api!r} is not declared")
        return await route.send(api, method, path, body, idempotency_key)
