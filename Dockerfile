# syntax=docker/dockerfile:1
# One image for every role: `docker run IMAGE worker` (or dispatcher, reaper, operator, migrate, status...).
#
# Stage 1 builds wheels for judgequeue and its dependencies; stage 2 installs them into a clean slim
# Python with no compiler, no pip cache, no setuptools/wheel, and runs as a fixed non-root UID so
# Kubernetes `runAsNonRoot` / `runAsUser: 10001` (what the operator renders) match the image.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY controllers ./controllers
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="judgequeue" \
      org.opencontainers.image.description="Recoverable online-judge job delivery: outbox, Redis Streams, fenced verdicts, operator" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# bubblewrap is the program judge's isolation engine (setpriv comes with util-linux); without it
# the judge refuses to start. Compilers are not shipped: add gcc/g++ in a derived image to judge C/C++.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && bwrap --version && setpriv --version
RUN groupadd --system --gid 10001 judgequeue \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin judgequeue
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels judgequeue \
 && pip uninstall --yes setuptools wheel \
 && judgequeue --help > /dev/null
WORKDIR /tmp
USER 10001:10001
EXPOSE 9090
ENTRYPOINT ["judgequeue"]
CMD ["--help"]
