# syntax=docker/dockerfile:1
# kvwatch sidecar image: slim Python, a virtual environment with kvwatch and its runtime
# dependencies only (no grafana-foundation-sdk, no test tools), a non-root user, and nothing that
# needs a writable root filesystem: byte code is compiled at build time (also the -OO variant that
# `kvwatch run` re-executes itself with, see kvwatch/cli.py) and state goes to /state.
#
#   docker build -t kvwatch:0.1.0 .
#   docker run --read-only -v /var/log/vllm:/logs:ro -p 9477:9477 kvwatch:0.1.0 \
#       run --log vllm=/logs/vllm.log --metrics-url vllm=http://HOST:8000/metrics
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY kvwatch ./kvwatch
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install . \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
    && /opt/venv/bin/python -OO -m compileall -q /opt/venv/lib \
    && /opt/venv/bin/kvwatch --version

FROM python:${PYTHON_VERSION}-slim
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KVWATCH_LISTEN=0.0.0.0:9477 \
    KVWATCH_STATE_DIR=/state
COPY --from=build /opt/venv /opt/venv
RUN groupadd --system --gid 10001 kvwatch \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin kvwatch \
    && mkdir /state \
    && chown 10001:10001 /state
USER 10001:10001
VOLUME ["/state"]
EXPOSE 9477
# /healthz answers once the sidecar serves; the port follows KVWATCH_LISTEN. It needs no credentials
# (it is outside basic auth), but with TLS in --web-config it is served over TLS like everything on
# that port: the check tries plain HTTP, then HTTPS without verifying the certificate (it only asks
# whether this container's own process answers). A port that speaks the other protocol fails fast.
# With client_ca_file (mutual TLS) /healthz needs a client certificate too: replace this check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
    CMD ["python", "-c", "import os, ssl, urllib.request as u; port = os.environ.get('KVWATCH_LISTEN', '0.0.0.0:9477').rsplit(':', 1)[1]\ntry: u.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2)\nexcept Exception: u.urlopen(f'https://127.0.0.1:{port}/healthz', timeout=2, context=ssl._create_unverified_context())"]
ENTRYPOINT ["kvwatch"]
CMD ["run", "--help"]
