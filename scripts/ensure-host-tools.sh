#!/usr/bin/env bash
# Make sure this (Debian/Ubuntu, root) machine can run the test harness: a Docker engine that
# answers, debootstrap for the base image, gpg/gpgv and dpkg-deb for bundles, promtool, rsync (the
# model_weights role's push from the control node, tests/unit/test_model_stage_role.py), nft and ip.
# Installs docker.io and starts dockerd only when no engine answers.
set -euo pipefail

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v gpg >/dev/null || need+=(gnupg)
command -v gpgv >/dev/null || need+=(gpgv)
command -v rsync >/dev/null || need+=(rsync)
command -v nft >/dev/null || need+=(nftables)   # tests/unit/test_firewall.py: rules in a network namespace
command -v ip >/dev/null || need+=(iproute2)
if ((${#need[@]})); then
  [[ $(id -u) == 0 ]] || { echo "missing ${need[*]}: run as root or install them" >&2; exit 1; }
  echo "installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# promtool (rule checks and rule unit tests), unpacked from the distro's .deb: no daemon.
"$(dirname "$0")/promtool.sh" >/dev/null

if docker info >/dev/null 2>&1; then
  exit 0
fi
[[ $(id -u) == 0 ]] || { echo "no Docker engine answers and this is not root" >&2; exit 1; }
echo "starting dockerd" >&2
nohup dockerd >/var/log/labctl-dockerd.log 2>&1 &
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && exit 0
  sleep 1
done
echo "dockerd did not come up; see /var/log/labctl-dockerd.log" >&2
tail -20 /var/log/labctl-dockerd.log >&2
exit 1
