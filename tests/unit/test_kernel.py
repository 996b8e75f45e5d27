"""Kernels and the NVIDIA modules DKMS builds for them (issue: kernel upgrades keep the GPUs).

- filter_plugins/labctl_kernel.py: what the GPU layer installs so DKMS can build the driver for every
  kernel a host runs, whether the kernel the next boot runs has the driver, and preflight's view of
  the same against the bundle;
- library/labctl_kernel_facts.py: the running kernel, the next boot's kernel, headers and modules;
- roles/preflight/library/labctl_secure_boot.py: the key each distribution's DKMS signs with;
- the test doubles these are checked against in the gpu scenario (tests/fixtures/kernel-repo, the
  DKMS build stand-in of tests/fixtures/nvidia-repo, the nvidia-smi stub's version mismatch).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "filter_plugins"))
sys.path.insert(0, str(REPO / "roles" / "patch" / "filter_plugins"))

from labctl_kernel import (  # noqa: E402
    labctl_apt_policy,
    labctl_boot_module_problem,
    labctl_kernel_bundle_note,
    labctl_kernel_bundle_problems,
    labctl_kernel_plan,
)


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FACTS = _load(REPO / "library" / "labctl_kernel_facts.py", "labctl_kernel_facts")

# apt-cache policy as apt 2.6 prints it (unknown names print nothing).
FRESH_POLICY = """\
linux-headers-6.1.0-50-amd64:
  Installed: (none)
  Candidate: (none)
  Version table:
linux-headers-amd64:
  Installed: (none)
  Candidate: 6.1.192-2
  Version table:
     6.1.192-2 500
        500 file:/srv/labctl/bundle/apt ./ Packages
linux-image-amd64:
  Installed: 6.1.176-1
  Candidate: 6.1.192-2
  Version table:
     6.1.192-2 500
        500 file:/srv/labctl/bundle/apt ./ Packages
 *** 6.1.176-1 100
        100 /var/lib/dpkg/status
"""


def _kernels(running: str, boot: str | None = None, entries: list[dict[str, Any]] | None = None,
             metas: dict[str, str] | None = None, heads: dict[str, str] | None = None) -> dict[str, Any]:
    metas = {"linux-image-amd64": "6.1.176-1"} if metas is None else metas
    return {
        "running": running, "boot": boot or running,
        "kernels": entries if entries is not None else [{"release": running, "installed": True, "headers": False,
                                                          "module": "", "module_version": "", "module_signer": ""}],
        "image_metas": metas, "headers_metas": {m: FACTS.headers_meta(m) for m in metas},
        "installed_headers_metas": heads or {}, "nvidia_server_packages": [],
    }


def _entry(release: str, headers: bool, version: str = "") -> dict[str, Any]:
    module = f"/lib/modules/{release}/updates/dkms/nvidia.ko" if version else ""
    return {"release": release, "installed": True, "headers": headers, "module": module,
            "module_version": version, "module_signer": ""}


def test_apt_policy_reads_installed_and_candidate() -> None:
    policy = labctl_apt_policy(FRESH_POLICY)
    assert policy["linux-headers-6.1.0-50-amd64"] == {"installed": "", "candidate": ""}
    assert policy["linux-image-amd64"] == {"installed": "6.1.176-1", "candidate": "6.1.192-2"}
    assert "linux-headers-6.1.0-99-amd64" not in policy


def test_a_fresh_host_whose_kernel_has_no_headers_gets_the_bundles_kernel_first() -> None:
    """Debian 12 installed from an older point release: 6.1.0-50 runs, its headers are nowhere."""
    plan = labctl_kernel_plan(_kernels("6.1.0-50-amd64"), FRESH_POLICY, True)
    assert plan["problems"] == []
    assert plan["kernel_upgrade"] is True
    assert plan["install"] == ["linux-image-amd64=6.1.192-2", "linux-headers-amd64=6.1.192-2"]
    assert "6.1.0-50-amd64 has no headers anywhere" in plan["notes"][0]
    refused = labctl_kernel_plan(_kernels("6.1.0-50-amd64"), FRESH_POLICY, False)
    assert refused["install"] == ["linux-headers-amd64"] and refused["kernel_upgrade"] is False
    assert "nvidia_driver_kernel_upgrade is false" in refused["problems"][0]


def test_the_headers_metapackage_of_the_hosts_flavour_is_installed() -> None:
    """Today's kernel with headers available: its headers and the flavour's headers metapackage."""
    policy = FRESH_POLICY.replace("linux-headers-6.1.0-50-amd64:\n  Installed: (none)\n  Candidate: (none)",
                                  "linux-headers-6.1.0-50-amd64:\n  Installed: (none)\n  Candidate: 6.1.176-1")
    plan = labctl_kernel_plan(_kernels("6.1.0-50-amd64"), policy, True)
    assert plan == {"install": ["linux-headers-6.1.0-50-amd64", "linux-headers-amd64"], "kernel_upgrade": False,
                    "problems": [], "notes": []}
    # Installed already: nothing to do (a re-run).
    done = policy.replace("linux-headers-amd64:\n  Installed: (none)", "linux-headers-amd64:\n  Installed: 6.1.192-2")
    entries = [_entry("6.1.0-50-amd64", True, "580.95.05")]
    assert labctl_kernel_plan(_kernels("6.1.0-50-amd64", entries=entries), done, True)["install"] == []


def test_ubuntu_hwe_maps_to_its_own_headers_metapackage() -> None:
    assert FACTS.headers_meta("linux-image-generic-hwe-24.04") == "linux-headers-generic-hwe-24.04"
    assert FACTS.headers_meta("linux-image-cloud-amd64") == "linux-headers-cloud-amd64"
    kernels = _kernels("6.8.0-49-generic", entries=[_entry("6.8.0-49-generic", True, "580.95.05")],
                       metas={"linux-image-generic-hwe-24.04": "6.11.0-29.29~24.04.1"})
    plan = labctl_kernel_plan(kernels, "linux-headers-generic-hwe-24.04:\n  Installed: (none)\n  Candidate: (none)\n", True)
    assert "the repository has no linux-headers-generic-hwe-24.04" in plan["problems"][0]


def test_a_next_kernel_without_headers_stops_the_run() -> None:
    entries = [_entry("6.1.0-56-amd64", True, "580.95.05"), _entry("6.1.0-57-amd64", False)]
    kernels = _kernels("6.1.0-56-amd64", "6.1.0-57-amd64", entries, heads={"linux-headers-amd64": "6.1.192-2"})
    policy = "linux-headers-amd64:\n  Installed: 6.1.192-2\n  Candidate: 6.1.192-2\n"
    plan = labctl_kernel_plan(kernels, policy, True)
    assert len(plan["problems"]) == 1
    assert "the kernel the host boots next, 6.1.0-57-amd64, has no headers" in plan["problems"][0]
    # Once its headers are in the repository, they are installed instead.
    policy += "linux-headers-6.1.0-57-amd64:\n  Installed: (none)\n  Candidate: 6.1.192-3\n"
    assert labctl_kernel_plan(kernels, policy, True) == {
        "install": ["linux-headers-6.1.0-57-amd64"], "kernel_upgrade": False, "problems": [], "notes": []}


def test_no_newer_kernel_and_no_headers_is_a_problem() -> None:
    policy = FRESH_POLICY.replace("Candidate: 6.1.192-2\n  Version table:\n     6.1.192-2 500\n        500 file:/srv/labctl"
                                  "/bundle/apt ./ Packages\n *** 6.1.176-1", "Candidate: 6.1.176-1\n  Version table:\n *** 6.1.176-1")
    plan = labctl_kernel_plan(_kernels("6.1.0-50-amd64"), policy, True)
    assert any("carries no newer linux-image-amd64" in p for p in plan["problems"]), plan


@pytest.mark.parametrize(("entry", "expected"), [
    (_entry("6.1.0-57-amd64", True, "580.95.05"), ""),
    (_entry("6.1.0-57-amd64", False), "it has no nvidia module (modinfo -k 6.1.0-57-amd64 nvidia); its headers are missing"),
    (_entry("6.1.0-57-amd64", True, "575.57.08"), "its nvidia module is 575.57.08"),
])
def test_the_next_boots_kernel_must_have_the_driver(entry: dict[str, Any], expected: str) -> None:
    kernels = _kernels("6.1.0-56-amd64", "6.1.0-57-amd64", [_entry("6.1.0-56-amd64", True, "580.95.05"), entry])
    problem = labctl_boot_module_problem(kernels, "580.95.05-1")
    if expected:
        assert expected in problem and "would come up without GPUs" in problem and "Running: 6.1.0-56-amd64" in problem
    else:
        assert problem == ""


def test_preflight_sees_a_kernel_dkms_could_not_build_for() -> None:
    fresh = _kernels("6.1.0-50-amd64")
    with_kernel = {"linux-image-amd64": "6.1.192-2", "linux-headers-amd64": "6.1.192-2"}
    assert labctl_kernel_bundle_problems(fresh, with_kernel) == []
    assert "the GPU layer installs the bundle's kernel (linux-image-amd64 6.1.192-2)" in labctl_kernel_bundle_note(fresh, with_kernel)
    assert labctl_kernel_bundle_note(fresh, dict(with_kernel, **{"linux-headers-6.1.0-50-amd64": "6.1.176-1"})) == ""
    no_newer = labctl_kernel_bundle_problems(fresh, {"linux-headers-amd64": "6.1.192-2"})
    assert len(no_newer) == 1 and "the running kernel 6.1.0-50-amd64 has no headers" in no_newer[0]
    no_meta = labctl_kernel_bundle_problems(fresh, {"linux-headers-6.1.0-50-amd64": "6.1.176-1"})
    assert len(no_meta) == 1 and "the bundle lacks linux-headers-amd64" in no_meta[0]
    entries = [_entry("6.1.0-56-amd64", True, "580.95.05"), _entry("6.1.0-57-amd64", False)]
    next_kernel = _kernels("6.1.0-56-amd64", "6.1.0-57-amd64", entries, heads={"linux-headers-amd64": "6.1.192-2"})
    without = labctl_kernel_bundle_problems(next_kernel, with_kernel)
    assert len(without) == 1 and "the kernel this host boots next, 6.1.0-57-amd64, has no headers" in without[0]
    assert labctl_kernel_bundle_problems(next_kernel, dict(with_kernel, **{"linux-headers-6.1.0-57-amd64": "6.1.192-3"})) == []
    server = dict(fresh, nvidia_server_packages=["libnvidia-compute-580-server", "nvidia-dkms-580-server-open"])
    problems = labctl_kernel_bundle_problems(server, with_kernel, headers=False)
    assert len(problems) == 1 and "apt-get purge libnvidia-compute-580-server nvidia-dkms-580-server-open" in problems[0]


def test_kernel_facts_parsers() -> None:
    assert max(["6.1.0-9-amd64", "6.1.0-50-amd64", "6.1.0-10-amd64"], key=FACTS.version_key) == "6.1.0-50-amd64"
    installed = FACTS.parse_dpkg("installed linux-image-amd64 6.1.176-1\nconfig-files linux-image-6.1.0-40-amd64 6.1.153-1\n"
                                 "installed linux-image-6.1.0-50-amd64 6.1.176-1\ninstalled linux-headers-generic 6.8.0-49.49\n"
                                 "installed linux-image-unsigned-6.8.0-49-generic 6.8.0-49.49\n"
                                 "installed nvidia-dkms-580-server-open 580.126.20-0ubuntu0.24.04.1\n"
                                 "installed nvidia-firmware-580-server-580.126.20 580.126.20-0ubuntu0.24.04.1\n"
                                 "installed nvidia-dkms-580-open 580.95.05-0ubuntu1\n")
    images, heads_of, heads = FACTS.metas(installed)
    assert images == {"linux-image-amd64": "6.1.176-1"}
    assert heads_of == {"linux-image-amd64": "linux-headers-amd64"}
    assert heads == {"linux-headers-generic": "6.8.0-49.49"}
    assert FACTS.server_packages(installed) == ["nvidia-dkms-580-server-open", "nvidia-firmware-580-server-580.126.20"]
    fields = FACTS.parse_modinfo("filename:       /lib/modules/6.1.0-56-amd64/updates/dkms/nvidia.ko\nversion:        580.95.05\n"
                                 "signer:         DKMS module signing key\nsignature:      76:10:B6\n\t\tCA:EB\n")
    assert fields["filename"].endswith("nvidia.ko") and fields["version"] == "580.95.05"
    assert fields["signer"] == "DKMS module signing key"


def _ansible(module: str, args: dict[str, Any], library: Path, path: str) -> dict[str, Any]:
    cmd = [str(BIN / "ansible"), "localhost", "-c", "local", "-m", module, "-a", json.dumps(args), "-o"]
    env = dict(os.environ, ANSIBLE_LIBRARY=str(library), ANSIBLE_LOCALHOST_WARNING="False", PATH=path,
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False).stdout
    assert "=>" in out, out
    return json.loads(out.split("=>", 1)[1])  # type: ignore[no-any-return]


def test_kernel_facts_module(tmp_path: Path) -> None:
    """The module on a laid-out /boot and /lib/modules, with modinfo and dpkg-query answering as kmod
    30 and dpkg 1.21 do (modinfo's error for a missing module is kmod's own words)."""
    boot, modules, tools = tmp_path / "boot", tmp_path / "modules", tmp_path / "bin"
    for path in (boot, modules, tools):
        path.mkdir()
    for release in ("6.1.0-50-amd64", "6.1.0-56-amd64"):
        (boot / f"vmlinuz-{release}").write_text("")
        (modules / release).mkdir()
    (modules / "6.1.0-56-amd64" / "build" / "include").mkdir(parents=True)
    release_file = tmp_path / "osrelease"
    release_file.write_text("6.1.0-50-amd64\n")
    (tools / "modinfo").write_text(
        "#!/bin/sh\nif [ \"$2\" = 6.1.0-56-amd64 ]; then\n"
        "printf 'filename:       /lib/modules/6.1.0-56-amd64/updates/dkms/nvidia.ko\\nversion:        580.95.05\\n'\n"
        "exit 0; fi\necho 'modinfo: ERROR: Module nvidia not found.' >&2; exit 1\n")
    (tools / "dpkg-query").write_text(
        "#!/bin/sh\nprintf 'installed linux-image-amd64 6.1.192-2\\ninstalled linux-image-6.1.0-56-amd64 6.1.192-2\\n"
        "installed linux-headers-amd64 6.1.192-2\\n'\n")
    for tool in tools.iterdir():
        tool.chmod(0o755)
    result = _ansible("labctl_kernel_facts", {"release_file": str(release_file), "boot_dir": str(boot),
                                              "modules_dir": str(modules)}, REPO / "library", f"{tools}:{BIN}:/usr/bin:/bin")
    assert result["running"] == "6.1.0-50-amd64" and result["boot"] == "6.1.0-56-amd64"
    by = {k["release"]: k for k in result["kernels"]}
    assert by["6.1.0-50-amd64"]["headers"] is False and by["6.1.0-50-amd64"]["module"] == ""
    assert by["6.1.0-56-amd64"]["headers"] is True and by["6.1.0-56-amd64"]["module_version"] == "580.95.05"
    assert result["image_metas"] == {"linux-image-amd64": "6.1.192-2"}
    assert result["installed_headers_metas"] == {"linux-headers-amd64": "6.1.192-2"}
    assert result["changed"] is False


@pytest.mark.parametrize(("distribution", "key", "words"), [
    ("Debian", "/var/lib/dkms/mok.pub", "mokutil --import /var/lib/dkms/mok.pub"),
    ("Ubuntu", "/var/lib/shim-signed/mok/MOK.der", "update-secureboot-policy --enroll-key"),
])
def test_secure_boot_checks_the_key_the_distributions_dkms_signs_with(tmp_path: Path, distribution: str, key: str,
                                                                      words: str) -> None:
    efivars = tmp_path / "efivars"
    efivars.mkdir()
    (efivars / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(b"\x06\x00\x00\x00\x01")
    result = _ansible("labctl_secure_boot", {"efivars_dir": str(efivars), "distribution": distribution},
                      REPO / "roles" / "preflight" / "library", f"{BIN}:/usr/bin:/bin")
    assert result["secure_boot"] is True and result["key"] == key
    assert result["key_enrolled"] is False and "does not exist" in result["key_detail"]
    assert words in result["enroll"]


# --- the doubles ----------------------------------------------------------------------------------

KERNEL_BUILDER = _load(REPO / "tests" / "fixtures" / "kernel-repo" / "build_kernels.py", "kernel_repo_build")


def test_the_stub_kernels_have_debians_names_versions_and_dependencies() -> None:
    """Fields copied from the real packages of bookworm-security (apt-cache show, 2026-12-04):
    linux-image-6.1.0-57-amd64 6.1.192-3 (source linux-signed-amd64 6.1.192+3), its headers, the metas."""
    pkgs = {p.name: p for p in KERNEL_BUILDER.packages()["update"]}
    image = pkgs["linux-image-6.1.0-57-amd64"]
    assert (image.version, image.source) == ("6.1.192-3", "linux-signed-amd64 (6.1.192+3)")
    assert image.depends == ["kmod", "linux-base (>= 4.3~)", "initramfs-tools (>= 0.120+deb8u2) | linux-initramfs-tool"]
    assert image.conflicts == ["linux-image-6.1.0-57-amd64-unsigned"]
    heads = pkgs["linux-headers-6.1.0-57-amd64"]
    assert heads.depends == ["linux-headers-6.1.0-57-common (= 6.1.192-3)", "linux-kbuild-6.1 (>= 6.1.192-3)",
                             "linux-compiler-gcc-12-x86"]
    assert pkgs["linux-image-amd64"].depends == ["linux-image-6.1.0-57-amd64 (= 6.1.192-3)"]
    assert pkgs["linux-image-amd64"].provides == ["linux-image-generic", "linux-latest-modules-6.1.0-57-amd64"]
    assert pkgs["linux-headers-amd64"].depends == ["linux-headers-6.1.0-57-amd64 (= 6.1.192-3)"]
    assert pkgs["linux-headers-amd64"].provides == ["linux-headers-generic"]
    # Debian keeps only the current ABI's headers: the fresh host's kernel has none anywhere.
    fresh = {p.name for p in KERNEL_BUILDER.packages()["fresh"]}
    assert fresh == {"linux-image-6.1.0-50-amd64", "linux-image-amd64"}
    # The hooks DKMS and initramfs-tools act through, as Debian's maintainer scripts run them.
    assert "/etc/kernel/postinst.d" in image.scripts["postinst"]
    assert "run-parts --report --exit-on-error --arg=6.1.0-57-amd64 /etc/kernel/header_postinst.d" in heads.scripts["postinst"]


def test_the_module_build_stand_in_refuses_a_kernel_without_its_headers(tmp_path: Path) -> None:
    script = (REPO / "tests" / "fixtures" / "nvidia-repo" / "stubs" / "dkms-build").read_text()
    script = script.replace("@VERSION@", "580.95.05").replace("@FLAVOUR@", "open")
    build = tmp_path / "dkms-build"
    build.write_text(script)
    build.chmod(0o755)
    headers = tmp_path / "headers"
    missing = subprocess.run([str(build), "6.1.0-57-amd64", str(headers)], cwd=tmp_path, capture_output=True, text=True,
                             check=False)
    assert missing.returncode == 1 and "headers of that kernel are not installed" in missing.stderr
    (headers / ".kernelvariables").parent.mkdir(parents=True, exist_ok=True)
    (headers / ".kernelvariables").write_text("CC = $(if $(DEBIAN_KERNEL_USE_CCACHE),$(CCACHE)) $(CROSS_COMPILE)gcc\n")
    for rel in ("include/generated/autoconf.h", ".config", "Module.symvers", "scripts/.keep"):
        (headers / rel).parent.mkdir(parents=True, exist_ok=True)
        (headers / rel).write_text("")
    (headers / "include/generated/utsrelease.h").write_text('#define UTS_RELEASE "6.1.0-56-amd64"\n')
    other = subprocess.run([str(build), "6.1.0-57-amd64", str(headers)], cwd=tmp_path, capture_output=True, text=True,
                           check=False)
    assert other.returncode == 1 and "headers of another kernel" in other.stderr
    (headers / "include/generated/utsrelease.h").write_text('#define UTS_RELEASE "6.1.0-57-amd64"\n')
    built = subprocess.run([str(build), "6.1.0-57-amd64", str(headers)], cwd=tmp_path, capture_output=True, text=True,
                           check=False)
    assert built.returncode == 0, built.stderr
    # An ELF object whose .modinfo names the release and the target kernel (modinfo reads it in the gpu scenario).
    module = (tmp_path / "nvidia.ko").read_bytes()
    assert module[:4] == b"\x7fELF"
    assert b"version=580.95.05\0" in module and b"vermagic=6.1.0-57-amd64 SMP" in module


def test_nvidia_smi_stub_refuses_another_loaded_driver(tmp_path: Path) -> None:
    """NVML after a driver upgrade without a reboot: the kernel module is the old release."""
    stub = REPO / "tests" / "fixtures" / "nvidia-smi" / "nvidia-smi-stub"
    share, run = tmp_path / "share", tmp_path / "run"
    share.mkdir()
    run.mkdir()
    (share / "gpus.json").write_text((REPO / "tests" / "fixtures" / "nvidia-smi" / "h200x2.json").read_text())
    (share / "driver_version").write_text("580.105.08\n")
    (run / "loaded-version").write_text("580.95.05\n")
    env = dict(os.environ, NVIDIA_SMI_STUB_SHARE=str(share), NVIDIA_SMI_STUB_RUN=str(run))
    out = subprocess.run([sys.executable, str(stub), "-L"], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 18
    assert out.stdout == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.105\n"
    (run / "loaded-version").write_text("580.105.08\n")
    assert subprocess.run([sys.executable, str(stub), "-L"], capture_output=True, env=env, check=False).returncode == 0
