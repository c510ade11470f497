"""An OTLP/HTTP trace sink for `eo bench`'s traced paths: it takes what the consumer's
exporter sends (`POST /v1/traces`, protobuf), counts the spans and keeps nothing else, so
that a traced run pays tracing's whole cost in the consumer (spans, their export) and
nothing more."""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

_ANSWER = ExportTraceServiceResponse().SerializeToString()


class SpanCount:
    """Spans received so far (`total`), thread-safe."""

    def __init__(self) -> None:
        self.total = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.total += n


@contextlib.contextmanager
def otlp_server(take: Callable[[ExportTraceServiceRequest], None]) -> Iterator[str]:
    """An OTLP/HTTP trace endpoint on 127.0.0.1 and a free port, served from a thread until
    exit: each export request (`POST /v1/traces`, protobuf, gzip or not) goes to `take`.
    Yields its base URL (what `OTEL_EXPORTER_OTLP_ENDPOINT` takes)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            take(ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(_ANSWER)))
            self.end_headers()
            self.wfile.write(_ANSWER)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextlib.contextmanager
def otlp_sink() -> Iterator[tuple[str, SpanCount]]:
    """(the sink's base URL, its span count): `otlp_server` counting the spans."""
    count = SpanCount()

    def take(request: ExportTraceServiceRequest) -> None:
        count.add(sum(len(scope.spans) for resource in request.resource_spans
                      for scope in resource.scope_spans))

    with otlp_server(take) as url:
        yield url, count
