#!/usr/bin/env bash
# `make docker-grade`'s run: the term's submissions mounted where the kept term names them.
#
#   docker/grade.sh GRADES SUBMISSIONS FORGET -- DOCKER_RUN_ARGUMENTS... IMAGE COMMAND...
#
# The kit keeps the term (where the submissions come from) in GRADES/course/term.json, as the paths the
# container saw. So that the bare `make docker-grade` means "the same again", as the bare `make grade` does,
# each download or folder given as SUBMISSIONS gets a place of its own, /submissions/<N>-<its name>, kept
# in GRADES/docker-sources.tsv (<N>-<name>, a tab, its path on this machine); every run mounts each kept
# one read-only at its place again, and the given one is passed to the kit as `--submissions`. With no
# SUBMISSIONS and none kept, the folder `submissions` is the one given, as for `make grade`. FORGET naming
# `submissions` empties the list first, as the kit forgets its kept sources.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if (( $# < 4 )) || [[ $4 != -- ]]; then
  echo "usage: docker/grade.sh GRADES SUBMISSIONS FORGET -- DOCKER_RUN_ARGUMENTS... IMAGE COMMAND..." >&2
  exit 2
fi
grades=$1 given=$2 forget=$3
shift 4
list="$grades/docker-sources.tsv"

places=() hosts=()
if [[ -f $list && ,$forget, != *,submissions,* ]]; then
  while IFS=$'\t' read -r place host; do
    [[ -n $place && $place != \#* ]] || continue
    places+=("$place") hosts+=("$host")
  done < "$list"
fi

if [[ -z $given && ${#places[@]} == 0 ]]; then
  given=submissions
fi
extra=()
if [[ -n $given ]]; then
  [[ -e $given ]] || {
    echo "error: SUBMISSIONS=$given does not exist (an LMS download, or a folder of <student_id>/lab-<N>.ipynb)" >&2
    exit 2; }
  host=$(realpath -- "$given")
  [[ $host != *[:$'\t\n']* ]] || {
    echo "error: SUBMISSIONS=$given: a path with ':', a tab or a newline cannot be mounted into the container; rename it" >&2
    exit 2; }
  place=
  for i in "${!hosts[@]}"; do [[ ${hosts[$i]} == "$host" ]] && place=${places[$i]}; done
  if [[ -z $place ]]; then
    name=$(basename -- "$host" | tr -c 'A-Za-z0-9._\n-' '_')
    place="$(( ${#places[@]} + 1 ))-$name"
    places+=("$place") hosts+=("$host")
  fi
  extra=(--submissions "/submissions/$place")
fi

mounts=()
{
  echo "# make docker-grade's submissions: the place in the container (/submissions/...), a tab, the path here"
  for i in "${!places[@]}"; do
    printf '%s\t%s\n' "${places[$i]}" "${hosts[$i]}"
    if [[ -e ${hosts[$i]} ]]; then
      mounts+=(-v "${hosts[$i]}:/submissions/${places[$i]}:ro")
    else
      echo "warning: ${hosts[$i]} (kept as /submissions/${places[$i]} in $list) is not there; not mounted" >&2
    fi
  done
} > "$list.new"
mv -- "$list.new" "$list"

exec bash "$here/run.sh" "$grades" -- "${mounts[@]}" "$@" "${extra[@]}"
