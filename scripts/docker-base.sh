#!/usr/bin/env bash
# Build a local Debian base image for the Dockerfiles when no image registry is reachable
# (`FROM python:3.11-slim` cannot pull): debootstrap bookworm (Python 3.11, venv, pip, CA
# certificates, iproute2 for the tc profile) and `docker import` it. Idempotent: nothing to do
# when the image exists. Root and Debian/Ubuntu (apt) needed.
#
#   bash scripts/docker-base.sh [IMAGE]      (default acespec-base:bookworm)
#   then: ACESPEC_BASE=acespec-base:bookworm docker compose build
set -euo pipefail
IMAGE=${1:-acespec-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
say() { printf '\033[1m[docker-base]\033[0m %s\n' "$*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  say "$IMAGE exists"
  exit 0
fi
command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null
ROOTFS=$(mktemp -d /tmp/acespec-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
say "debootstrap bookworm into $ROOTFS (about a minute)"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,iproute2 \
  bookworm "$ROOTFS" "$MIRROR" >/dev/null
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import -c 'CMD ["python3"]' - "$IMAGE" >/dev/null
say "built $IMAGE: $(docker run --rm "$IMAGE" python3 --version)"
