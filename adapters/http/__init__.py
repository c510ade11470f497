"""HTTP client adapter of the caller's side of protocol 6 (httpx)."""
