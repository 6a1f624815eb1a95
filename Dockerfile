# One image for every role: `notify-queue migrate|api|worker|operator` (the chart passes the role
# as the first argument).
#
# Two stages. The build stage turns the checkout into a wheel and installs it, with its pinned-by-
# pyproject dependencies, into a virtual environment at /opt/notify-queue. The final stage is the
# same slim Python base with only that environment copied in: no compiler, no pip, no source tree,
# no build cache. Every dependency ships as a manylinux wheel (psycopg-binary included), so the
# build stage needs no compiler either.
#
# tests/shipping/test_dockerfile.py lints this file with hadolint and runs the build stage's RUN
# commands in a plain virtual environment, because no container engine runs on the CI machines.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src/ src/

# The wheel first, so the environment gets an ordinary (not editable) install of exactly this
# checkout; then pip itself leaves the environment, since nothing installs at run time.
RUN python -m venv /opt/notify-queue \
    && /opt/notify-queue/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
    && /opt/notify-queue/bin/pip install /tmp/wheels/notify_queue-*.whl \
    && /opt/notify-queue/bin/pip uninstall --yes pip setuptools \
    && /opt/notify-queue/bin/notify-queue --help

# --- final ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="notify-queue" \
      org.opencontainers.image.description="Notification queue (email, SMS, push) on PostgreSQL, run as a Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0"

# The base image's own pip and setuptools go too: the final image installs nothing.
RUN python -m pip uninstall --yes pip setuptools wheel \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin notify-queue

COPY --from=build /opt/notify-queue /opt/notify-queue

# Bytecode was compiled at install time and the root filesystem is read-only in the chart, so
# Python must not try to write .pyc files; unbuffered output keeps logs in order.
ENV PATH=/opt/notify-queue/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# A numeric user, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /tmp
EXPOSE 8080

ENTRYPOINT ["notify-queue"]
CMD ["--help"]
