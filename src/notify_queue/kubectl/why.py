"""`kubectl notify why NAME`: everything that says why a Notification is where it is.

The report is a pure function of what was read (the object, its policy, the API's notification
or the reason it could not be read), so the text and `-o json` say the same thing, and a test can
check the rules without a cluster.

Where the waiting reason comes from, first that is there: the object's `status.waiting`
(docs/operator.md) unless its `until` has passed (the operator writes it again then; until it
has, that word is older than the notification's state), the API's `waiting` (computed when read:
`NoWorker` among them), and else, for a Pending object, its `Reconciling` condition, whose reason
and message the operator writes for every notification still in progress, with
`status.nextAttemptAt` as the time it is due again.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from notify_queue.kubectl.output import NONE, fields, parse_time, relative, table
from notify_queue.services.kube import DEFAULT_POLICY

FINAL_PHASES = {"Sent", "Failed", "DeadLettered", "Cancelled", "Expired", "Rejected", "Suppressed"}


def _condition(obj: dict[str, Any], type: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type:
            return dict(c)
    return None


def waiting_of(
    obj: dict[str, Any], api: dict[str, Any] | None, now: datetime | None = None
) -> dict[str, Any] | None:
    status = obj.get("status") or {}
    waiting = status.get("waiting")
    until = parse_time(waiting.get("until")) if waiting else None
    if waiting and (until is None or until > (now or datetime.now(UTC))):
        return {**waiting, "source": "status.waiting"}
    if api and api.get("waiting"):
        return {**api["waiting"], "source": "api"}
    if status.get("phase") != "Pending":
        return None
    reconciling = _condition(obj, "Reconciling")
    if not reconciling or reconciling.get("status") != "True":
        return None
    return {
        "reason": reconciling.get("reason"),
        "until": status.get("nextAttemptAt"),
        "detail": reconciling.get("message"),
        "source": "condition Reconciling",
    }


def policy_of(
    namespace: str, spec: dict[str, Any], policy: dict[str, Any] | None, readable: bool = True
) -> dict[str, Any]:
    name = spec.get("policy") or DEFAULT_POLICY
    if not readable:
        return {"name": name, "found": None, "note": "not readable with your credentials"}
    if policy is None:
        note = "does not exist: the workers' defaults apply"
        return {"name": name, "found": False, "note": note}
    ready = _condition(policy, "Ready") or {}
    return {
        "name": name,
        "found": True,
        "ready": ready.get("status"),
        "readyReason": ready.get("reason"),
        "readyMessage": ready.get("message"),
        "spec": policy.get("spec") or {},
    }


def build_report(
    obj: dict[str, Any],
    *,
    policy: dict[str, Any],
    api: dict[str, Any] | None,
    api_note: str | None,
) -> dict[str, Any]:
    """What `why` says, as JSON. `api` is the API's notification; `api_note` why it is missing."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    report: dict[str, Any] = {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "phase": status.get("phase") or "(not handled yet)",
        "notificationId": status.get("notificationId"),
        "channel": spec.get("channel") or spec.get("channels"),
        "recipient": spec.get("recipient") or spec.get("recipientId"),
        "priority": spec.get("priority"),
        "attempts": status.get("attempts", 0),
        "maxAttempts": (api or {}).get("maxAttempts"),
        "lastError": status.get("lastError"),
        "sentAt": status.get("sentAt"),
        "provider": status.get("provider") or (api or {}).get("provider"),
        "waiting": waiting_of(obj, api),
        # What the provider reported after accepting it (docs/receipts.md).
        "delivery": status.get("delivery") or (api or {}).get("delivery"),
        "escalation": status.get("escalation"),
        "acknowledged": (meta.get("annotations") or {}).get("notifyqueue.io/acknowledged"),
        "policy": policy,
        "deliveryAttempts": (api or {}).get("deliveryAttempts"),
        "retries": (api or {}).get("retries"),
        "api": "ok" if api is not None else api_note,
    }
    if not status:
        report["note"] = "the operator has not handled this object yet (no status)"
    elif status.get("phase") == "Rejected":
        accepted = _condition(obj, "Accepted") or {}
        report["note"] = f"rejected ({accepted.get('reason')}): {accepted.get('message')}"
    return report


def _policy_line(p: dict[str, Any]) -> str:
    if not p.get("found"):
        return f"{p['name']}: {p['note']}"
    spec = p["spec"]
    parts = [f"{p['name']}: Ready={p.get('ready') or 'Unknown'}"]
    if p.get("ready") != "True" and p.get("readyMessage"):
        parts[0] += f" ({p['readyMessage']})"
    if rate := spec.get("rateLimit"):
        parts.append(f"rate {rate.get('maxPerWindow')} per {rate.get('window')}")
    if retry := spec.get("retry"):
        backoff = f"{retry.get('initialBackoff', '?')}..{retry.get('maxBackoff', '?')}"
        parts.append(f"retry {retry.get('maxAttempts', 'default')} attempts, backoff {backoff}")
    if spec.get("failover"):
        parts.append(f"failover {spec['failover']}")
    if spec.get("providers"):
        parts.append("providers " + ",".join(spec["providers"]))
    if (webhook := spec.get("webhook")) and webhook.get("url"):
        parts.append(f"webhook {webhook['url']}")
    if spec.get("ttlSecondsAfterFinished") is not None:
        parts.append(f"deleted {spec['ttlSecondsAfterFinished']}s after it finishes")
    return "; ".join(parts)


def render(report: dict[str, Any]) -> str:
    attempts = str(report["attempts"])
    if report.get("maxAttempts"):
        attempts += f" of {report['maxAttempts']}"
    waiting = report.get("waiting")
    waiting_text = None
    if waiting:
        waiting_text = str(waiting.get("reason"))
        if waiting.get("until"):
            waiting_text += f" until {relative(waiting['until'])}"
        if waiting.get("detail"):
            waiting_text += f": {waiting['detail']}"
    elif report["phase"] == "Pending":
        waiting_text = "no reason given: due, waiting for a worker"
    lines = [
        ("Name", report["name"]),
        ("Namespace", report["namespace"]),
        ("Phase", report["phase"]),
        ("Notification", report["notificationId"]),
        ("Channel", report["channel"]),
        ("Recipient", report["recipient"]),
        ("Priority", report["priority"]),
        ("Attempts", attempts),
        ("Last error", report["lastError"]),
        ("Waiting", waiting_text),
    ]
    if report.get("sentAt"):
        lines.append(("Sent at", relative(report["sentAt"])))
    if report.get("provider"):
        lines.append(("Provider", report["provider"]))
    if d := report.get("delivery"):
        said = f"{d.get('state')} {relative(d['at'])}" if d.get("at") else str(d.get("state"))
        lines.append(("Delivery", said + (f": {d['reason']}" if d.get("reason") else "")))
    if escalation := report.get("escalation"):
        lines.append(("Escalation", f"{escalation.get('id')} ({escalation.get('state')})"))
    if report.get("acknowledged"):
        lines.append(("Acknowledged", report["acknowledged"]))
    lines.append(("Policy", _policy_line(report["policy"])))
    if report.get("note"):
        lines.append(("Note", report["note"]))
    delivery = report.get("deliveryAttempts") or []
    if report["api"] != "ok":
        lines.append(("Delivery attempts", f"unavailable: {report['api']}"))
    else:
        lines.append(("Delivery attempts", len(delivery) or NONE))
    text = fields(lines)
    if delivery:
        rows = [
            (
                a.get("at"),
                a.get("provider"),
                a.get("outcome"),
                _ms(a.get("durationMs")),
                a.get("error"),
            )
            for a in delivery
        ]
        text += "\n" + _indent(table(("AT", "PROVIDER", "OUTCOME", "DURATION", "ERROR"), rows))
    if report.get("retries"):
        retries = [(r.get("at"), r.get("fromStatus")) for r in report["retries"]]
        text += "\nRetries:\n" + _indent(table(("AT", "FROM"), retries))
    return text


def _ms(value: Any) -> str | None:
    return None if value is None else f"{value}ms"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())
