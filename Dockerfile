# Multi-stage image of the service: the build stage resolves the locked environment with uv
# (the service's runtime dependencies only: no tools, no dev group), the runtime stage
# carries only the virtual environment and runs as a non-root user. No `# syntax=` line: it
# would make BuildKit fetch a frontend image, and offline builds would fail.
# `deploy/image/check` builds it with podman and runs it against PostgreSQL and RabbitMQ.

# the base image and uv pinned exactly (a tag can move): update them on purpose
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
FROM ${PYTHON_IMAGE} AS build
# UV_NATIVE_TLS: the base image's certificate store, where a network that inspects TLS puts
# its own CA (uv's bundled roots would refuse it, as pip does not)
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_NATIVE_TLS=1
RUN pip install --no-cache-dir "uv==0.13.9"
WORKDIR /app
COPY pyproject.toml uv.lock README.md ./
#% if keep_sample
# the sample's endpoints render invoice PDFs: its `sample` group comes along
RUN uv sync --frozen --no-dev --group sample --no-install-project
#% else
#% filter replace("#! ", "")
#! RUN uv sync --frozen --no-dev --no-install-project
#% endfilter
#% endif
COPY domain ./domain
COPY application ./application
COPY adapters ./adapters
COPY entrypoints ./entrypoints
COPY service ./service
#% if keep_sample
RUN uv sync --frozen --no-dev --group sample --no-editable
#% else
#% filter replace("#! ", "")
#! RUN uv sync --frozen --no-dev --no-editable
#% endfilter
#% endif

FROM ${PYTHON_IMAGE} AS runtime
#% if false
LABEL org.opencontainers.image.title="exactly-once-template" \
      org.opencontainers.image.description="An exactly-once service made from exactly-once-template"
#% endif
#% filter replace("#! ", "")
#! LABEL org.opencontainers.image.title="{{ service_name }}" \
#!       org.opencontainers.image.description="{{ service_name }}: an exactly-once service made from exactly-once-template"
#% endfilter
# the build sets these: --build-arg VERSION=$(git describe) --build-arg REVISION=$(git rev-parse HEAD)
# --build-arg TEMPLATE_VERSION=<entrypoints/version.py's> (deploy/image/check does)
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG TEMPLATE_VERSION=unknown
LABEL org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      io.exactly-once.template.version="${TEMPLATE_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="python:3.11-slim"
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin eo
COPY --from=build /app/.venv /app/.venv
# The status server (/metrics, /ready, /health) listens on every interface, on the first free
# port from 9464 (9464 in a container of its own). Blobs go to S3 (EO_S3_*) unless
# EO_BLOB_STORE=directory, which keeps them in EO_BLOB_DIR (mount a volume there).
ENV PATH=/app/.venv/bin:$PATH PYTHONUNBUFFERED=1 EO_BLOB_DIR=/home/eo/blobs \
    EO_METRICS_HOST=0.0.0.0
USER eo
WORKDIR /home/eo
EXPOSE 9464
# a consumer answers /health on its status port; an HTTP callee (`serve`) on its own port,
# which EO_HEALTH_PORT names for this check (Kubernetes ignores it and uses its own probes)
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('EO_HEALTH_PORT', os.environ.get('EO_METRICS_PORT') or '9464'), timeout=4)"]
ENTRYPOINT ["eo"]
# The service's main process is one endpoint's consumer (EO_PROFILE=production with
# EO_DATABASE_DSN and EO_AMQP_URL): `docker run <image> consume --endpoint <name>`, or an HTTP
# callee: `serve --endpoint <name>`. `docker run <image> endpoints` lists them.
#% if keep_sample
CMD ["consume", "--endpoint", "orders"]
#% else
#% filter replace("#! ", "")
#! CMD ["endpoints"]
#% endfilter
#% endif
