"""JSON schemas of Grafana's provisioning files, as the lab writes them (apiVersion 1).

Keys follow Grafana's provisioning documentation and its reader (pkg/services/provisioning/
datasources/types.go, .../dashboards/types.go): where Grafana lists every key of an object the
schema sets additionalProperties: false, so a typo ("isDefualt") fails instead of being ignored
silently, as Grafana would. jsonData is plugin-specific and stays open; the Prometheus keys the
lab uses are type-checked. `required` is the lab's policy (stricter than Grafana: it names uid,
isDefault and editable explicitly so nothing depends on Grafana's defaults).
"""

from __future__ import annotations

from typing import Any

_UID = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"}  # Grafana: at most 40 characters
_DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}

PROMETHEUS_JSON_DATA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "timeInterval": _DURATION,  # the scrape interval: $__rate_interval's lower bound
        "queryTimeout": _DURATION,
        "httpMethod": {"enum": ["GET", "POST"]},
        "manageAlerts": {"type": "boolean"},
        "cacheLevel": {"enum": ["Low", "Medium", "High", "None"]},
        "incrementalQuerying": {"type": "boolean"},
        "prometheusType": {"enum": ["Prometheus", "Cortex", "Mimir", "Thanos"]},
        "prometheusVersion": {"type": "string"},
    },
    "additionalProperties": True,
}

DATASOURCE: dict[str, Any] = {
    "type": "object",
    "required": ["name", "type", "access", "url", "uid", "isDefault", "editable", "jsonData"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "description": {"type": "string"},
        "type": {"type": "string", "minLength": 1},
        "access": {"enum": ["proxy", "direct"]},
        "orgId": {"type": "integer", "minimum": 1},
        "orgName": {"type": "string"},
        "uid": _UID,
        "url": {"type": "string", "pattern": "^https?://[^\\s]+$"},
        "user": {"type": "string"},
        "database": {"type": "string"},
        "basicAuth": {"type": "boolean"},
        "basicAuthUser": {"type": "string"},
        "withCredentials": {"type": "boolean"},
        "isDefault": {"type": "boolean"},
        "jsonData": {"type": "object"},
        "secureJsonData": {"type": "object", "additionalProperties": {"type": "string"}},
        "correlations": {"type": "array", "items": {"type": "object"}},
        "version": {"type": "integer", "minimum": 1},
        "editable": {"type": "boolean"},
    },
    "additionalProperties": False,
    "allOf": [{
        "if": {"properties": {"type": {"const": "prometheus"}}},
        "then": {"properties": {"jsonData": PROMETHEUS_JSON_DATA}},
    }],
}

DATASOURCES_FILE: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Grafana datasource provisioning file",
    "type": "object",
    "required": ["apiVersion", "datasources"],
    "properties": {
        "apiVersion": {"const": 1},
        "datasources": {"type": "array", "minItems": 1, "items": DATASOURCE},
        "deleteDatasources": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "orgId": {"type": "integer"}, "orgName": {"type": "string"}},
                "additionalProperties": False,
            },
        },
        "prune": {"type": "boolean"},
    },
    "additionalProperties": False,
}

DASHBOARD_PROVIDER: dict[str, Any] = {
    "type": "object",
    "required": ["name", "type", "folder", "disableDeletion", "allowUiUpdates", "updateIntervalSeconds", "options"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "orgId": {"type": "integer", "minimum": 1},
        "folder": {"type": "string"},
        "folderUid": _UID,
        "type": {"const": "file"},
        "disableDeletion": {"type": "boolean"},
        "editable": {"type": "boolean"},  # deprecated by Grafana in favour of allowUiUpdates
        "allowUiUpdates": {"type": "boolean"},
        "updateIntervalSeconds": {"type": "integer", "minimum": 1},
        "options": {
            "type": "object",
            "required": ["path"],
            "properties": {
                "path": {"type": "string", "pattern": "^/"},
                "foldersFromFilesStructure": {"type": "boolean"},
            },
            "additionalProperties": False,
        },
    },
    "additionalProperties": False,
}

DASHBOARDS_FILE: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "Grafana dashboard provider provisioning file",
    "type": "object",
    "required": ["apiVersion", "providers"],
    "properties": {
        "apiVersion": {"const": 1},
        "providers": {"type": "array", "minItems": 1, "items": DASHBOARD_PROVIDER},
    },
    "additionalProperties": False,
}
