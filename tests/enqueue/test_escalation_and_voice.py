"""notify_queue_enqueue and the escalation work (docs/enqueue.md, docs/escalation.md): the
function refuses `escalation` with 0A000 (an escalation is created through the API), and takes
`voice` as the API does (the shared case table has its validation cases), calling the
recipient's voice number, else its phone, when a recipientId request names the channel."""

from __future__ import annotations

import psycopg
import pytest

from tests.enqueue.support import call_function


def test_the_function_refuses_an_escalation_as_not_supported_in_sql(database_url: str) -> None:
    body = {"recipientId": "u1", "body": "b", "escalation": {"steps": [{"channel": "sms"}]}}
    with psycopg.connect(database_url) as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
            call_function(conn, body, "esc-1")
    assert "not supported in SQL: escalation" in str(refused.value)


def test_a_recipient_id_request_for_voice_calls_the_voice_number_else_the_phone(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO nq_recipients (id, phone) VALUES ('u1', '+4915112345678'),"
            " ('u2', '+4915112345678')"
        )
        conn.execute(
            "INSERT INTO nq_recipient_voices (recipient_id, voice) VALUES ('u1', '+4930123456')"
        )
        one = call_function(conn, {"recipientId": "u1", "body": "b", "channels": ["voice"]}, "v1")
        two = call_function(conn, {"recipientId": "u2", "body": "b", "channels": ["voice"]}, "v2")
    assert [(n["channel"], n["recipient"]) for n in one["notifications"]] == [
        ("voice", "+4930123456")
    ]
    assert [n["recipient"] for n in two["notifications"]] == ["+4915112345678"]


def test_a_recipient_id_request_for_chat_webhook_and_incident_goes_to_its_destinations(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("INSERT INTO nq_recipients (id, email) VALUES ('t1', 'a@example.com')")
        conn.execute(
            "INSERT INTO nq_recipient_destinations (recipient_id, chat, webhook, incident)"
            " VALUES ('t1', 'ops', 'ci', 'db-team')"
        )
        channels = ["chat", "webhook", "incident"]
        made = call_function(conn, {"recipientId": "t1", "body": "{}", "channels": channels}, "d1")
        again = call_function(conn, {"recipientId": "t1", "body": "{}", "channels": channels}, "d1")
    assert [(n["channel"], n["recipient"]) for n in made["notifications"]] == [
        ("chat", "ops"), ("webhook", "ci"), ("incident", "db-team"),
    ]  # fmt: skip
    assert [n["id"] for n in again["notifications"]] == [n["id"] for n in made["notifications"]]
