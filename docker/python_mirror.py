"""A local mirror of managed Pythons for `uv python install`, made from a CPython the kit builds itself.

    python3 docker/python_mirror.py OUT [BASE_IMAGE]    build one (as the container tests do) into OUT

uv downloads a managed Python from python-build-standalone's releases on GitHub. Where GitHub cannot
be reached (the kit's test machines), this makes the closest thing: CPython PYTHON_VERSION built from the
source tarball on Debian's mirror (checked against the hash Debian publishes) on BASE_IMAGE
(docker/python-archive.Dockerfile), packed in python-build-standalone's install_only layout, and laid
out as that release would be, with a downloads list that names its hash:

    OUT/BUILD/cpython-3.13.5+BUILD-x86_64-unknown-linux-gnu-install_only.tar.gz
    OUT/downloads.json

and uv reads it with its own two documented settings (uv 0.13.9, the version the Makefile pins)::

    UV_PYTHON_DOWNLOADS_JSON_URL=OUT/downloads.json   the list of Pythons, with each archive's sha256 (uv
                                                      refuses an archive whose hash is not the listed one)
    UV_PYTHON_INSTALL_MIRROR=file://OUT               where the list's GitHub addresses are read instead

The interpreter links BASE_IMAGE's shared libraries (libssl, libffi, ...): it is for that base. The image
that builds it is kept by the engine's build cache, so a second build on the same machine is quick.
Only the Python standard library is used (tests load this file by path, as docker/engine.py).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ["bash", str(ROOT / "docker" / "client.sh")]
PYTHON_VERSION = "3.13.5"
# Debian 13's python3.13 source package: its upstream tarball and the sha256 Debian's Sources index lists.
SOURCE_PATH = "pool/main/p/python3.13/python3.13_3.13.5.orig.tar.xz"
SOURCE_SHA256 = "93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BUILD = "20250101"  # python-build-standalone names a release by a date; uv reads this one as any other
TRIPLE = "x86_64-unknown-linux-gnu"
GITHUB = "https://github.com/astral-sh/python-build-standalone/releases/download"


class MirrorError(RuntimeError):
    pass


def archive_name(version: str = PYTHON_VERSION, build: str = BUILD) -> str:
    return f"cpython-{version}+{build}-{TRIPLE}-install_only.tar.gz"


def fetch_source(dest: Path, mirror: str = DEBIAN_MIRROR) -> Path:
    """The CPython source tarball from Debian's mirror into `dest`, its sha256 checked; kept when already there."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == SOURCE_SHA256:
        return dest
    url = f"{mirror.rstrip('/')}/{SOURCE_PATH}"
    with urllib.request.urlopen(url, timeout=300) as r:
        data = r.read()
    found = hashlib.sha256(data).hexdigest()
    if found != SOURCE_SHA256:
        raise MirrorError(f"{url} has sha256 {found}, not the {SOURCE_SHA256} Debian lists: refused")
    dest.write_bytes(data)
    return dest


def downloads_json(sha256: str, version: str = PYTHON_VERSION, build: str = BUILD) -> dict:
    """uv's list of Pythons (the format of its download-metadata.json) with the one archive made here."""
    major, minor, patch = (int(x) for x in version.split("."))
    return {f"cpython-{version}-linux-x86_64-gnu": {
        "name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux", "libc": "gnu",
        "major": major, "minor": minor, "patch": patch, "prerelease": "",
        "url": f"{GITHUB}/{build}/{archive_name(version, build).replace('+', '%2B')}",
        "sha256": sha256, "variant": None, "build": build}}


def build(env: dict[str, str], out: Path, base_image: str = "labkit-base:bullseye", timeout: float = 3600) -> Path:
    """Build the archive on `base_image` with the engine `env` names and lay out the mirror in `out`; `out`."""
    out = Path(out)
    tag = f"labkit-python-archive:{PYTHON_VERSION}-{base_image.replace(':', '-').replace('/', '-')}"
    with tempfile.TemporaryDirectory(prefix="labkit-python-archive.") as context:
        fetch_source(Path(context) / "python.tar.xz")
        done = subprocess.run([*CLIENT, "build", "-q", "-f", str(ROOT / "docker" / "python-archive.Dockerfile"),
                               "--build-arg", f"BASE_IMAGE={base_image}", "--build-arg", "SOURCE=python.tar.xz",
                               "-t", tag, context], env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        if done.returncode != 0:
            raise MirrorError(f"building CPython {PYTHON_VERSION} on {base_image} failed:\n{done.stderr[-4000:]}")
    folder = out / BUILD
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / archive_name()
    with archive.open("wb") as f:
        done = subprocess.run([*CLIENT, "run", "--rm", "--network", "none", tag, "cat", "/python.tar.gz"], env=env,
                              stdout=f, stderr=subprocess.PIPE, timeout=600, check=False)
    if done.returncode != 0:
        raise MirrorError(f"could not copy the archive out of {tag}: {done.stderr.decode(errors='replace')[-2000:]}")
    sha256 = hashlib.sha256(archive.read_bytes()).hexdigest()
    (out / "downloads.json").write_text(json.dumps(downloads_json(sha256), indent=1) + "\n")
    return out


def uv_settings(mirror_in_container: str) -> dict[str, str]:
    """The two uv settings that make `uv python install` read the mirror at `mirror_in_container`."""
    folder = mirror_in_container.rstrip("/")
    return {"UV_PYTHON_DOWNLOADS_JSON_URL": f"{folder}/downloads.json", "UV_PYTHON_INSTALL_MIRROR": f"file://{folder}"}


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    import os

    print(build(dict(os.environ), Path(sys.argv[1]), *sys.argv[2:3]))
