#!/usr/bin/env bash
# `make docker-grade`'s run: the term's submissions, and the TA's files given, mounted into the container.
#
#   docker/grade.sh GRADES SUBMISSIONS FORGET [--input NAME=FILE]... -- DOCKER_RUN_ARGUMENTS... IMAGE COMMAND...
#
# The kit keeps the term (where the submissions come from) in GRADES/course/term.json, as the paths the
# container saw. So that the bare `make docker-grade` means "the same again", as the bare `make grade` does,
# each download or folder given as SUBMISSIONS gets a place of its own, /submissions/<N>-<its name>, kept
# in GRADES/docker-sources.tsv (<N>-<name>, a tab, its path on this machine); every run mounts each kept
# one read-only at its place again, and the given one is passed to the kit as `--submissions`. With no
# SUBMISSIONS and none kept, the folder `submissions` is the one given, as for `make grade`. FORGET naming
# `submissions` empties the list first, as the kit forgets its kept sources.
#
# Each course input given (`--input roster=FILE`, from ROSTER=FILE; `+FILE` adds to the kept one, as
# OVERRIDES=+FILE does) is mounted read-only at /course-inputs/<name>/<its file name> and passed to the kit as
# `--<name>`; the kit keeps its copy in GRADES/course. A name's odd characters become `_` in the container.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: docker/grade.sh GRADES SUBMISSIONS FORGET [--input NAME=FILE]... -- DOCKER_RUN_ARGUMENTS... IMAGE COMMAND..."
if (( $# < 4 )); then
  echo "$usage" >&2
  exit 2
fi
grades=$1 given=$2 forget=$3
shift 3

# A path on this machine as Docker can mount it (no `:`, tab or newline), or a stop that says why (and what
# was expected there, when given).
mountable() {
  local what=$1 path=$2 expected=${3:+ ($3)}
  [[ -e $path ]] || { echo "error: $what=$path does not exist$expected" >&2; exit 2; }
  path=$(realpath -- "$path")
  if [[ $path == *[:$'\t\n']* ]]; then
    echo "error: $what=$path: a path with ':', a tab or a newline cannot be mounted into the container; rename it" >&2
    exit 2
  fi
  printf '%s' "$path"
}
plain() { basename -- "$1" | tr -c 'A-Za-z0-9._\n-' '_'; }

mounts=() extra=()
while [[ ${1:-} == --input ]]; do
  name=${2%%=*} value=${2#*=}
  shift 2
  add=
  if [[ $value == +* ]]; then add=+ value=${value#+}; fi
  host=$(mountable "$(tr 'a-z-' 'A-Z_' <<< "$name")" "$value")
  place="/course-inputs/$name/$(plain "$host")"
  mounts+=(-v "$host:$place:ro")
  extra+=("--$name" "$add$place")
done
if [[ ${1:-} != -- ]]; then
  echo "$usage" >&2
  exit 2
fi
shift
list="$grades/docker-sources.tsv"

places=() hosts=()
if [[ -f $list && ,$forget, != *,submissions,* ]]; then
  while IFS=$'\t' read -r place host; do
    [[ -n $place && $place != \#* ]] || continue
    # only what this script writes: a place of its own under /submissions, an absolute path Docker can mount
    if [[ ! $place =~ ^[0-9]+-[A-Za-z0-9._-]+$ || $host != /* || $host == *:* ]]; then
      echo "warning: $list: a line this script did not write ($place); left out" >&2
      continue
    fi
    places+=("$place") hosts+=("$host")
  done < "$list"
fi

if [[ -z $given && ${#places[@]} == 0 ]]; then
  given=submissions
fi
if [[ -n $given ]]; then
  host=$(mountable SUBMISSIONS "$given" "an LMS download, or a folder of <student_id>/lab-<N>.ipynb")
  place=
  for i in "${!hosts[@]}"; do [[ ${hosts[$i]} == "$host" ]] && place=${places[$i]}; done
  if [[ -z $place ]]; then
    next=1
    for i in "${places[@]}"; do (( ${i%%-*} < next )) || next=$(( ${i%%-*} + 1 )); done
    place="$next-$(plain "$host")"
    places+=("$place") hosts+=("$host")
  fi
  extra+=(--submissions "/submissions/$place")
fi

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
