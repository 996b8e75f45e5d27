"""Effective state after host_tuning (values from molecule/host_tuning/molecule.yml)."""

from __future__ import annotations

import re


def test_sysctl_file_persists_every_parameter(host):
    conf = host.file("/etc/sysctl.d/90-labctl-inference.conf")
    assert conf.user == "root" and conf.mode == 0o644
    text = conf.content_string
    assert "vm.swappiness = 5" in text  # the scenario's override wins over the default 1
    assert "vm.max_map_count = 1048576" in text
    assert "net.ipv4.tcp_rmem = 4096 87380 134217728" in text
    assert "kernel.numa_balancing = 0" in text


def test_sysctl_values_are_live_where_the_kernel_allows_it(host):
    """Each persisted key is either in effect or not writable here (containers: read-only /proc/sys)."""
    proc_sys_read_only = "ro" in host.check_output("findmnt -no OPTIONS /proc/sys").split(",")
    for line in host.file("/etc/sysctl.d/90-labctl-inference.conf").content_string.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, wanted = (part.strip() for part in line.partition("="))
        assert re.fullmatch(r"[a-z0-9_.-]+", key) and wanted, line
        path = "/proc/sys/" + key.replace(".", "/")
        if not host.file(path).exists:
            continue  # e.g. net.core.netdev_max_backlog inside a network namespace
        live = " ".join(host.file(path).content_string.split())
        assert live == wanted or proc_sys_read_only, f"{key}: live {live}, wanted {wanted}"


def test_dev_shm_has_the_configured_size(host):
    assert "size=262144k" in host.check_output("findmnt -no OPTIONS /dev/shm")
    fstab = host.file("/etc/fstab").content_string
    assert "/dev/shm" in fstab and "size=256M" in fstab


def test_apt_timers_and_unattended_upgrades_are_masked_and_stopped(host):
    for unit in ("apt-daily.timer", "apt-daily-upgrade.timer", "unattended-upgrades.service"):
        assert host.run(f"systemctl is-enabled {unit}").stdout.strip() == "masked", unit
        # "failed" when a run before the masking failed (no network): stopped either way.
        assert host.run(f"systemctl is-active {unit}").stdout.strip() in ("inactive", "failed"), unit
    # Units the distro does not have are not masked into existence.
    assert not host.file("/etc/systemd/system/motd-news.timer").exists


def test_apt_periodic_is_zero_in_effect(host):
    dump = host.check_output("apt-config dump APT::Periodic")
    assert 'APT::Periodic::Unattended-Upgrade "0";' in dump
    assert 'APT::Periodic::Update-Package-Lists "0";' in dump


def test_services_get_the_raised_limits(host):
    assert host.check_output("systemctl show --property DefaultLimitNOFILE --value") == "16384"
    assert host.check_output("systemctl show --property DefaultLimitMEMLOCK --value") == "infinity"
    # A fresh service really runs with them.
    assert host.check_output("systemd-run --quiet --wait --pipe sh -c 'ulimit -n'") == "16384"
    limits = host.file("/etc/security/limits.d/90-labctl.conf").content_string
    assert "* hard nofile 16384" in " ".join(limits.split())


def test_governor_unit_is_enabled_and_skips_without_cpufreq(host):
    assert host.check_output("systemctl is-enabled labctl-cpu-governor.service") == "enabled"
    assert not host.file("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").exists
    # Condition not met in a container: the unit is skipped, not failed.
    assert host.run("systemctl is-failed labctl-cpu-governor.service").stdout.strip() != "failed"


def test_the_firewall_is_loaded_with_ssh_first_and_the_topologys_ports(host):
    """One host that is GPU, gateway and monitoring host at once: the replicas and the exporter are
    on loopback (no rule), the gateway and Grafana open to the client networks, SSH to the admin
    network only, first. Loaded by its unit now and at boot."""
    unit = host.service("labctl-firewall.service")
    assert unit.is_enabled and unit.is_running
    conf = host.file("/etc/labctl/firewall/labctl.nft")
    assert (conf.user, conf.group, conf.mode) == ("root", "root", 0o640)
    chain = host.check_output("nft list chain inet labctl input")
    assert "type filter hook input priority filter - 10; policy drop;" in chain, chain
    rules = [line.strip() for line in chain.splitlines()
             if line.strip() and not line.strip().startswith(("table", "chain", "type", "#", "}"))]
    assert rules[0] == "tcp dport 22 ip saddr 10.99.0.0/16 accept", rules
    clients = "{ 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16 }"
    assert [r for r in rules if r.startswith("tcp dport") and "dport 22 " not in r] == [
        f"tcp dport 3000 ip saddr {clients} accept", f"tcp dport 4000 ip saddr {clients} accept"], rules
    assert host.check_output("nft list tables").split().count("labctl") == 1



def test_only_the_replicas_clients_may_connect_to_them(host):
    """The outbound chain: vLLM answers /invocations, /tokenize... without its key, so a new connection
    to a replica's port on this host from any user but root, the proxy and Prometheus gets a reset.
    Their accounts exist before the firewall (playbooks/host.yml, the litellm and prometheus roles'
    tasks/account.yml), as Debian's prometheus package would make its own."""
    uids = sorted(host.user(name).uid for name in ("root", "litellm", "prometheus"))
    assert host.user("prometheus").home == "/var/lib/prometheus" and host.user("prometheus").shell == "/usr/sbin/nologin"
    chain = host.check_output("nft list chain inet labctl output")
    assert "type filter hook output priority filter - 10; policy accept;" in chain, chain
    assert (f'ct state new oif "lo" tcp dport {{ 8000, 8001 }} meta skuid != {{ {", ".join(map(str, uids))} }} '
            "reject with tcp reset") in chain, chain
