# syntax=docker/dockerfile:1
# Multi-stage image of the service: the build stage resolves the locked environment with uv
# (the service's runtime dependencies only: no tools, no dev group), the runtime stage
# carries only the virtual environment and runs as a non-root user.

# the base image and uv pinned exactly (a tag can move): update them on purpose
ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
FROM ${PYTHON_IMAGE} AS build
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
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
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin eo
COPY --from=build /app/.venv /app/.venv
ENV PATH=/app/.venv/bin:$PATH PYTHONUNBUFFERED=1 EO_BLOB_DIR=/home/eo/blobs \
    EO_METRICS_HOST=0.0.0.0 EO_METRICS_PORT=9464
USER eo
WORKDIR /home/eo
EXPOSE 9464
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
