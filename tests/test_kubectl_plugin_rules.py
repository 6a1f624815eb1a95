"""The rules of `kubectl notify` that need no cluster: where the waiting reason comes from, the
policy line, kubectl-style durations and tables, the waiting gauge, `--api-service` parsing, and
the one-line usage of errors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from notify_queue.kubectl import top, why
from notify_queue.kubectl.api import ApiChoice, parse_service
from notify_queue.kubectl.cluster import PluginError
from notify_queue.kubectl.main import main
from notify_queue.kubectl.output import duration, relative, table


def _obj(status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "welcome", "namespace": "shop"},
        "spec": {"channel": "email", "recipient": "a@example.com", **spec},
        "status": status or {},
    }


def _reconciling(reason: str, message: str) -> dict[str, Any]:
    return {"type": "Reconciling", "status": "True", "reason": reason, "message": message}


def test_the_waiting_reason_comes_from_status_waiting_first() -> None:
    waiting = {"reason": "QuietHours", "until": "2026-01-01T07:00:00Z", "detail": "quiet"}
    obj = _obj({"phase": "Pending", "waiting": waiting,
                "conditions": [_reconciling("Waiting", "due at …")]})  # fmt: skip
    api = {"waiting": {"reason": "Backoff", "until": None, "detail": "x"}}
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert why.waiting_of(obj, api, now=now) == {**waiting, "source": "status.waiting"}


def test_a_status_waiting_whose_until_passed_gives_way_to_the_api() -> None:
    stale = {"reason": "EscalationStep", "until": "2026-01-01T07:00:00Z", "detail": "step 3"}
    obj = _obj({"phase": "Pending", "waiting": stale})
    api = {"waiting": {"reason": "NoWorker", "until": None, "detail": "no live worker"}}
    after = datetime(2026, 1, 1, 7, 0, 15, tzinfo=UTC)
    assert why.waiting_of(obj, api, now=after)["reason"] == "NoWorker"  # type: ignore[index]
    before = datetime(2026, 1, 1, 6, 59, tzinfo=UTC)
    assert why.waiting_of(obj, api, now=before)["source"] == "status.waiting"  # type: ignore[index]


def test_then_from_the_api_then_from_the_reconciling_condition() -> None:
    condition = _reconciling("RetryScheduled", "1 attempt so far (boom); next at …")
    obj = _obj({"phase": "Pending", "nextAttemptAt": "2026-01-01T00:00:05Z",
                "conditions": [condition]})  # fmt: skip
    api = {"waiting": {"reason": "Backoff", "until": "t", "detail": "d"}}
    assert why.waiting_of(obj, api)["source"] == "api"  # type: ignore[index]
    assert why.waiting_of(obj, None) == {
        "reason": "RetryScheduled",
        "until": "2026-01-01T00:00:05Z",
        "detail": "1 attempt so far (boom); next at …",
        "source": "condition Reconciling",
    }


def test_a_final_or_processing_notification_waits_for_nothing() -> None:
    assert why.waiting_of(_obj({"phase": "Sent"}), None) is None
    processing = _obj({"phase": "Processing", "conditions": [_reconciling("Delivering", "")]})
    assert why.waiting_of(processing, None) is None


def test_the_policy_line_names_what_the_policy_changes() -> None:
    policy = {
        "spec": {
            "rateLimit": {"maxPerWindow": 10, "window": "1h"},
            "retry": {"maxAttempts": 3, "initialBackoff": "1s", "maxBackoff": "1m"},
            "failover": "Always",
        },
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Mirrored"}]},
    }
    report = why.build_report(
        _obj({"phase": "Sent", "attempts": 1}, policy="fast"),
        policy=why.policy_of("shop", {"policy": "fast"}, policy),
        api=None,
        api_note="service shop/x not found",
    )
    lines = [" ".join(line.split()) for line in why.render(report).splitlines()]
    assert (
        "Policy: fast: Ready=True; rate 10 per 1h; retry 3 attempts, backoff 1s..1m; "
        "failover Always"
    ) in lines
    assert "Delivery attempts: unavailable: service shop/x not found" in lines


def test_an_object_the_operator_has_not_handled_says_so() -> None:
    report = why.build_report(
        _obj(), policy=why.policy_of("shop", {}, None), api=None, api_note="no id"
    )
    assert report["phase"] == "(not handled yet)"
    assert report["note"] == "the operator has not handled this object yet (no status)"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (59.9, "59s"), (119, "119s"), (125, "2m5s"), (600, "10m"), (179 * 60, "179m"),
     (3 * 3600 + 60, "3h1m"), (30 * 3600, "30h"), (50 * 3600, "2d2h"), (400 * 86400, "400d")],
)  # fmt: skip
def test_durations_read_like_kubectl_ages(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_relative_times_say_in_or_ago() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    assert relative("2026-01-01T12:00:42Z", now) == "2026-01-01T12:00:42Z (in 42s)"
    assert relative("2026-01-01T11:57:00.5+00:00", now) == "2026-01-01T11:57:00Z (2m59s ago)"


def test_tables_align_columns_and_show_none_for_empty_cells() -> None:
    assert table(("NAME", "ERROR"), [("a", None), ("longer", "x")]).splitlines() == [
        "NAME     ERROR",
        "a        <none>",
        "longer   x",
    ]


def test_the_waiting_gauge_is_read_when_exported_and_none_when_not() -> None:
    text = (
        "# HELP notify_queue_waiting Pending notifications per waiting reason.\n"
        "# TYPE notify_queue_waiting gauge\n"
        'notify_queue_waiting{reason="Backoff"} 3.0\n'
        'notify_queue_waiting{reason="QuietHours"} 0.0\n'
    )
    assert top.waiting_counts(text) == {"Backoff": 3.0, "QuietHours": 0.0}
    assert top.waiting_counts("# TYPE notify_queue_queue_depth gauge\n") is None


def test_api_service_names_parse_with_or_without_namespace_and_port() -> None:
    assert parse_service("nq/nq-notify-queue-api:http") == ("nq", "nq-notify-queue-api", "http")
    assert parse_service("svc") == (None, "svc", None)
    with pytest.raises(PluginError):
        parse_service("nq/")


def test_the_oldest_due_per_lane_is_read_from_the_apis_gauge() -> None:
    text = (
        "# TYPE notify_queue_queue_oldest_due_age_seconds gauge\n"
        'notify_queue_queue_oldest_due_age_seconds{priority="HIGH"} 0.0\n'
        'notify_queue_queue_oldest_due_age_seconds{priority="NORMAL"} 42.5\n'
        'notify_queue_queue_oldest_due_age_seconds{priority="LOW"} 0.0\n'
    )
    assert top.lane_oldest_due(text) == {"HIGH": 0.0, "NORMAL": 42.5, "LOW": 0.0}
    assert top.lane_oldest_due("# TYPE notify_queue_queue_depth gauge\n") is None
    report = {"status": {"due": {"NORMAL": 3}}, "oldestDue": {"NORMAL": 42.5}, "pools": []}
    rows = [line.split() for line in top.render(report | {"poolsNamespace": "nq"}).splitlines()]
    assert ["NORMAL", "3", "42s"] in rows and ["HIGH", "0", "<none>"] in rows


def test_the_api_url_comes_from_the_flag_else_the_variable_and_excludes_a_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NOTIFY_QUEUE_API_URL", "http://127.0.0.1:8080/")
    assert ApiChoice.of(None, None) == ApiChoice("http://127.0.0.1:8080", None)
    assert ApiChoice.of("http://h:1", None) == ApiChoice("http://h:1", None)
    assert ApiChoice.of(None, "nq/api") == ApiChoice(None, "nq/api")
    with pytest.raises(PluginError, match="give one"):
        ApiChoice.of("http://h:1", "nq/api")
    monkeypatch.delenv("NOTIFY_QUEUE_API_URL")
    assert ApiChoice.of(None, None) == ApiChoice(None, None)


def test_a_usage_error_exits_2_and_a_missing_kubeconfig_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["why"])
    assert usage.value.code == 2
    capsys.readouterr()
    assert main(["top", "--kubeconfig", str(tmp_path / "absent")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
