#!/usr/bin/env bash
# The Docker client for the kit's docker targets, and a check of the engine before anything else.
#
#   docker/client.sh ARGS...     runs `docker ARGS...` with a client that can build with BuildKit,
#                                against the engine DOCKER_HOST names (the client's default otherwise)
#
# It picks $DOCKER when set, else the first `docker` on the PATH that builds with BuildKit: one with
# the buildx plugin, or a client older than 23.0 (Debian's docker.io 20.10), whose builder is built in.
# Before it runs anything it asks the engine for its version, and when the engine is missing, not
# running or refuses this user, it prints one line that says which and what to do, and exits 1.
set -euo pipefail

fail() { echo "error: $*" >&2; exit 1; }

builds_with_buildkit() {
  "$1" buildx version >/dev/null 2>&1 && return 0
  local v
  v=$("$1" version --format '{{.Client.Version}}' 2>/dev/null) || v=$("$1" --version 2>/dev/null | sed -E 's/^[^0-9]*([0-9]+).*/\1/')
  [[ ${v%%.*} =~ ^[0-9]+$ ]] && (( ${v%%.*} < 23 ))
}

pick_client() {
  if [[ -n ${DOCKER:-} ]]; then
    command -v "$DOCKER" >/dev/null 2>&1 || fail "no Docker client: DOCKER=$DOCKER is not a program here. Install Docker (Debian: apt-get install docker.io) or set DOCKER to its client."
    command -v "$DOCKER"; return
  fi
  local c first=""
  while read -r c; do
    [[ -n $c ]] || continue
    first=${first:-$c}
    if builds_with_buildkit "$c"; then echo "$c"; return; fi
  done < <(type -aP docker | awk '!seen[$0]++')
  [[ -n $first ]] || fail "no Docker client: \`docker\` is not installed. Install Docker Engine (Debian: apt-get install docker.io; elsewhere: https://docs.docker.com/engine/install/), then start it."
  # A client that cannot build still runs containers; `docker build` will say what it lacks.
  echo "$first"
}

client=$(pick_client)
where=${DOCKER_HOST:-unix:///var/run/docker.sock}
if ! answer=$(DOCKER_CLI_HINTS=false "$client" version --format '{{.Server.Version}}' 2>&1 >/dev/null </dev/null); then
  case $answer in
    *"permission denied"*|*"Permission denied"*)
      fail "the Docker engine at $where refuses this user (permission denied on its socket): add the user to the \`docker\` group (sudo usermod -aG docker \"\$USER\", then log in again), or run as root.";;
    *"Cannot connect"*|*"Is the docker daemon running"*|*"no such file"*|*"No such file"*|*"connection refused"*|*"Connection refused"*|*"dial unix"*|*"dial tcp"*|*"error during connect"*)
      fail "the Docker engine is not running: nothing answers at $where. Start it (sudo systemctl start docker, or sudo dockerd &), or set DOCKER_HOST to an engine that runs.";;
    *)
      fail "the Docker engine at $where did not answer: $(echo "$answer" | head -n 1)";;
  esac
fi
export DOCKER_BUILDKIT=1
exec "$client" "$@"
