#!/usr/bin/env bash
# Check labctl_gpu_facts and the NVIDIA driver against REAL GPUs, on a machine that has no internet.
#
# The GPU machine (a lent H200 box, say) cannot reach PyPI and has no project venv, so ansible-core
# travels as wheels:
#
#   1. On a connected machine (needs python3 with pip):
#        scripts/device-check.sh --fetch-wheels DIR
#      downloads ansible-core 2.19.14, its dependencies and pip itself as binary wheels for CPython
#      3.12 and 3.11 on x86_64 glibc Linux (pip download --only-binary=:all: --python-version ...
#      --platform manylinux2014_x86_64 ...) into DIR. DEVICE_CHECK_PY_VERSIONS="3.12 3.11" and
#      PYTHON=python3 change the Pythons and the interpreter that runs pip.
#
#   2. On the GPU machine, from the repository root, with DIR copied over:
#        scripts/device-check.sh --run DIR OUTDIR [--expect-branch 580] [--expect-gpus N]
#      installs the wheels into a temporary directory (pip install --no-index --find-links DIR
#      --target ..., pip itself run from its wheel: Debian/Ubuntu's python3 often has no pip), then
#      runs `ansible localhost -c local -m labctl_gpu_facts` (ANSIBLE_LIBRARY=library),
#      `nvidia-smi --query-gpu=<the module's fields> --format=csv,noheader,nounits`, `nvidia-smi -q`,
#      `nvidia-smi`, `nvidia-smi -L`, `nvidia-smi --version` and `lspci -d 10de:`, writes their raw
#      outputs into OUTDIR, and prints PASS/FAIL lines:
#        - labctl_gpu_facts ran and read at least one GPU (and --expect-gpus of them),
#        - the module's GPUs are exactly what the parser makes of the raw query output,
#        - every GPU's driver_version has the same branch (and it is --expect-branch),
#        - the loaded kernel module is that driver (/proc/driver/nvidia/version; SKIP without it),
#        - persistence mode is enabled on every GPU.
#      Exit status 0 only when nothing FAILed. It needs python3 >= 3.11 (python3.12 or python3.11 are
#      looked for first); it does not care whether nvidia-smi is NVIDIA's or the test stub.
#
# OUTDIR receives, for a case named real-<count>x<model>-<driver> (e.g. real-2xh200-580.95.05):
#   <case>.json        the machine as a data table in the format of tests/fixtures/nvidia-smi/*.json
#                      (what the nvidia-smi stub answers from), built from the query below
#   <case>.query.csv   nvidia-smi --query-gpu=<module fields> --format=csv,noheader,nounits
#   <case>.q.txt       nvidia-smi -q
#   <case>.lspci.txt   lspci -d 10de:   (empty when lspci is missing)
#   <case>.table.txt, <case>.list.txt, <case>.version.txt   nvidia-smi, -L, --version
#   <case>.facts.json  what labctl_gpu_facts returned
#   <case>.checks.txt  the PASS/FAIL lines
#   <case>.pci-sysfs.txt, .devices.txt, .secureboot.txt, .packages.txt, .persistenced-unit.txt
#                      NVIDIA PCI functions (address class device), /proc/devices + /dev/nvidia*,
#                      Secure Boot state, the installed driver packages (name version source) and
#                      the persistence daemon's unit: what tests/fixtures/nvidia-repo models
#   <case>.kernel.json, .modinfo.txt, .dkms.txt
#                      labctl_kernel_facts' result (running kernel, next boot's, headers, NVIDIA
#                      modules), `modinfo -k $(uname -r) nvidia` and `dkms status`: what
#                      tests/fixtures/kernel-repo models
# Copy them into tests/fixtures/nvidia-smi/ as they are: tests/unit/test_gpu_facts.py picks up every
# real-*.facts.json there as a real-output case (parser vs facts, stub vs raw query). Edit the
# "description" of <case>.json to say which machine it was.
set -euo pipefail

ANSIBLE_CORE_VERSION=2.19.14
PY_VERSIONS=${DEVICE_CHECK_PY_VERSIONS:-"3.12 3.11"}
PLATFORMS=(manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64)
EXTRA_FIELDS=memory.used,temperature.gpu,utilization.gpu,power.draw,clocks.sm,clocks.mem
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

fetch_wheels() {
  local dir=$1 py=${PYTHON:-python3} version platform_args=()
  mkdir -p "$dir"
  for platform in "${PLATFORMS[@]}"; do platform_args+=(--platform "$platform"); done
  for version in $PY_VERSIONS; do
    echo "== wheels for CPython $version" >&2
    "$py" -m pip download --quiet --dest "$dir" --only-binary=:all: \
      --python-version "$version" --implementation cp --abi "cp${version/./}" --abi abi3 --abi none \
      "${platform_args[@]}" --platform any \
      "ansible-core==$ANSIBLE_CORE_VERSION" pip
  done
  ls "$dir" >&2
  echo "wheels for ansible-core $ANSIBLE_CORE_VERSION (CPython: $PY_VERSIONS) are in $dir" >&2
}

pick_python() {
  local candidate
  for candidate in ${DEVICE_CHECK_PYTHON:-} python3.12 python3.11 python3; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      command -v "$candidate"
      return
    fi
  done
  echo "no python3 >= 3.11 here (ansible-core $ANSIBLE_CORE_VERSION needs it); set DEVICE_CHECK_PYTHON" >&2
  exit 1
}

run_checks() {
  local wheels=$1 out=$2; shift 2
  local expect_branch="" expect_gpus=""
  while (($#)); do
    case $1 in
      --expect-branch) expect_branch=$2; shift 2 ;;
      --expect-gpus) expect_gpus=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  wheels=$(cd "$wheels" && pwd)
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  cd "$REPO"

  local py site pip_wheel
  py=$(pick_python)
  site=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")
  # shellcheck disable=SC2064  # expand now: $site is local to this function
  trap "rm -rf '$site'" EXIT
  pip_wheel=$(find "$wheels" -maxdepth 1 -name 'pip-*.whl' | sort | tail -n1)
  echo "== installing ansible-core $ANSIBLE_CORE_VERSION for $py ($("$py" -V 2>&1)) into $site" >&2
  if [[ -n $pip_wheel ]]; then
    "$py" "$pip_wheel/pip" install --quiet --disable-pip-version-check --root-user-action=ignore --no-index --find-links "$wheels" \
      --target "$site" "ansible-core==$ANSIBLE_CORE_VERSION"
  else
    "$py" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-index --find-links "$wheels" \
      --target "$site" "ansible-core==$ANSIBLE_CORE_VERSION"
  fi

  local smi fields
  smi=$(command -v nvidia-smi || true)
  # The module's own field list, so the raw query is exactly what labctl_gpu_facts asks (the module
  # imported from library/, which PYTHONPATH names, beside the ansible-core it imports).
  fields=$(PYTHONPATH="$site:$REPO/library" "$py" -c 'import labctl_gpu_facts; print(",".join(labctl_gpu_facts.QUERY_FIELDS))')

  local raw tree
  raw=$(mktemp -d "$site/raw.XXXXXX")
  tree="$raw/tree"
  printf '[defaults]\n' >"$raw/ansible.cfg"  # not the project's: its callbacks need collections
  echo "== labctl_gpu_facts" >&2
  # --tree is deprecated in 2.19 (removed in 2.23) but is the simplest way to get the result as JSON.
  PYTHONPATH="$site" ANSIBLE_LIBRARY="$REPO/library" ANSIBLE_CONFIG="$raw/ansible.cfg" \
    ANSIBLE_LOCALHOST_WARNING=False ANSIBLE_INVENTORY_UNPARSED_WARNING=False \
    ANSIBLE_DEPRECATION_WARNINGS=False ANSIBLE_PYTHON_INTERPRETER="$py" \
    "$py" -m ansible adhoc localhost -c local -m labctl_gpu_facts --tree "$tree" >"$raw/adhoc.txt" 2>&1 || true
  if [[ -f $tree/localhost ]]; then cp "$tree/localhost" "$raw/facts.json"; else echo '{}' >"$raw/facts.json"; fi
  # The kernels, their headers and NVIDIA modules as the GPU layer and labctl patch read them.
  echo "== labctl_kernel_facts" >&2
  rm -rf "$tree"
  PYTHONPATH="$site" ANSIBLE_LIBRARY="$REPO/library" ANSIBLE_CONFIG="$raw/ansible.cfg" \
    ANSIBLE_LOCALHOST_WARNING=False ANSIBLE_INVENTORY_UNPARSED_WARNING=False \
    ANSIBLE_DEPRECATION_WARNINGS=False ANSIBLE_PYTHON_INTERPRETER="$py" \
    "$py" -m ansible adhoc localhost -c local -m labctl_kernel_facts --tree "$tree" >"$raw/kernel-adhoc.txt" 2>&1 || true
  if [[ -f $tree/localhost ]]; then cp "$tree/localhost" "$raw/kernel.json"; else echo '{}' >"$raw/kernel.json"; fi
  { modinfo -k "$(uname -r)" nvidia 2>&1 || true; } >"$raw/modinfo.txt"
  { command -v dkms >/dev/null 2>&1 && dkms status 2>&1 || echo "dkms not installed"; } >"$raw/dkms.txt"

  local rc
  if [[ -n $smi ]]; then
    rc=0; nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits >"$raw/query.csv" 2>&1 || rc=$?
    echo "$rc" >"$raw/query.rc"
    nvidia-smi --query-gpu="$fields,$EXTRA_FIELDS" --format=csv,noheader,nounits >"$raw/query-extra.csv" 2>&1 || true
    nvidia-smi -q >"$raw/q.txt" 2>&1 || true
    nvidia-smi >"$raw/table.txt" 2>&1 || true
    nvidia-smi -L >"$raw/list.txt" 2>&1 || true
    nvidia-smi --version >"$raw/version.txt" 2>&1 || true
  else
    echo "nvidia-smi not found" >"$raw/query.csv"; echo 127 >"$raw/query.rc"
    for f in query-extra.csv q.txt table.txt list.txt version.txt; do : >"$raw/$f"; done
  fi
  if command -v lspci >/dev/null 2>&1; then lspci -d 10de: >"$raw/lspci.txt" 2>&1 || true; else : >"$raw/lspci.txt"; fi
  if [[ -r /proc/driver/nvidia/version ]]; then cp /proc/driver/nvidia/version "$raw/proc-version.txt"; fi
  # What the issue-16 doubles model, as this machine has it: NVIDIA PCI functions from sysfs
  # (NVSwitch class 0x0680 before any driver), the UVM major and device nodes, the Secure Boot
  # state, and the installed driver packages with their real names and versions.
  for dev in /sys/bus/pci/devices/*; do
    [[ "$(cat "$dev/vendor" 2>/dev/null)" == 0x10de ]] && echo "${dev##*/} $(cat "$dev/class") $(cat "$dev/device")"
  done >"$raw/pci-sysfs.txt" 2>/dev/null || true
  { grep -E 'nvidia' /proc/devices || true; ls -l /dev/nvidia* 2>&1 || true; } >"$raw/devices.txt"
  if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state >"$raw/secureboot.txt" 2>&1 || true
  else od -An -tx1 /sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c >"$raw/secureboot.txt" 2>&1 || true; fi
  dpkg-query -W -f '${db:Status-Status} ${Package} ${Version} ${Source}\n' '*nvidia*' 'libcuda*' 'cuda-drivers*' \
    >"$raw/packages.txt" 2>&1 || true
  systemctl cat nvidia-persistenced.service >"$raw/persistenced-unit.txt" 2>&1 || true

  # Name the case, write the files, judge. Python for the JSON; the parser is the module's own.
  PYTHONPATH="$site:$REPO/library" "$py" - "$raw" "$out" "$fields" "$EXTRA_FIELDS" "$expect_branch" "$expect_gpus" <<'PY'
import json
import os
import re
import shutil
import sys

import labctl_gpu_facts

raw, out, fields, extra, expect_branch, expect_gpus = sys.argv[1:7]


def read(name):
    path = os.path.join(raw, name)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


result = json.loads(read("facts.json") or "{}")
facts = result.get("ansible_facts", {})
gpus = facts.get("gpus", [])
query = read("query.csv") or ""

# The case name: real-<count>x<model>-<driver>
model = "none"
if gpus and gpus[0].get("name"):
    model = re.sub(r"[^a-z0-9]+", "-", gpus[0]["name"].lower().replace("nvidia", "")).strip("-") or "gpu"
case = "real-%dx%s-%s" % (len(gpus), model, facts.get("gpu_driver_version") or "nodriver")

# The machine as a stub data table (tests/fixtures/nvidia-smi format)
names = fields.split(",") + extra.split(",")
table_gpus = []
for line in (read("query-extra.csv") or "").splitlines():
    cells = [cell.strip() for cell in line.split(",")]
    if len(cells) == len(names):
        table_gpus.append(dict(zip(names, cells)))
fabric = None
q_text = read("q.txt") or ""
block = re.search(r"^    Fabric\n((?:        .*\n)+)", q_text, re.M)
if block:
    values = dict((k.strip(), v.strip()) for k, _, v in
                  (line.partition(":") for line in block.group(1).splitlines() if ":" in line))
    if values.get("State") not in labctl_gpu_facts.NO_FABRIC_STATES:
        fabric = {"state": values.get("State"), "status": values.get("Status"),
                  "clique_id": values.get("CliqueId"), "cluster_uuid": values.get("ClusterUUID"),
                  "health_bandwidth": values.get("Bandwidth", "N/A")}
lspci = read("lspci.txt") or ""
table = {"description": "REAL output of %s (%d GPU(s), driver %s), captured by scripts/device-check.sh. "
                        "Say which machine this was." % (model, len(gpus), facts.get("gpu_driver_version")),
         "gpus": table_gpus, "fabric": fabric, "lspci": lspci}

files = {".json": json.dumps(table, indent=2) + "\n", ".query.csv": query, ".q.txt": q_text,
         ".lspci.txt": lspci, ".table.txt": read("table.txt") or "", ".list.txt": read("list.txt") or "",
         ".version.txt": read("version.txt") or "", ".facts.json": json.dumps(result, indent=2, sort_keys=True) + "\n",
         ".pci-sysfs.txt": read("pci-sysfs.txt") or "", ".devices.txt": read("devices.txt") or "",
         ".secureboot.txt": read("secureboot.txt") or "", ".packages.txt": read("packages.txt") or "",
         ".persistenced-unit.txt": read("persistenced-unit.txt") or "",
         ".kernel.json": read("kernel.json") or "{}", ".modinfo.txt": read("modinfo.txt") or "",
         ".dkms.txt": read("dkms.txt") or ""}

lines = []


def check(name, ok, detail=""):
    word = {None: "SKIP", "info": "INFO"}.get(ok, "PASS" if ok else "FAIL")
    lines.append("%s %s%s" % (word, name, (": " + detail) if detail else ""))


check("labctl_gpu_facts ran", bool(facts) and not result.get("failed"),
      result.get("msg", "") if result.get("failed") else "gpu_count=%s" % facts.get("gpu_count"))
check("GPUs found", facts.get("gpu_count", 0) > 0, facts.get("gpu_facts_reason") or "%d" % len(gpus))
if expect_gpus:
    check("GPU count is %s" % expect_gpus, len(gpus) == int(expect_gpus), "%d" % len(gpus))
if not gpus:
    check("facts match the raw query output", None, "no GPU to compare")
else:
    try:
        parsed = labctl_gpu_facts.parse_query_output(query)
        check("facts match the raw query output", parsed == gpus, "%d row(s)" % len(parsed))
    except labctl_gpu_facts.ParseError as exc:
        check("facts match the raw query output", False, str(exc))
listed = [l for l in (read("list.txt") or "").splitlines() if l.startswith("GPU ")]
check("nvidia-smi -L lists the same GPUs", len(listed) == len(gpus), "%d listed" % len(listed))
branches = sorted(set(labctl_gpu_facts.driver_branch(g.get("driver_version")) for g in gpus))
if gpus:
    check("one driver branch on every GPU", len(branches) == 1, ",".join(branches))
if expect_branch:
    check("driver branch is %s" % expect_branch, branches == [expect_branch], ",".join(branches) or "none")
driver = facts.get("gpu_driver_version") or ""
proc = read("proc-version.txt")
if proc is None:
    check("kernel module is the same driver", None, "/proc/driver/nvidia/version absent")
else:
    check("kernel module is the same driver", bool(driver) and (" %s " % driver) in proc,
          proc.splitlines()[0] if proc else "")
if gpus:
    off = [str(g["index"]) for g in gpus if not g.get("persistence_mode")]
    check("persistence mode enabled", not off, ("off on GPU " + ",".join(off)) if off else "all")
check("NVSwitch fabric (fabric manager needed)", "info", "gpu_nvswitch=%s" % facts.get("gpu_nvswitch"))
kernel = json.loads(read("kernel.json") or "{}")
running = next((k for k in kernel.get("kernels", []) if k.get("release") == kernel.get("running")), None)
check("labctl_kernel_facts ran", bool(kernel) and not kernel.get("failed"),
      kernel.get("msg", "") if kernel.get("failed") else "running %s, next boot %s" % (kernel.get("running"), kernel.get("boot")))
if running is None or not driver:
    check("the running kernel's NVIDIA module is the loaded driver", None, "no kernel facts or no driver")
elif not running.get("module"):
    # modinfo finds no nvidia module under /lib/modules/<release> (a driver loaded from elsewhere).
    check("the running kernel's NVIDIA module is the loaded driver", None,
          "modinfo -k %s nvidia: %s" % (kernel.get("running"), ((read("modinfo.txt") or "").strip().splitlines() or [""])[0]))
else:
    check("the running kernel's NVIDIA module is the loaded driver", running.get("module_version") == driver,
          "%s %s" % (running.get("module"), running.get("module_version")))
files[".checks.txt"] = "\n".join(lines) + "\n"

for suffix, text in files.items():
    with open(os.path.join(out, case + suffix), "w", encoding="utf-8") as handle:
        handle.write(text)
print("\n".join(lines))
print("raw outputs: %s/%s.*" % (out, case))
sys.exit(1 if any(l.startswith("FAIL") for l in lines) else 0)
PY
}

case ${1:-} in
  --fetch-wheels) (($# == 2)) || usage; fetch_wheels "$2" ;;
  --run) (($# >= 3)) || usage; run_checks "${@:2}" ;;
  *) usage ;;
esac
