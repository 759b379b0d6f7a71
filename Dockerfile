# The course image: the kit and its locked environment, set up by the same `make setup` the README
# uses, from the same uv.lock. No list of packages lives here.
#
#   make docker-base                   # once: a base from Debian 13's packages (python3, venv, make)
#   make docker-build                  # labkit:cpu on it  [BASE_IMAGE=..] [EXTRAS=tpu] [CA_CERTS=..]
#   docker run --rm -v "$PWD/labs:/home/student/kit/labs" labkit:cpu            # make lab-3
#   docker run --rm -v "$PWD/labs:/home/student/kit/labs" labkit:cpu make lab-4
#
# `make docker-build`, `make docker-lab` and `make docker-grade` wrap these; see docs/containers.md.
# Builds with BuildKit (`DOCKER_BUILDKIT=1`, or buildx): the uv cache and the CA secret below need it.

# Any image with python3 (3.11 to 3.13, with venv) and make; `make docker-base` makes one from
# Debian's packages. Elsewhere, e.g. the official python image plus make (see docs/containers.md).
ARG BASE_IMAGE=labkit-base:trixie

FROM ${BASE_IMAGE} AS base
SHELL ["/bin/sh", "-eu", "-c"]
# Fail at once, with the reason, on a base that lacks what `make setup` needs.
RUN command -v python3 >/dev/null || { echo "error: the base image has no python3: the course image needs python3 (3.11 to 3.13, with venv) and make (see docs/containers.md, 'The course image')" >&2; exit 1; }; \
    command -v make >/dev/null || { echo "error: the base image has no make: the course image needs python3 (3.11 to 3.13, with venv) and make (see docs/containers.md, 'The course image')" >&2; exit 1; }; \
    python3 -c 'import sys, venv, ensurepip; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' \
      || { echo "error: the base image's python3 is not 3.11 to 3.13 with venv and ensurepip (Debian: python3-venv)" >&2; exit 1; }; \
    getent group 1000 >/dev/null || echo "student:x:1000:" >> /etc/group; \
    getent passwd 1000 >/dev/null || echo "student:x:1000:1000::/home/student:/bin/sh" >> /etc/passwd; \
    mkdir -p /home/student/kit
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
COPY Makefile pyproject.toml uv.lock ./
# `make setup`'s own steps (standard library only): uv sync, quietly, then a repair of any distribution
# whose files are gone (venvfiles reads what each installed); it marks .venv finished.
COPY labkit/machine/__init__.py labkit/machine/envsetup.py labkit/machine/venvfiles.py labkit/machine/
# The kit itself goes in as an editable install (a path to /home/student/kit); its code and README
# come with the rest of the kit in the last stage, so changing them does not make the environment
# again: here they are empty stand-ins. BuildKit keeps uv's download cache between builds. A CA
# bundle to trust (a proxy that inspects TLS: `make docker-build CA_CERTS=...`) comes as a build
# secret, never in a layer.
RUN --mount=type=cache,target=/root/.cache/uv \
    --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export SSL_CERT_FILE=/run/secrets/ca PIP_CERT=/run/secrets/ca; fi; \
    mkdir -p labkit && touch README.md labkit/__init__.py \
 && make setup EXTRAS="${EXTRAS}" \
 && rm -rf .tools

# ---- the course image: the kit and its environment, no build tools, run as `student` ----
FROM base AS course
ARG EXTRAS=
# The same selection as the build stage, so that `make lab-N` finds .venv up to date.
ENV DEP_GROUPS=notebook \
    EXTRAS=${EXTRAS} \
    PATH=/home/student/kit/.venv/bin:${PATH} \
    HOME=/home/student \
    USER=student
# The environment first, then the kit's files: a changed notebook rebuilds only the layers below.
COPY --from=build /home/student/kit/.venv /home/student/kit/.venv
COPY . .
# The environment stays read-only (root's); the kit's folder, build/ and the home folder take
# the files of whoever runs the image (`docker run --user "$(id -u):$(id -g)"` keeps files
# written to mounted folders owned by the host's user).
RUN mkdir -p build \
 && chmod 1777 /home/student /home/student/kit /home/student/kit/build \
 && touch .venv/.synced
USER 1000:1000
# Check the image as it ships (it holds no solutions): the student loop runs lab 3's notebook on one
# and on eight CPU devices, and every test comes back "not implemented yet", none as an error.
RUN LABKIT_BUILD=/tmp/check python -m labkit lab 3 --configs cpu-1,cpu-8 --timeout 600 > /tmp/check.txt 2>&1 || true; \
    python -c "import json, sys; o = json.load(open('/tmp/check/lab-3/report.json'))['outcomes']; \
sys.exit(0 if o and {x['status'] for x in o} == {'todo'} else open('/tmp/check.txt').read())" \
 && rm -rf /tmp/check /tmp/check.txt
EXPOSE 8888
# The student loop on the mounted labs/: `docker run ... labkit:cpu make lab-N` for another lab.
CMD ["make", "lab-3"]
