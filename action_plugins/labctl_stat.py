"""Action plugin: labctl_stat, its module's light call (the target's Python, no module wrapper).

Documentation and argument spec: library/labctl_stat.py (a module too, run where the light call
cannot). The action is labctl_read's (action_plugins/labctl_read.py), which checks the task's
arguments against the module's documented options and makes the light call.
"""

from __future__ import annotations

from ansible.plugins.loader import action_loader

ActionModule = action_loader.get("labctl_read", class_only=True)
