#!/usr/bin/env bash
# Make promtool available on this Debian/Ubuntu machine without installing the Prometheus
# daemon: download the distro's prometheus .deb (apt-get download, no install, no service),
# unpack it with dpkg-deb -x and keep only promtool in build/host-tools/bin/.
# Idempotent: a working build/host-tools/bin/promtool is reused. Prints the path on stdout;
# everything else goes to stderr.
#
#   scripts/promtool.sh            -> /path/to/repo/build/host-tools/bin/promtool
#   LABCTL_HOST_TOOLS=/x scripts/promtool.sh   (another destination; default build/host-tools)
#
# apt-get download needs the package lists; when they lack the package and this is root, it
# runs apt-get update once. As root apt warns that the download "is performed unsandboxed"
# (the _apt user cannot write the temporary directory): harmless here.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=${LABCTL_HOST_TOOLS:-$repo/build/host-tools}
bin=$dest/bin/promtool

works() { [[ -x $1 ]] && "$1" --version >/dev/null 2>&1; }

if works "$bin"; then
  echo "$bin"
  exit 0
fi

for tool in apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || { echo "promtool.sh: $tool not found (Debian/Ubuntu only)" >&2; exit 1; }
done

mkdir -p "$dest/bin"
work=$(mktemp -d "$dest/.promtool.XXXXXX")
trap 'rm -rf "$work"' EXIT

download() { (cd "$work" && apt-get download -q prometheus >&2); }

if ! download; then
  if [[ $(id -u) != 0 ]]; then
    echo "promtool.sh: 'apt-get download prometheus' failed; run 'apt-get update' as root (or run this as root)" >&2
    exit 1
  fi
  echo "promtool.sh: refreshing the package lists" >&2
  apt-get update -qq >&2
  download
fi

deb=$(find "$work" -maxdepth 1 -name 'prometheus_*.deb' -print -quit)
[[ -n $deb ]] || { echo "promtool.sh: apt-get download left no prometheus_*.deb" >&2; exit 1; }
dpkg-deb -x "$deb" "$work/root"
[[ -x $work/root/usr/bin/promtool ]] || { echo "promtool.sh: $(basename "$deb") has no usr/bin/promtool" >&2; exit 1; }

# Copy beside the target, then rename: a concurrent caller never sees half a binary.
cp "$work/root/usr/bin/promtool" "$dest/bin/.promtool.new"
chmod 0755 "$dest/bin/.promtool.new"
mv -f "$dest/bin/.promtool.new" "$bin"
works "$bin" || { echo "promtool.sh: $bin does not run" >&2; exit 1; }
echo "promtool.sh: $("$bin" --version 2>&1 | head -n 1) from $(basename "$deb")" >&2
echo "$bin"
