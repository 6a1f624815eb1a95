#!/usr/bin/env python3
"""Write the `config` definitions of charts/notify-queue/values.schema.json from the settings.

The chart passes `config` maps to the program as NOTIFY_QUEUE_<OPTION> variables, so the schema
of those maps is derived from the one definition of every option (notify_queue.settings): the
same names, types, enums and bounds, and the option's description. A misspelt option, a bad
value or an option the role does not read (`api.config: {rate-limit: 5}`) then fails
`helm install` with the option's path instead of a crash-looping pod or a silent no-op. The
top-level `config` serves every role, so it takes any option that one of the chart's roles reads.

Options that the chart sets itself, or that must come from a Secret, are left out (EXCLUDED,
each with the reason). A pool's `channels` are written from the program's channels too; the rest
of the file is written by hand and kept as it is.

    scripts/gen-chart-schema.py           rewrite the file
    scripts/gen-chart-schema.py --check   exit 1 when the file is not what this would write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from generated import write_or_check  # scripts/ is on sys.path when run as a file

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "charts" / "notify-queue" / "values.schema.json"

# Option -> why `config` may not set it.
EXCLUDED = {
    "database-url": "secret: the Secret's database-url key (database.url or existingSecret)",
    "listen-database-url": "secret: database.listenUrlFrom, existingSecret's listen-database-url "
    "key or database.listenUrl",
    "api-token": "secret: the Secret's api-token key",
    "admin-token": "secret: the Secret's admin-token key",
    "webhook-secret": "secret: the Secret's webhook-secret key",
    "smtp-password": "secret: the Secret's smtp-password key",
    "data-dir": "only `notify-queue up` uses it",
    "kubernetes": "only `notify-queue up` uses it",
    "host": "the chart listens on all addresses inside the pod",
    "port": "api.port",
    "metrics-port": "workers.metricsPort and operator.metricsPort",
    "priorities": "a pool's priorities (they also label the pool for the operator)",
    "channels": "a pool's channels",
    "namespace": "operator.watchNamespace (it also decides Role or ClusterRole)",
    "provider": "provider.type",
    "email-provider": "provider.email",
    "sms-provider": "provider.sms",
    "push-provider": "provider.push",
    "outbound-allow": "outboundAllow",
    "providers-file": "providersFile (rendered into a ConfigMap the workers and the API mount)",
    "public-url": "publicUrl (the API and the workers need the same)",
    "unsubscribe-secret": "secret: unsubscribe.secretName's key",
    "unsubscribe-previous-secret": "secret: unsubscribe.secretName's previousKey",
    "contract": "never in the pre-upgrade hook, where the old pods still run: after the roll-out, "
    "docs/upgrading.md",
}
# Definition name -> the roles whose options it accepts.
DEFINITIONS = {
    "config": ("migrate", "api", "worker", "operator"),
    "apiConfig": ("api",),
    "workerConfig": ("worker",),
    "operatorConfig": ("operator",),
}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs and drop what means nothing for an environment variable (null, titles)."""
    if isinstance(node, dict):
        if "$ref" in node:
            return _resolve(defs[node["$ref"].rsplit("/", 1)[-1]], defs)
        if "anyOf" in node:
            options = [o for o in node["anyOf"] if o.get("type") != "null"]
            if len(options) == 1:
                merged = {**{k: v for k, v in node.items() if k != "anyOf"}, **options[0]}
                return _resolve(merged, defs)
        return {k: _resolve(v, defs) for k, v in node.items() if k not in ("title", "default")}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def config_schema(roles: tuple[str, ...]) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "src"))
    from notify_queue.settings import ROLE_SETTINGS

    properties: dict[str, Any] = {}
    for role in roles:
        full = ROLE_SETTINGS[role].model_json_schema()
        defs = full.get("$defs", {})
        for field, schema in full["properties"].items():
            option = field.replace("_", "-")
            if option not in EXCLUDED:
                properties[option] = _resolve(schema, defs)
    which = "any role's" if len(roles) > 1 else f"the {roles[0]}'s"
    return {
        "type": "object",
        "description": f"Settings by option name (docs/configuration.md): {which} options, "
        "passed as NOTIFY_QUEUE_<OPTION>. Left out, because the chart sets them or they are "
        "secret: " + "; ".join(f"{k} ({v})" for k, v in EXCLUDED.items()) + ".",
        "additionalProperties": False,
        "properties": dict(sorted(properties.items())),
    }


def tracing_schema() -> dict[str, Any]:
    """`tracing.env`: the OTEL_* variables the program reads (notify_queue.tracing.VARIABLES)."""
    sys.path.insert(0, str(ROOT / "src"))
    from notify_queue.tracing import VARIABLES

    return {
        "type": "object",
        "description": "OpenTelemetry's standard variables, set on the API, the workers and the "
        "operator (docs/operations.md, Traces). Empty: tracing off.",
        "additionalProperties": False,
        "properties": {
            name: {"type": ["string", "number", "boolean"], "description": text}
            for name, text in sorted(VARIABLES.items())
        },
    }


def channels_schema() -> dict[str, Any]:
    """A pool's `channels`: those of notify_queue.models.Channel, so a new channel is accepted
    as soon as the program knows it."""
    sys.path.insert(0, str(ROOT / "src"))
    from notify_queue.models import Channel

    return {
        "type": "array",
        "description": "The channels this pool serves (its workers' --channels). Left out: "
        "every channel, and then neither --channels nor the channels annotation is set.",
        "minItems": 1,
        "uniqueItems": True,
        "items": {"enum": [str(channel) for channel in Channel]},
    }


def render() -> str:
    document = json.loads(SCHEMA.read_text())
    for name, roles in DEFINITIONS.items():
        document["definitions"][name] = config_schema(roles)
    document["definitions"]["tracingEnv"] = tracing_schema()
    document["definitions"]["pool"]["properties"]["channels"] = channels_schema()
    return json.dumps(document, indent=2) + "\n"


def main(argv: list[str]) -> int:
    return write_or_check(SCHEMA, render(), argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
