#!/usr/bin/env bash
# Build the Debian 12 systemd base image used by the test harness and the sandbox.
#
# The image is the "pristine target": a minimal server install (debootstrap's default
# variant: required + important priority) plus systemd as PID 1, python3 (for Ansible),
# sudo and unattended-upgrades (present on stock Ubuntu servers, so the host_tuning role
# has something real to disable). Its tag is derived from this file's content, so a
# change to the recipe builds a new image and an unchanged recipe reuses the old one.
#
# Usage: scripts/build-base-image.sh [--print-tag]
# Env:   DEBIAN_MIRROR (default http://deb.debian.org/debian), LABCTL_IMAGE_REPO
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=${LABCTL_IMAGE_REPO:-labctl/debian12-systemd}
recipe_hash=$(sha256sum "$here/build-base-image.sh" | cut -c1-12)
tag="$repo:$recipe_hash"

if [[ "${1:-}" == "--print-tag" ]]; then
  echo "$tag"
  exit 0
fi

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag: up to date (recipe $recipe_hash)" >&2
  echo "$tag"
  exit 0
fi

command -v debootstrap >/dev/null || {
  echo "debootstrap is missing: apt-get install debootstrap" >&2
  exit 1
}

mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d /var/tmp/labctl-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"

include=systemd,systemd-sysv,dbus,python3,python3-apt,sudo,unattended-upgrades,procps,iproute2,kmod,gpgv,ca-certificates
echo "debootstrap bookworm from $mirror (this takes a few minutes)" >&2
debootstrap --arch=amd64 --include="$include" bookworm "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -30 "$work/debootstrap.log" >&2
  exit 1
}

# The stock apt source of a fresh server: the airgap role has to disable it.
cat >"$rootfs/etc/apt/sources.list" <<SRC
deb $mirror bookworm main
deb http://deb.debian.org/debian-security bookworm-security main
SRC
# Containers: no consoles, no udev, no kernel mounts to manage. systemd-remount-fs stays: at boot it
# applies /etc/fstab's options to /dev/shm (host_tuning's size), as on a real server, so a restarted
# container is a rebooted host (docker's 64 MiB /dev/shm otherwise, and the replicas fail).
for unit in getty@tty1.service console-getty.service systemd-udevd.service \
  systemd-udevd-control.socket systemd-udevd-kernel.socket \
  sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount \
  systemd-modules-load.service systemd-firstboot.service; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
: >"$rootfs/etc/machine-id"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/*.log

tar -C "$rootfs" -c . | docker import \
  --change 'CMD ["/lib/systemd/systemd"]' \
  --change 'ENV container=docker' \
  --message "labctl base image, recipe $recipe_hash" - "$tag" >/dev/null
echo "base image $tag built" >&2
echo "$tag"
