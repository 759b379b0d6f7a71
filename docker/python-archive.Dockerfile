# A CPython built from source on BASE_IMAGE, packed as uv packs a managed Python (python-build-standalone's
# "install_only" layout: one folder, python/, with bin/ and lib/), for a local mirror that
# `uv python install` reads (see docker/python_mirror.py). The source tarball comes in the build context,
# fetched from Debian's mirror and checked against the hash Debian publishes; gcc and the -dev packages
# come from the base's own apt sources. The interpreter links the base's shared libraries (libssl,
# libffi, ...), so it runs on that base and on newer ones with the same libraries, not everywhere.
ARG BASE_IMAGE=labkit-base:bullseye
FROM ${BASE_IMAGE}
SHELL ["/bin/sh", "-eu", "-c"]
# hadolint ignore=DL3008
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev make xz-utils \
      libssl-dev zlib1g-dev libffi-dev libbz2-dev liblzma-dev libsqlite3-dev uuid-dev libncursesw5-dev \
      libreadline-dev libgdbm-dev > /dev/null \
 && rm -rf /var/lib/apt/lists/*
ARG SOURCE
# The source goes in as the tarball Debian's hash was checked on (ADD would unpack it unchecked).
# hadolint ignore=DL3010
COPY ${SOURCE} /tmp/python.tar.xz
WORKDIR /tmp/src
# --prefix=/install is python-build-standalone's: uv rewrites that prefix in the sysconfig data it installs.
RUN tar --strip-components=1 -xJf /tmp/python.tar.xz \
 && ./configure -q --prefix=/install --without-ensurepip > /dev/null
RUN if ! make -s -j"$(nproc)" > /tmp/make.log 2>&1; then tail -n 40 /tmp/make.log >&2; exit 1; fi; \
    if ! make -s install > /tmp/install.log 2>&1; then tail -n 40 /tmp/install.log >&2; exit 1; fi
WORKDIR /
# What the kit's environment needs of the standard library, then the archive: python/ with bin/ and lib/.
RUN /install/bin/python3 -c 'import ssl, ctypes, sqlite3, lzma, bz2, zlib, uuid, decimal, json' \
 && rm -rf /install/lib/python3*/test /install/lib/python3*/*/tests /tmp/src /tmp/python.tar.xz \
 && mkdir /archive && mv /install /archive/python \
 && tar -C /archive -czf /python.tar.gz python
