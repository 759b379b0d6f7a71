#!/usr/bin/env bash
# `docker run` for the kit's targets, as the host's user:
#
#   docker/run.sh WRITABLE_FOLDER... -- DOCKER_RUN_ARGUMENTS...
#
# The container runs with `--user` set to the host user's uid and gid, so that what it writes into
# the mounted WRITABLE_FOLDERs belongs to that user. It never runs as root: for a host user that is
# root, it runs as the image's own user, `student` (uid 1000); the folders are handed to that user
# for the run, and their contents given back to their owner when it ends.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
writable=()
while (( $# )) && [[ $1 != -- ]]; do writable+=("$1"); shift; done
[[ ${1:-} == -- ]] || { echo "usage: docker/run.sh WRITABLE_FOLDER... -- DOCKER_RUN_ARGUMENTS..." >&2; exit 2; }
shift
"$here/client.sh" version >/dev/null   # one clear line when the engine is missing

user="$(id -u):$(id -g)"
if [[ $(id -u) == 0 ]]; then
  user=1000:1000
  owners=()
  for dir in "${writable[@]}"; do owners+=("$(stat -c %u:%g "$dir")"); chown -R "$user" "$dir"; done
  give_back() {
    local i
    for i in "${!writable[@]}"; do chown -R "${owners[$i]}" "${writable[$i]}"; done
  }
  trap give_back EXIT
  trap "exit 130" INT TERM
  "$here/client.sh" run --user "$user" "$@"
else
  exec "$here/client.sh" run --user "$user" "$@"
fi
