"""One-click unsubscribe through real processes (RFC 8058; docs/receipts.md): the worker puts a
signed List-Unsubscribe link on non-transactional email to a stored recipient (seen at the HTTP
provider); the link's GET page has one button and changes nothing; its POST opts the recipient
out of the category, after which such email is suppressed without a provider call; a forged or
altered link is 404; a link signed with the previous secret still works."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from notify_queue.services.unsubscribe import Unsubscribe, sign_token
from tests.receipts.stack import PUBLIC_URL, Stack, stack

SECRET = "current-unsubscribe-secret-0123456789"
PREVIOUS = "previous-unsubscribe-secret-9876543210"


async def _to_recipient(s: Stack, **fields: Any) -> dict[str, Any]:
    answer = await s.api.post(
        "/notifications",
        json={"recipientId": "u1", "body": "news", **fields},
        headers={"Idempotency-Key": f"k-{time.monotonic_ns()}"},
    )
    assert answer.status_code == 201, answer.text
    [made] = answer.json()["notifications"]
    return await s.final(made["id"]) if made["status"] == "PENDING" else made


async def test_a_newsletter_carries_a_one_click_link_that_opts_the_recipient_out(
    database_url: str, tmp_path: Path
) -> None:
    shared = ("--unsubscribe-secret", SECRET, "--unsubscribe-previous-secret", PREVIOUS)
    async with stack(database_url, tmp_path, shared_args=shared) as s:
        put = await s.api.put("/recipients/u1", json={"email": "u1@example.com"})
        assert put.status_code == 201

        receipt = await _to_recipient(s)  # transactional by default: no link
        plain = await s.sent(channel="email", recipient="x@example.com", body="x")
        news = await _to_recipient(s, category="newsletter")
        assert receipt["status"] == plain["status"] == news["status"] == "SENT"
        calls = {c["id"]: c for c in s.provider.calls}
        assert "headers" not in calls[receipt["id"]] and "headers" not in calls[plain["id"]]
        headers = calls[news["id"]]["headers"]
        assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        link = headers["List-Unsubscribe"]
        assert link.startswith(f"<{PUBLIC_URL}/unsubscribe/") and link.endswith(">")
        path = link[1:-1].removeprefix(PUBLIC_URL)

        page = await s.api.get(path)
        assert page.status_code == 200
        assert '<form method="post">' in page.text and page.text.count("<button") == 1
        payload, _, signature = path.removeprefix("/unsubscribe/").partition(".")
        altered = f"/unsubscribe/{payload[:-2]}{'A' if payload[-2] != 'A' else 'B'}{payload[-1]}"
        forged = "/unsubscribe/" + sign_token(
            "not-our-secret", Unsubscribe("default", "u1", "newsletter")
        )
        for bad in (f"{altered}.{signature}", forged, "/unsubscribe/nonsense"):
            assert (await s.api.get(bad)).status_code == 404
            assert (await s.api.post(bad)).status_code == 404
        preferences = (await s.api.get("/recipients/u1")).json()["preferences"]
        assert preferences["optOut"]["categories"] == []

        clicked = await s.api.post(
            path,
            content=b"List-Unsubscribe=One-Click",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert clicked.status_code == 200
        preferences = (await s.api.get("/recipients/u1")).json()["preferences"]
        assert preferences["optOut"]["categories"] == ["newsletter"]

        calls_before = len(s.provider.calls)
        stopped = await _to_recipient(s, category="newsletter")
        assert stopped["status"] == "SUPPRESSED"
        still = await _to_recipient(s, category="billing")
        assert still["status"] == "SENT"
        assert len(s.provider.calls) == calls_before + 1

        # Rotation: a link in mail signed before the secret changed still works.
        old = sign_token(PREVIOUS, Unsubscribe("default", "u1", "billing"))
        assert (await s.api.post(f"/unsubscribe/{old}")).status_code == 200
        preferences = (await s.api.get("/recipients/u1")).json()["preferences"]
        assert sorted(preferences["optOut"]["categories"]) == ["billing", "newsletter"]
