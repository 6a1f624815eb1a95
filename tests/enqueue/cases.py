"""The validation cases the API and notify_queue_enqueue must answer alike (one table, both doors).

Each case is a create body and the key the caller passes (the API's Idempotency-Key header, the
function's idempotency_key argument; None: none passed). A case is valid when the API answers 201.
The two doors name the key's own input differently (`Idempotency-Key` / `idempotency_key`), so
the comparison maps those two fields' names and messages (KEY_FIELD, KEY_MESSAGES); every other
field and message must be equal, in order.
"""

from __future__ import annotations

from typing import Any

E = {"channel": "email", "recipient": "a@example.com", "body": "hello"}

KEY_FIELD = {"Idempotency-Key": "idempotency_key"}
KEY_MESSAGES = {
    "is required: send the header or idempotencyKey in the body": (
        "is required: pass idempotency_key or idempotencyKey in the request"
    ),
    "differs from the Idempotency-Key header": "differs from the idempotency_key argument",
}


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


CASES: list[tuple[str, dict[str, Any] | Any, str | None]] = [
    ("valid email", E, "k"),
    ("valid sms", {"channel": "sms", "recipient": "+4915112345678", "body": "x"}, "k"),
    (
        "valid push with everything",
        {
            **E,
            "channel": "push",
            "recipient": "tok",
            "subject": "s",
            "priority": "HIGH",
            "delaySeconds": 60,
            "expiresAt": "2999-01-01T00:00:00Z",
            "webhookUrl": "https://example.com/h",
            "policy": "ns/name",
            "metadata": {"a": [1, 2]},
            "category": "billing",
        },
        "k",
    ),
    ("valid key in the body", {**E, "idempotencyKey": "body-key"}, None),
    ("valid with sendAt and offset", {**E, "sendAt": "2999-01-01T00:00:00.123456789+02:00"}, "k"),
    ("not an object", ["x"], "k"),
    ("empty object", {}, "k"),
    ("no key at all", E, None),
    ("bad key", E, "has space"),
    ("body key differs", {**E, "idempotencyKey": "other"}, "k"),
    ("body key bad", {**E, "idempotencyKey": ""}, None),
    ("unknown fields", {**E, "zz": 1, "recipient_id": "x"}, "k"),
    (
        # Keys in jsonb's order (shorter first), the order the function lists unknown keys in.
        "fields a newcomer guesses",
        {"channel": "email", "to": "a@example.com", "delay": 5, "message": "hi", "send_at": 1},
        "k",
    ),
    ("channel unknown", {**E, "channel": "fax"}, "k"),
    ("channel not a string", {**E, "channel": 3}, "k"),
    ("recipient not a string", {**E, "recipient": 5}, "k"),
    ("recipient empty", {**E, "recipient": ""}, "k"),
    ("recipient blank", {**E, "recipient": "   "}, "k"),
    ("recipient too long", {**E, "recipient": "a@b." + "c" * 400}, "k"),
    ("email malformed", {**E, "recipient": "not-an-address"}, "k"),
    ("sms malformed", {**E, "channel": "sms", "recipient": "0151"}, "k"),
    ("valid voice", {"channel": "voice", "recipient": "+4930123456", "body": "x"}, "k"),
    ("voice malformed", {**E, "channel": "voice", "recipient": "030 123"}, "k"),
    # Chat, webhook and incident go to a destination name (docs/channels.md).
    ("valid chat", {"channel": "chat", "recipient": "ops#alerts", "body": "x"}, "k"),
    ("valid webhook", {"channel": "webhook", "recipient": "ci.hooks-1", "body": "{}"}, "k"),
    ("valid incident", {"channel": "incident", "recipient": "db-team", "body": "x"}, "k"),
    ("chat an address", {**E, "channel": "chat", "recipient": "a@example.com"}, "k"),
    ("webhook a URL", {**E, "channel": "webhook", "recipient": "https://example.com/h"}, "k"),
    ("incident upper case", {**E, "channel": "incident", "recipient": "DB-team"}, "k"),
    ("chat too long", {**E, "channel": "chat", "recipient": "o" * 129}, "k"),
    ("chat starts with #", {**E, "channel": "chat", "recipient": "#ops"}, "k"),
    ("subject too long", {**E, "subject": "s" * 999}, "k"),
    ("body empty", {**E, "body": ""}, "k"),
    ("body not a string", {**E, "body": ["x"]}, "k"),
    ("body too large in bytes", {**E, "body": "é" * 40000}, "k"),
    ("priority unknown", {**E, "priority": "URGENT"}, "k"),
    ("priority null", {**E, "priority": None}, "k"),
    ("sendAt without offset", {**E, "sendAt": "2026-01-01T00:00:00"}, "k"),
    ("sendAt impossible date", {**E, "sendAt": "2026-02-30T00:00:00Z"}, "k"),
    ("sendAt hour 24", {**E, "sendAt": "2026-01-01T24:00:00Z"}, "k"),
    ("sendAt not a string", {**E, "sendAt": 12}, "k"),
    ("sendAt and delaySeconds", {**E, "sendAt": "2999-01-01T00:00:00Z", "delaySeconds": 5}, "k"),
    ("delaySeconds negative", {**E, "delaySeconds": -1}, "k"),
    ("delaySeconds too large", {**E, "delaySeconds": 31536001}, "k"),
    ("delaySeconds a float", {**E, "delaySeconds": 1.5}, "k"),
    ("delaySeconds a boolean", {**E, "delaySeconds": True}, "k"),
    (
        "expiresAt before sendAt",
        {**E, "sendAt": "2999-01-02T00:00:00Z", "expiresAt": "2999-01-01T00:00:00Z"},
        "k",
    ),
    ("expiresAt in the past", {**E, "expiresAt": "2001-01-01T00:00:00Z"}, "k"),
    ("webhookUrl not http", {**E, "webhookUrl": "ftp://x"}, "k"),
    ("policy malformed", {**E, "policy": "Bad Policy"}, "k"),
    ("metadata not an object", {**E, "metadata": [1]}, "k"),
    ("metadata null", {**E, "metadata": None}, "k"),
    ("metadata too large", {**E, "metadata": {"x": "y" * 17000}}, "k"),
    ("metadata nested too deep", {**E, "metadata": _deep(40)}, "k"),
    ("recipient and recipientId", {**E, "recipientId": "u1"}, "k"),
    ("recipientId and channel", {"recipientId": "u1", "channel": "email", "body": "b"}, "k"),
    ("recipientId malformed", {"recipientId": "has space", "body": "b"}, "k"),
    ("channels without recipientId", {**E, "channels": ["email"]}, "k"),
    ("strategy without recipientId", {**E, "strategy": "first"}, "k"),
    ("channels empty", {"recipientId": "u1", "body": "b", "channels": []}, "k"),
    (
        "channels too many",
        {"recipientId": "u1", "body": "b", "channels": ["email", "sms", "push", "sms"]},
        "k",
    ),
    ("channels twice", {"recipientId": "u1", "body": "b", "channels": ["sms", "sms"]}, "k"),
    ("channels bad item", {"recipientId": "u1", "body": "b", "channels": ["sms", "fax"]}, "k"),
    (
        "channels five",
        {"recipientId": "u1", "body": "b", "channels": ["email", "sms", "push", "voice", "sms"]},
        "k",
    ),
    ("channels not a list", {"recipientId": "u1", "body": "b", "channels": "sms"}, "k"),
    ("strategy unknown", {"recipientId": "u1", "body": "b", "strategy": "some"}, "k"),
    ("category malformed", {**E, "category": "Bad!"}, "k"),
    ("template and body", {**E, "template": "t1"}, "k"),
    (
        "template malformed",
        {"channel": "email", "recipient": "a@example.com", "template": "Bad Name"},
        "k",
    ),
    ("data without template", {**E, "data": {"a": 1}}, "k"),
    (
        "data not an object",
        {"channel": "email", "recipient": "a@example.com", "template": "t", "data": 5},
        "k",
    ),
    # Digests (CONTRACT section 10, docs/digests.md).
    ("valid digest", {**E, "digest": {"key": "likes", "windowSeconds": 60}}, "k"),
    (
        "valid digest with everything",
        {**E, "digest": {"key": "likes", "windowSeconds": 86400, "maxItems": 2, "template": "t"}},
        "k",
    ),
    ("digest null", {**E, "digest": None}, "k"),
    ("digest not an object", {**E, "digest": "likes"}, "k"),
    ("digest empty", {**E, "digest": {}}, "k"),
    (
        "digest every field bad",
        {
            **E,
            "digest": {
                "key": "has space",
                "windowSeconds": 0,
                "maxItems": 1,
                "template": "Bad Name",
                "extra": 1,
            },
        },
        "k",
    ),
    (
        "digest out of range",
        {**E, "digest": {"key": "", "windowSeconds": 86401, "maxItems": 1001}},
        "k",
    ),
    (
        "digest wrong types",
        {**E, "digest": {"key": 5, "windowSeconds": 1.5, "maxItems": True, "template": 3}},
        "k",
    ),
    (
        "digest with HIGH",
        {**E, "priority": "HIGH", "digest": {"key": "k", "windowSeconds": 9}},
        "k",
    ),
    (
        "digest with delaySeconds",
        {**E, "delaySeconds": 5, "digest": {"key": "k", "windowSeconds": 9}},
        "k",
    ),
    (
        "digest with expiresAt",
        {**E, "expiresAt": "2999-01-01T00:00:00Z", "digest": {"key": "k", "windowSeconds": 9}},
        "k",
    ),
    (
        "digest with escalation",
        {
            "recipientId": "u1",
            "body": "b",
            "digest": {"key": "k", "windowSeconds": 9},
            "escalation": {"steps": [{"channel": "push"}]},
        },
        "k",
    ),
    (
        "digest bad and another field bad",
        {**E, "priority": "X", "digest": {"windowSeconds": "9"}},
        "k",
    ),
    (
        "many bad fields at once",
        {
            "channel": "fax",
            "recipient": 1,
            "body": "",
            "priority": "X",
            "delaySeconds": -5,
            "metadata": "m",
            "extra": True,
        },
        "k",
    ),
]
