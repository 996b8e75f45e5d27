"""Parsers of apt-get and pip output, on captured samples."""

from __future__ import annotations

import pytest

from labctl.bundle.apt_stage import deb_filename, pool_filename
from labctl.bundle.aptclosure import Planned, parse_print_uris, parse_simulation, pin, unresolved_names
from labctl.bundle.errors import BuildError
from labctl.bundle.probe import release_url
from labctl.bundle.wheels import parse_pip_output, parse_wheel_name

# apt-get -s install jq python3-pip (bookworm, against labctl/debian12-systemd), abridged
APT_SIMULATE = """\
Reading package lists...
Building dependency tree...
The following additional packages will be installed:
  binutils build-essential cpp gcc libjq1 libjs-jquery
The following packages will be upgraded:
  libc6
Inst libc6 [2.36-9+deb12u10] (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []
Inst libc6-dev (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])
Inst cpp (4:12.2.0-3 Debian:12.15/oldstable [amd64])
Inst gcc (4:12.2.0-3 Debian:12.15/oldstable [amd64])
Inst libjq1 (1.6-2.1+deb12u3 Debian-Security:12/oldstable-security [amd64])
Inst jq (1.6-2.1+deb12u3 Debian-Security:12/oldstable-security [amd64])
Inst libjs-jquery (3.6.1+dfsg+~3.5.14-1 Debian:12.15/oldstable [all])
Inst libfoo:i386 (1.0-1 Debian:12.15/oldstable [i386])
Inst python3-pip (23.0.1+dfsg-1 Debian:12.15/oldstable [all])
Conf libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])
Conf jq (1.6-2.1+deb12u3 Debian-Security:12/oldstable-security [amd64])
Conf python3-pip (23.0.1+dfsg-1 Debian:12.15/oldstable [all])
"""

APT_URIS = """\
'http://deb.debian.org/debian/pool/main/a/adduser/adduser_3.134_all.deb' adduser_3.134_all.deb 183272 SHA256:c24fe4eb8e60d8632d72ed104cce7c92cff200847c897dc8ba764b6c47b519e0
'http://deb.debian.org/debian/pool/main/g/gcc-defaults/cpp_12.2.0-3_amd64.deb' cpp_4%3a12.2.0-3_amd64.deb 6840 SHA256:ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF01234567
'http://deb.debian.org/debian-security/pool/updates/main/j/jq/jq_1.6-2.1%2bdeb12u3_amd64.deb' jq_1.6-2.1+deb12u3_amd64.deb 64432 MD5Sum:0123456789abcdef0123456789abcdef
"""  # noqa: E501 - apt-get's output as it prints it, one package a line

APT_ERRORS = """\
Reading package lists...
Building dependency tree...
Some packages could not be installed. This may mean that you have
The following packages have unmet dependencies:
 nvidia-open : Depends: nvidia-kernel-open-580 but it is not installable
E: Unable to locate package nosuchpkg
E: Unable to correct problems, you have held broken packages.
"""

PIP_FIRST = """\
Looking in indexes: https://pypi.org/simple, file:///opt/pypi/simple
Collecting requests==2.32.5
  Downloading requests-2.32.5-py3-none-any.whl (64 kB)
Collecting charset_normalizer<4,>=2 (from requests==2.32.5)
  Downloading charset_normalizer-3.5.3-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl (263 kB)
Processing /opt/pypi/files/idna-3.20-py3-none-any.whl (from requests==2.32.5)
Saved ./pdl/requests-2.32.5-py3-none-any.whl
Saved ./pdl/charset_normalizer-3.5.3-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl
Saved /tmp/pdl/idna-3.20-py3-none-any.whl
Successfully downloaded requests charset_normalizer idna
"""

PIP_AGAIN = """\
Collecting requests==2.32.5
  File was already downloaded /tmp/pdl/requests-2.32.5-py3-none-any.whl
Processing /opt/pypi/files/idna-3.20-py3-none-any.whl (from requests==2.32.5)
  File was already downloaded /tmp/pdl/idna-3.20-py3-none-any.whl
Collecting certifi>=2017.4.17 (from requests==2.32.5)
  Downloading certifi-2026.10.19.post1-py3-none-any.whl (134 kB)
Saved /tmp/pdl/certifi-2026.10.19.post1-py3-none-any.whl
Successfully downloaded requests idna certifi
"""


def test_parse_simulation() -> None:
    planned = parse_simulation(APT_SIMULATE)
    assert [p.name for p in planned] == [
        "libc6",
        "libc6-dev",
        "cpp",
        "gcc",
        "libjq1",
        "jq",
        "libjs-jquery",
        "libfoo",
        "python3-pip",
    ]
    assert planned[0] == Planned("libc6", "2.36-9+deb12u14", "amd64", "2.36-9+deb12u10")
    assert planned[2] == Planned("cpp", "4:12.2.0-3", "amd64")
    assert planned[6].arch == "all"
    assert planned[7] == Planned("libfoo", "1.0-1", "i386")


def test_pins_and_file_names() -> None:
    cpp = Planned("cpp", "4:12.2.0-3", "amd64")
    assert pin(cpp, "amd64") == "cpp=4:12.2.0-3"
    assert pin(Planned("libfoo", "1.0-1", "i386"), "amd64") == "libfoo:i386=1.0-1"
    assert pin(Planned("adduser", "3.134", "all"), "amd64") == "adduser=3.134"
    assert deb_filename(cpp) == "cpp_4%3a12.2.0-3_amd64.deb"
    assert pool_filename(cpp) == "cpp_12.2.0-3_amd64.deb"


def test_parse_print_uris() -> None:
    downloads = parse_print_uris(APT_URIS)
    assert [(d.file, d.size) for d in downloads] == [
        ("adduser_3.134_all.deb", 183272),
        ("cpp_4%3a12.2.0-3_amd64.deb", 6840),
        ("jq_1.6-2.1+deb12u3_amd64.deb", 64432),
    ]
    assert downloads[0].sha256 == "c24fe4eb8e60d8632d72ed104cce7c92cff200847c897dc8ba764b6c47b519e0"
    assert downloads[1].sha256 == "abcdef0123456789abcdef0123456789abcdef0123456789abcdef01234567"
    assert downloads[2].sha256 is None
    assert downloads[0].uri.endswith("adduser_3.134_all.deb")


def test_unresolved_names() -> None:
    assert unresolved_names(APT_ERRORS) == ["nvidia-open", "nosuchpkg"]
    assert unresolved_names("E: Package 'cuda-drivers-580' has no installation candidate\n") == ["cuda-drivers-580"]


def test_parse_pip_output() -> None:
    assert parse_pip_output(PIP_FIRST) == [
        "requests-2.32.5-py3-none-any.whl",
        "charset_normalizer-3.5.3-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl",
        "idna-3.20-py3-none-any.whl",
    ]
    assert parse_pip_output(PIP_AGAIN) == [
        "requests-2.32.5-py3-none-any.whl",
        "idna-3.20-py3-none-any.whl",
        "certifi-2026.10.19.post1-py3-none-any.whl",
    ]


def test_parse_wheel_name() -> None:
    wheel = parse_wheel_name("charset_normalizer-3.5.3-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert (wheel.name, wheel.version) == ("charset_normalizer", "3.5.3")
    wheel = parse_wheel_name("demo-1.0-1build-py3-none-any.whl")
    assert (wheel.name, wheel.version) == ("demo", "1.0")
    with pytest.raises(BuildError):
        parse_wheel_name("requests-2.32.5.tar.gz")


def test_release_url() -> None:
    assert release_url("https://apt.grafana.com", "stable") == "https://apt.grafana.com/dists/stable/Release"
    cuda = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/"
    assert release_url(cuda, "./") == cuda + "Release"
    assert release_url("http://x/repo", "sub/") == "http://x/repo/sub/Release"
