"""The `kubectl-notify` executable: kubectl runs it for `kubectl notify ...` when it is on PATH.

Every command reads the user's kubeconfig ($KUBECONFIG, ~/.kube/config, or `--kubeconfig`,
`--context`) and nothing else. Output is aligned text like kubectl's, or JSON with `-o json`.
An error is one line on stderr (`error: ...`, as kubectl writes them) and exit status 1; a usage
error exits with 2 (argparse). What cannot be read with the user's rights (the API through the
service proxy, a policy) degrades to a line saying so, where the rest of the answer stands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from notify_queue.kubectl import top, why
from notify_queue.kubectl.api import API_URL_VARIABLE, ApiChoice, ApiUnavailable, NotifyApi
from notify_queue.kubectl.cluster import Cluster, KubeRequestFailed, PluginError, Target
from notify_queue.kubectl.output import age, as_json, table

ACKNOWLEDGED = "notifyqueue.io/acknowledged"
# Who ran `ack`, when the API server says: the operator records it as the acknowledgement's `by`.
ACKNOWLEDGED_BY = "notifyqueue.io/acknowledged-by"
RETRYABLE_PHASES = ("Failed", "DeadLettered")
KIND = "notification.notifyqueue.io"


def _choice(args: argparse.Namespace) -> ApiChoice:
    return ApiChoice.of(args.api_url, args.api_service)


def _connect(cluster: Cluster, namespace: str, args: argparse.Namespace) -> NotifyApi:
    return NotifyApi.connect(
        cluster, namespace, _choice(args), timeout_seconds=args.request_timeout
    )


def _why(cluster: Cluster, args: argparse.Namespace) -> str:
    namespace = args.namespace or cluster.namespace
    obj = cluster.notification(namespace, args.name)
    spec = obj.get("spec") or {}
    policy_name = spec.get("policy") or "default"
    try:
        policy = why.policy_of(namespace, spec, cluster.policy(namespace, policy_name))
    except KubeRequestFailed:
        policy = why.policy_of(namespace, spec, None, readable=False)
    api_notification, api_note = None, None
    notification_id = (obj.get("status") or {}).get("notificationId")
    if notification_id:
        try:
            api = _connect(cluster, namespace, args)
            api_notification = api.get(f"/notifications/{notification_id}")
        except (ApiUnavailable, KubeRequestFailed) as exc:
            api_note = str(exc)
    else:
        api_note = "no notification id in the status yet"
    report = why.build_report(obj, policy=policy, api=api_notification, api_note=api_note)
    return as_json(report) if args.output == "json" else why.render(report)


def _top(cluster: Cluster, args: argparse.Namespace) -> str:
    report = top.build_report(
        cluster, args.namespace or cluster.namespace, _choice(args), args.request_timeout
    )
    return as_json(report) if args.output == "json" else top.render(report)


def _retry_ids(api: NotifyApi, obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Retry every row the object became (one, or one per channel of a recipientId request)
    that is Failed or DeadLettered; a row in any other status answers 409 and is left alone."""
    status = obj.get("status") or {}
    ids = status.get("notifications") or [status["notificationId"]]
    retried = []
    for notification_id in ids:
        try:
            retried.append(api.call("POST", f"/notifications/{notification_id}/retry", admin=True))
        except KubeRequestFailed as exc:
            if exc.status != 409:
                raise
    return retried


def _retry_one(
    cluster: Cluster, api: NotifyApi | None, obj: dict[str, Any], args: argparse.Namespace
) -> str:
    meta, status = obj["metadata"], obj.get("status") or {}
    name = f"{meta['namespace']}/{meta['name']}"
    phase = status.get("phase")
    if phase not in RETRYABLE_PHASES or not status.get("notificationId"):
        raise PluginError(
            f"notification {name} is {phase or 'not handled yet'}; only Failed or DeadLettered "
            "notifications can be retried"
        )
    api = api or _connect(cluster, meta["namespace"], args)
    retried = _retry_ids(api, obj)
    if not retried:
        raise PluginError(f"notification {name}: no row was Failed or DeadLettered any more")
    ids = ", ".join(str(r.get("id")) for r in retried)
    return f"{KIND}/{meta['name']} retried ({ids} PENDING again)"


def _retry(cluster: Cluster, args: argparse.Namespace) -> str:
    namespace = args.namespace or cluster.namespace
    return _retry_one(cluster, None, cluster.notification(namespace, args.name), args)


def _ack(cluster: Cluster, args: argparse.Namespace) -> str:
    """Annotate; the operator acknowledges the escalation (docs/escalation.md). An object that shows
    no escalation is annotated all the same (its CRD may predate `spec.escalation`), with a
    warning, since the annotation then acknowledges nothing."""
    namespace = args.namespace or cluster.namespace
    obj = cluster.notification(namespace, args.name)
    annotations = obj["metadata"].get("annotations") or {}
    escalation = (obj.get("status") or {}).get("escalation") or {}
    if not ((obj.get("spec") or {}).get("escalation") or escalation):
        print(
            f"warning: notification {namespace}/{args.name} shows no escalation "
            "(spec.escalation): the annotation acknowledges nothing",
            file=sys.stderr,
        )
    which = f" (escalation {escalation['id']})" if escalation.get("id") else ""
    if annotations.get(ACKNOWLEDGED) == "true":
        return f"{KIND}/{args.name} already acknowledged{which}"
    by = cluster.whoami()
    cluster.annotate(
        namespace, args.name, {ACKNOWLEDGED: "true", **({ACKNOWLEDGED_BY: by[:255]} if by else {})}
    )
    return f"{KIND}/{args.name} acknowledged{which}"


def _dead_letters(cluster: Cluster, args: argparse.Namespace) -> str:
    namespace = None if args.all_namespaces else (args.namespace or cluster.namespace)
    dead = [
        o
        for o in cluster.notifications(namespace)
        if (o.get("status") or {}).get("phase") == "DeadLettered"
    ]
    dead.sort(key=lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))
    if args.retry:
        return _retry_all(cluster, dead, args)
    if args.output == "json":
        return as_json([_dead_letter(o) for o in dead])
    if not dead:
        where = "any namespace" if namespace is None else f"namespace {namespace}"
        return f"No dead-lettered notifications in {where}."
    headers = ("NAMESPACE",) * (namespace is None) + (
        "NAME",
        "CHANNEL",
        "RECIPIENT",
        "ATTEMPTS",
        "LAST ERROR",
        "AGE",
    )
    rows = []
    for o in dead:
        d = _dead_letter(o)
        row = (d["name"], d["channel"], d["recipient"], d["attempts"], d["lastError"], d["age"])
        rows.append((d["namespace"],) * (namespace is None) + row)
    return table(headers, rows)


def _dead_letter(o: dict[str, Any]) -> dict[str, Any]:
    meta, spec, status = o["metadata"], o.get("spec") or {}, o.get("status") or {}
    error = status.get("lastError")
    return {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "notificationId": status.get("notificationId"),
        "channel": spec.get("channel") or ",".join(spec.get("channels") or []),
        "recipient": spec.get("recipient") or spec.get("recipientId"),
        "attempts": status.get("attempts"),
        "lastError": error if not error or len(error) <= 60 else error[:57] + "...",
        "age": age(meta.get("creationTimestamp")),
    }


def _retry_all(cluster: Cluster, dead: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """Retry each; a line per success on stdout as it happens, a line per failure on stderr,
    and exit status 1 when any failed."""
    retried, failed = 0, 0
    apis: dict[str, NotifyApi] = {}
    for o in dead:
        ns = o["metadata"]["namespace"]
        try:
            if ns not in apis:
                apis[ns] = _connect(cluster, ns, args)
            print(_retry_one(cluster, apis[ns], o, args), flush=True)
            retried += 1
        except PluginError as exc:
            failed += 1
            print(f"error: {exc}", file=sys.stderr, flush=True)
    if failed:
        raise PluginError(f"{failed} of {len(dead)} dead-lettered notifications not retried")
    return f"{retried} retried"


COMMANDS: dict[str, Callable[[Cluster, argparse.Namespace], str]] = {
    "why": _why,
    "top": _top,
    "retry": _retry,
    "ack": _ack,
    "dead-letters": _dead_letters,
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-n", "--namespace", help="the namespace (default: the context's)")
    common.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG, ~/.kube/config")
    common.add_argument("--context", help="the kubeconfig context to use")
    common.add_argument(
        "--api-service",
        metavar="NAMESPACE/NAME[:PORT]",
        help="the notify-queue API Service (default: found by the chart's labels)",
    )
    common.add_argument(
        "--api-url",
        metavar="URL",
        help=f"the notify-queue API itself, not through a Service (default: ${API_URL_VARIABLE}; "
        "its tokens from $NOTIFY_QUEUE_API_TOKEN and $NOTIFY_QUEUE_ADMIN_TOKEN), e.g. "
        "http://127.0.0.1:8080 for `notify-queue up --kubernetes`",
    )
    common.add_argument(
        "--request-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="per request to the API server [30]",
    )
    parser = argparse.ArgumentParser(
        prog="kubectl notify",
        description="Notify Queue from kubectl: why a notification waits, the queue now, "
        "retries, acknowledgements, dead letters.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p = sub.add_parser(
        "why",
        parents=[common, output],
        help="why a Notification is where it is: waiting, attempts, policy",
    )
    p.add_argument("name")
    sub.add_parser(
        "top",
        parents=[common, output],
        help="depth and oldest due per lane, waiting reasons, worker pools",
    )
    p = sub.add_parser(
        "retry", parents=[common], help="retry a Failed or DeadLettered Notification"
    )
    p.add_argument("name")
    p = sub.add_parser(
        "ack", parents=[common], help="acknowledge a Notification's escalation (annotation)"
    )
    p.add_argument("name")
    p = sub.add_parser(
        "dead-letters",
        parents=[common, output],
        help="list DeadLettered Notifications, or retry them all",
    )
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("--retry", action="store_true", help="retry every one listed")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cluster = Cluster(
            Target(
                kubeconfig=args.kubeconfig,
                context=args.context,
                namespace=args.namespace,
                request_timeout_seconds=args.request_timeout,
            )
        )
        try:
            print(COMMANDS[args.command](cluster, args))
        finally:
            cluster.close()
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
