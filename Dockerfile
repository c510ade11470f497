# syntax=docker/dockerfile:1
# Multi-stage image: the build stage resolves the locked environment with uv, the runtime
# stage carries only the virtual environment and runs as a non-root user.

FROM python:3.11-slim AS build
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
RUN pip install --no-cache-dir "uv>=0.9,<1"
WORKDIR /app
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project
COPY domain ./domain
COPY application ./application
COPY adapters ./adapters
COPY entrypoints ./entrypoints
RUN uv sync --frozen --no-dev --no-editable

FROM python:3.11-slim AS runtime
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin eo
COPY --from=build /app/.venv /app/.venv
ENV PATH=/app/.venv/bin:$PATH PYTHONUNBUFFERED=1 EO_BLOB_DIR=/home/eo/blobs
USER eo
WORKDIR /home/eo
EXPOSE 9464
ENTRYPOINT ["eo"]
# The service's main process: the orders consumer (EO_PROFILE=production with EO_DATABASE_DSN
# and EO_AMQP_URL). `docker run <image> demo` runs the self-contained embedded demo instead.
CMD ["consume", "--endpoint", "orders"]
