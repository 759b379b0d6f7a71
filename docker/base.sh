#!/usr/bin/env bash
# A base image for the course image made from Debian's packages alone, for sites that cannot pull
# from Docker Hub (and for the kit's own tests):
#
#   docker/base.sh NAME [SUITE] [MIRROR]      (make docker-base [BASE_IMAGE=..] [DEBIAN_MIRROR=..])
#
# debootstrap (minbase) installs python3, python3-venv, ca-certificates and make from MIRROR (by
# default the mirror this machine's apt uses) into a scratch folder; `docker import` makes it an
# image. Needs root (debootstrap) and the debootstrap program. Takes about two minutes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=${1:?usage: docker/base.sh NAME [SUITE] [MIRROR]}
suite=${2:-trixie}
mirror=${3:-}

fail() { echo "error: $*" >&2; exit 1; }

if [[ -z $mirror ]]; then
  # The first Debian mirror this machine's apt uses (one-line or deb822 sources), else Debian's own.
  mirror=$(sed -nE 's/^URIs:[[:space:]]*(https?:[^[:space:]]+).*/\1/p; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?(https?:[^[:space:]]+)[[:space:]]+[a-z]+[[:space:]].*/\2/p' \
             /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null \
           | grep -v -e security -e updates | head -n 1) || true
  mirror=${mirror:-http://deb.debian.org/debian}
fi
"$here/client.sh" version >/dev/null   # one clear line when the engine is missing
command -v debootstrap >/dev/null 2>&1 || fail "debootstrap is not installed: apt-get install debootstrap (or build the course image on another base: make docker-build BASE_IMAGE=...)."
[[ $(id -u) == 0 ]] || fail "making a base image with debootstrap needs root: sudo make docker-base (or build on another base: make docker-build BASE_IMAGE=...)."

root=$(mktemp -d "${TMPDIR:-/var/tmp}/labkit-base.XXXXXX")
trap 'rm -rf --one-file-system "$root"' EXIT
echo "debootstrap $suite from $mirror into $root"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,make "$suite" "$root" "$mirror" \
  > "$root.log" 2>&1 || { tail -n 20 "$root.log" >&2; rm -f "$root.log"; fail "debootstrap failed (see above)"; }
rm -f "$root.log"
# What an image does not need: apt's lists and caches, documentation, and logs of the install.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
       "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/var/log/*
# The apt sources of the image: the mirror it was made from.
echo "deb $mirror $suite main" > "$root/etc/apt/sources.list"
tar -C "$root" --numeric-owner -c . | "$here/client.sh" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase $suite from $mirror" - "$name"
