# One image for every role: `notify-queue migrate|api|worker|operator` (the chart passes the role
# as the first argument).
#
# Two stages. The build stage installs the hashed runtime lock (requirements/runtime.txt, `make
# lock`) into a virtual environment at /opt/notify-queue, then the checkout as a wheel without
# resolving anything again. The final stage is the same slim Python base with only that
# environment copied in: no compiler, no pip, no source tree, no build cache, and no embedded
# PostgreSQL (an extra for `make run` and the tests). Every dependency ships as a manylinux wheel
# (psycopg-binary included), so the build stage needs no compiler either.
#
# tests/shipping/test_dockerfile.py lints this file with hadolint and runs the build stage's RUN
# commands in a plain virtual environment, because no container engine runs on the CI machines.

# Python 3.12 (3.12.15) on Debian bookworm, pinned by the digest of the tag's multi-platform
# index (amd64, arm64) as public projects pinned it in October 2026: the registry cannot be
# reached from the CI machines to read it again. Refresh it with
# `docker buildx imagetools inspect python:3.12-slim-bookworm`.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm@sha256:54c85f3c47607a77f32adec749d3c81d1348bf25833671f512b26a9b6d778cb3

# --- build ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
COPY requirements/runtime.txt requirements/
COPY pyproject.toml README.md ./
COPY src/ src/

# The locked dependencies, each checked against its hash; then this checkout as an ordinary (not
# editable) install from its wheel, --no-deps so nothing outside the lock comes in; then pip
# itself leaves the environment, since nothing installs at run time.
RUN python -m venv /opt/notify-queue \
    && /opt/notify-queue/bin/pip install --require-hashes -r requirements/runtime.txt \
    && /opt/notify-queue/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
    && /opt/notify-queue/bin/pip install --no-deps /tmp/wheels/notify_queue-*.whl \
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
