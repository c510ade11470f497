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
ENTRYPOINT ["eo"]
# The embedded profile runs the whole sample in one process; with the local and production
# profiles (RabbitMQ, PostgreSQL) the command becomes `consume --endpoint orders`.
CMD ["demo"]
