"""Playbook runs driven by labctl: one at a time per inventory (lock), each with a record
(record.json, events.jsonl) and a Prometheus textfile on every host it reached."""
