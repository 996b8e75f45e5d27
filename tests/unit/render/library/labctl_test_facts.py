#!/usr/bin/python
"""Test harness only (tests/unit/render/serving.yml): hand the facts a test gives back as this host's
facts, as labctl_gpu_facts and the setup module would (gpu_numa_nodes, numa_node_cpus, processor_vcpus)."""

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(argument_spec={"facts": {"type": "dict", "required": True}}, supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts=module.params["facts"])


if __name__ == "__main__":
    main()
