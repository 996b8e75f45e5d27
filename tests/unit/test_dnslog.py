"""The logging resolver of the stack scenario's no-phone-home test (tests/fixtures/dnslog/dnslog.py):
run here on a high port, it must log a real lookup of an outside name with the process that sent it,
answer NXDOMAIN, and keep the host's own names out of the report."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "dnslog" / "dnslog.py"

# A child process that sends real DNS queries over UDP and waits for each answer, like a resolver
# library does; it prints each answer's rcode.
CLIENT = """
import socket, struct, sys
port = int(sys.argv[1])
for name, qtype in (("huggingface.co", 1), ("pypi.org", 28), ("testhost", 1), ("localhost", 28),
                    ("1.0.0.127.in-addr.arpa", 12)):
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\\0"
    query = struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", qtype, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(query, ("127.0.0.1", port))
    reply = s.recv(512)
    print(name, reply[0:2] == query[0:2], reply[3] & 0x0F, reply[12:] == query[12:], flush=True)
"""


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dnslog", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def resolver(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    log = tmp_path / "dns.jsonl"
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(log), "--port", str(port), "--hostname", "testhost"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "listening" in proc.stdout.readline()
        yield port, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_outside_lookup_is_logged_with_the_process_that_asked(resolver: tuple[int, Path]) -> None:
    port, log = resolver
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(port)], stdout=subprocess.PIPE, text=True)
    out, _ = client.communicate(timeout=30)
    assert client.returncode == 0
    # Every answer: same id, NXDOMAIN (3), the question echoed.
    assert out.splitlines() == [f"{n} True 3 True" for n in
                                ("huggingface.co", "pypi.org", "testhost", "localhost", "1.0.0.127.in-addr.arpa")]
    for _ in range(50):
        if len(log.read_text().splitlines()) >= 5:
            break
        time.sleep(0.1)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["name"], e["local"]) for e in entries] == [
        ("huggingface.co", False), ("pypi.org", False), ("testhost", True), ("localhost", True),
        ("1.0.0.127.in-addr.arpa", True)]
    # Same user as the resolver here: the exact process.
    assert {e["pid"] for e in entries} == {client.pid}
    assert all("import socket, struct" in e["cmdline"] and e["comm"].startswith("python") for e in entries)
    report = _load().outside_lookups(log.read_text().splitlines())
    assert len(report) == 2, report
    assert report[0].startswith("huggingface.co (A) x1 asked by pid " + str(client.pid))
    assert report[1].startswith("pypi.org (AAAA) x1 asked by pid " + str(client.pid))


def test_a_malformed_query_is_refused_and_reported(resolver: tuple[int, Path]) -> None:
    port, log = resolver
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(5)
        sock.sendto(struct.pack("!HHHHHH", 7, 0x0100, 0, 0, 0, 0), ("127.0.0.1", port))
        reply = sock.recv(512)
    assert reply[3] & 0x0F == 5  # REFUSED
    for _ in range(50):
        if log.read_text().strip():
            break
        time.sleep(0.1)
    entry = json.loads(log.read_text().splitlines()[0])
    assert entry["error"] == "no question" and entry["pid"] == os.getpid()
    assert _load().outside_lookups(log.read_text().splitlines())


def test_names_of_the_host() -> None:
    dnslog = _load()
    names = {"labctl-stack"}
    assert dnslog.is_local("labctl-stack", names) and dnslog.is_local("localhost.", names)
    assert dnslog.is_local("x.localhost", names) and dnslog.is_local("5.0.0.127.in-addr.arpa", names)
    assert not dnslog.is_local("labctl-stack.example.org", names)
    assert not dnslog.is_local("raw.githubusercontent.com", names)
    assert not dnslog.is_local("8.8.8.8.in-addr.arpa", names)
