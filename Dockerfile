# syntax=docker/dockerfile:1
# One image for every role: `docker run IMAGE worker` (or dispatcher, reaper, operator, migrate, status...).
#
# Stage 1 builds wheels for judgequeue and its dependencies; stage 2 installs them into a clean slim
# Python with no pip cache and no setuptools/wheel, plus what the program judge needs (bubblewrap,
# gcc/g++ for C/C++ submissions), and runs as a fixed non-root UID so Kubernetes `runAsNonRoot` /
# `runAsUser: 10001` (what the operator renders for dispatchers and reapers) match the image;
# sandboxed workers are rendered as root with a few capabilities (docs/judges.md).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY controllers ./controllers
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
# The release this image is: pyproject.toml's version (scripts/release bumps both, and
# tests/unit/test_release.py checks they agree). The install below refuses a VERSION that is not
# the package's, so the label cannot say one release while the image runs another.
ARG VERSION=0.3.0
LABEL org.opencontainers.image.title="judgequeue" \
      org.opencontainers.image.description="Recoverable online-judge job delivery: outbox, Redis Streams, fenced verdicts, operator" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# bubblewrap is the program judge's isolation engine (setpriv comes with util-linux); without it
# the judge refuses to start. gcc and g++ compile the C and C++ submissions (inside the sandbox);
# libc6-dev (C headers, crt files) is only a Recommends of gcc, so it is named. With the base
# image's Python 3 that is C, C++ and Python. EXTRA_PACKAGES adds Debian packages of other rows of
# docs/judges.md's languages table that need nothing but apt, e.g.
#   --build-arg EXTRA_PACKAGES="pypy3 golang-go rustc-web nodejs ruby php-cli ocaml-nox fp-compiler sbcl swi-prolog-nox"
ARG EXTRA_PACKAGES=""
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap gcc g++ libc6-dev ${EXTRA_PACKAGES} \
 && rm -rf /var/lib/apt/lists/* \
 && bwrap --version && setpriv --version \
 && printf '#include <stdio.h>\nint main(void){puts("ok");return 0;}\n' | gcc -x c -o /tmp/c-ok - \
 && printf '#include <iostream>\nint main(){std::cout<<"ok";}\n' | g++ -x c++ -o /tmp/cpp-ok - \
 && /tmp/c-ok && /tmp/cpp-ok && rm /tmp/c-ok /tmp/cpp-ok
RUN groupadd --system --gid 10001 judgequeue \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin judgequeue
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels judgequeue \
 && pip uninstall --yes setuptools wheel \
 && judgequeue --help > /dev/null \
 && installed="$(judgequeue --version)" \
 && if [ "$installed" != "judgequeue ${VERSION}" ]; then \
      echo "build argument VERSION=${VERSION} is not the package's version ($installed)" >&2; exit 1; \
    fi
WORKDIR /tmp
USER 10001:10001
EXPOSE 9090
ENTRYPOINT ["judgequeue"]
CMD ["--help"]
