"""The settings kept by name: one HTTP callee's (`EO_CALLEES__<NAME>__<FIELD>`) and one
third-party API's (`EO_APIS__<NAME>__<FIELD>`), nested in `Settings`."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, model_validator


class CalleeSettings(BaseModel):
    """One HTTP callee (protocol 6), by endpoint name: `EO_CALLEES__<NAME>__<FIELD>`.

    - `url`: its base URL, for callers (unset: the callee runs inside each caller's process,
      on the same stores: the embedded and local profiles' default);
    - `token`: its bearer token (required to serve it and to call it at `url`);
    - `host`, `port`: where `eo serve --endpoint <name>` listens (port 0: a free port,
      printed at start-up);
    - `max_body_bytes`: larger requests get 413.
    """

    url: str | None = None
    token: SecretStr | None = None
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    max_body_bytes: int = Field(65536, ge=1)

    @model_validator(mode="after")
    def _url_needs_token(self) -> CalleeSettings:
        if self.url and self.token is None:
            raise ValueError("token: required when the callee's url is set")
        return self


class ApiSettings(BaseModel):
    """One third-party API (protocol 12), by its registry name: `EO_APIS__<NAME>__<FIELD>`.

    - `url`: its base URL (unset: the in-process sandbox provider, in the embedded and local
      profiles only; production requires an https:// URL);
    - `token`: its bearer credential (sent as `Authorization: Bearer`, never logged);
    - `key_retention_s`: how long the provider keeps an idempotency key, in seconds, when
      shorter than the registry's (`ThirdPartyApi.key_retention`; never longer);
    - `timeout_s`: one request's timeout, over the registry's.
    """

    url: str | None = None
    token: SecretStr | None = None
    key_retention_s: float | None = Field(None, gt=0)
    timeout_s: float | None = Field(None, gt=0)
