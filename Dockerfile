# The course image: the kit and its locked environment, set up by the same `make setup` the README
# uses, from the same uv.lock. No list of packages lives here.
#
#   docker build -t labkit:cpu .                              # CPU image (the course default)
#   docker build --build-arg EXTRAS=tpu -t labkit:tpu .       # TPU VMs: also installs jax[tpu]
#   docker run --rm -v "$PWD/labs:/home/student/kit/labs" labkit:cpu            # make lab-3
#   docker run --rm -v "$PWD/labs:/home/student/kit/labs" labkit:cpu make lab-4
#
# `make docker-build`, `make docker-lab` and `make docker-grade` wrap these; see the README.

# Pinned by exact tag and by the digest of its multi-architecture index.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${BASE_IMAGE} AS base
# make is the kit's front door, in the container as on a laptop; nothing else comes from Debian.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make=4.3-4.1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 1000 --shell /bin/bash student
ENV PYTHONUNBUFFERED=1
WORKDIR /home/student/kit

# ---- build: `make setup` from uv.lock (uv itself is fetched at the version the Makefile pins) ----
FROM base AS build
ARG EXTRAS=
# The student image: the kit's dependencies and the `notebook` group (JupyterLab), without the
# dev, infra and lint groups. Bytecode is compiled at install time, so every kernel start imports
# JAX from .pyc files instead of compiling them again (the environment is read-only at run time).
ENV DEP_GROUPS=notebook \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
COPY Makefile pyproject.toml uv.lock README.md ./
COPY labkit/ labkit/
# (BuildKit, the default builder, keeps uv's download cache between builds.)
RUN --mount=type=cache,target=/root/.cache/uv \
    make setup EXTRAS="${EXTRAS}" \
 && rm -rf .tools
COPY . .

# ---- the course image: the kit and its environment, no build tools, run as `student` ----
FROM base AS course
ARG EXTRAS=
# The same selection as the build stage, so that `make lab-N` finds .venv up to date.
ENV DEP_GROUPS=notebook \
    EXTRAS=${EXTRAS} \
    PATH=/home/student/kit/.venv/bin:${PATH} \
    HOME=/home/student \
    USER=student
COPY --from=build /home/student/kit /home/student/kit
# The environment stays read-only (root's); the kit's folder, build/ and the home folder take
# the files of whoever runs the image (`docker run --user "$(id -u):$(id -g)"` keeps files
# written to mounted folders owned by the host's user).
RUN mkdir -p build \
 && chmod 1777 /home/student /home/student/kit /home/student/kit/build \
 && touch .venv/.synced
USER 1000:1000
# Check the image as it ships (it holds no solutions): the student loop runs lab 3's notebook on one
# and on eight CPU devices, and every test comes back "not implemented yet", none as an error.
RUN LABKIT_BUILD=/tmp/check python -m labkit lab 3 --configs cpu-1,cpu-8 --timeout 600 > /tmp/check.txt 2>&1 ; \
    python -c "import json, sys; o = json.load(open('/tmp/check/lab-3/report.json'))['outcomes']; \
sys.exit(0 if o and {x['status'] for x in o} == {'todo'} else open('/tmp/check.txt').read())" \
 && rm -rf /tmp/check /tmp/check.txt
EXPOSE 8888
# The student loop on the mounted labs/: `docker run ... labkit:cpu make lab-N` for another lab.
CMD ["make", "lab-3"]
