# A base for the course image from the official python image, where Docker Hub can be reached:
#
#   docker build -f docker/python-base.Dockerfile -t labkit-base:python docker/
#   make docker-build BASE_IMAGE=labkit-base:python
#
# The official image has python3 (with venv) but not make, the kit's front door; this adds it.
# Pinned by exact tag and by the digest of its multi-architecture index.
ARG BASE_FROM=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
FROM ${BASE_FROM}
RUN apt-get update \
 && apt-get install -y --no-install-recommends make=4.3-4.1 \
 && rm -rf /var/lib/apt/lists/*
