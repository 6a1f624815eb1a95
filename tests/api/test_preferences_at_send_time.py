"""Preferences checked again at send time (CONTRACT §9, docs/recipients.md).

A recipient who opts out after a notification was queued gets nothing: the claim turns it into
SUPPRESSED, with its webhook event, and no provider is called (counted at a real HTTP provider on
loopback, through a real worker). Quiet hours defer NORMAL and LOW notifications to the end of
the recipient's window, in their timezone, across midnight and across DST changes, without using
an attempt; HIGH and category `critical` pass; an expiry inside the window expires.

Time is frozen through the documented seam, `DeliveryService(clock=...)`: the claim itself runs on
the database's clock (the notifications are due now), quiet hours are judged at the frozen moment.
"""

from __future__ import annotations

from datetime import datetime, time
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import test_utils, web

from notify_queue.models import Channel, Preferences, Priority
from notify_queue.providers.http import HttpProvider
from notify_queue.repositories.db import Database
from notify_queue.repositories.delivery import DeliveryRepository
from notify_queue.services.delivery import DeliveryService
from notify_queue.services.preferences import quiet_hours_end
from tests.api.support import api_client, key, sql
from tests.receivers import WebhookReceiver
from tests.support import defaults, eventually, start_workers

NIGHT = {"quietHours": {"start": "22:00", "end": "07:00"}}


class CountingProvider:
    """A real HTTP provider on loopback that accepts everything and counts what reached it."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        app = web.Application()
        app.router.add_post("/send", self._send)
        self.server = test_utils.TestServer(app, host="127.0.0.1")

    async def _send(self, request: web.Request) -> web.Response:
        self.ids.append((await request.json())["id"])
        return web.json_response({"messageId": f"m-{len(self.ids)}"})


def frozen(db: Database, moment: datetime) -> DeliveryService:
    """A delivery service whose clock is stopped at `moment` (the test seam)."""
    return DeliveryService(
        DeliveryRepository(db, defaults()),
        priorities=list(Priority),
        channels=list(Channel),
        clock=lambda: moment,
    )


async def targeted(http: httpx.AsyncClient, recipient: str, **body: Any) -> dict[str, Any]:
    response = await http.post(
        "/notifications",
        json={"recipientId": recipient, "channels": ["email"], "body": "hi", **body},
        headers={"Idempotency-Key": key()},
    )
    assert response.status_code == 201, response.text
    (made,) = response.json()["notifications"]
    result: dict[str, Any] = made
    return result


async def row(database_url: str, id: str) -> tuple[Any, ...]:
    (found,) = await sql(
        database_url,
        "SELECT status, attempt_count, next_attempt_at, last_error FROM nq_all_notifications "
        "WHERE id = %s",
        (id,),
    )
    return found


async def test_an_unsubscribe_after_queueing_suppresses_at_send_time_and_no_provider_is_called(
    database_url: str, db: Database
) -> None:
    provider = CountingProvider()
    receiver = await WebhookReceiver().start()
    await provider.server.start_server()
    session = aiohttp.ClientSession()
    try:
        async with api_client(database_url, db=db) as http:
            await http.put(
                "/recipients/ada",
                json={"email": "ada@example.com", "phone": "+4915112345678"},
            )
            campaign = await http.post(
                "/notifications",
                json={
                    "recipientId": "ada",
                    "category": "marketing",
                    "body": "sale",
                    "webhookUrl": receiver.url,
                },
                headers={"Idempotency-Key": "campaign-1"},
            )
            queued = campaign.json()["notifications"]
            assert [n["status"] for n in queued] == ["PENDING", "PENDING"]
            control = await http.post(
                "/notifications",
                json={"channel": "email", "recipient": "bob@example.com", "body": "receipt"},
                headers={"Idempotency-Key": "receipt-1"},
            )
            # Ada unsubscribes from marketing after the campaign was queued.
            await http.patch(
                "/recipients/ada/preferences", json={"optOut": {"categories": ["marketing"]}}
            )
        workers = await start_workers(
            database_url,
            HttpProvider(str(provider.server.make_url("/send")), 5.0, session),
            webhooks=True,
        )
        try:
            await eventually(lambda: _final(db, [n["id"] for n in queued]), what="suppressed")
            await eventually(lambda: _final(db, [control.json()["id"]]), what="control sent")
            await eventually(lambda: _events(receiver, 2), what="two SUPPRESSED events")
        finally:
            await workers.stop()
        for n in queued:
            status, attempts, _, error = await row(database_url, n["id"])
            assert (status, attempts) == ("SUPPRESSED", 0)
            assert "opted out of category marketing" in error
        assert provider.ids == [control.json()["id"]]
        assert sorted(r.json["jobId"] for r in receiver.received) == sorted(n["id"] for n in queued)
        assert {r.json["status"] for r in receiver.received} == {"SUPPRESSED"}
    finally:
        await session.close()
        await provider.server.close()
        await receiver.stop()


async def _final(db: Database, ids: list[str]) -> bool:
    found = [await db.fetch_one("notification_get", {"id": i}) for i in ids]
    return all(f is not None and f["status"] in ("SENT", "SUPPRESSED") for f in found)


async def _events(receiver: WebhookReceiver, count: int) -> bool:
    return len(receiver.received) >= count


# --- quiet hours ------------------------------------------------------------------------------

QUIET_CASES = [
    # (timezone, frozen moment in UTC, the window's end in UTC)
    pytest.param("Europe/Berlin", "2027-01-15T22:30Z", "2027-01-16T06:00Z", id="berlin-evening"),
    pytest.param("Europe/Berlin", "2027-01-16T05:00Z", "2027-01-16T06:00Z", id="berlin-morning"),
    pytest.param("America/New_York", "2027-01-16T03:30Z", "2027-01-16T12:00Z", id="new-york"),
    # The night clocks go forward (Berlin 2027-03-28, New York 2027-03-14): 07:00 is an hour
    # earlier in UTC than the evening before.
    pytest.param("Europe/Berlin", "2027-03-27T22:30Z", "2027-03-28T05:00Z", id="berlin-spring"),
    pytest.param("America/New_York", "2027-03-14T03:30Z", "2027-03-14T11:00Z", id="ny-spring"),
    # ... and back (Berlin 2027-10-31, New York 2027-11-07).
    pytest.param("Europe/Berlin", "2027-10-30T22:30Z", "2027-10-31T06:00Z", id="berlin-autumn"),
    pytest.param("America/New_York", "2027-11-07T03:30Z", "2027-11-07T12:00Z", id="ny-autumn"),
]


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(("timezone", "now", "ends"), QUIET_CASES)
async def test_quiet_hours_defer_to_the_end_of_the_window_without_using_an_attempt(
    client: httpx.AsyncClient, database_url: str, db: Database, timezone: str, now: str, ends: str
) -> None:
    await client.put(
        "/recipients/night-owl",
        json={"email": "o@example.com", "timezone": timezone, "preferences": NIGHT},
    )
    n = await targeted(client, "night-owl")
    batch = await frozen(db, utc(now)).claim(10)
    assert batch.claimed == []
    status, attempts, next_attempt_at, error = await row(database_url, n["id"])
    assert (status, attempts, next_attempt_at) == ("PENDING", 0, utc(ends))
    assert "quiet hours" in error
    assert await sql(database_url, "SELECT * FROM nq_rate_window_entries") == []


async def test_outside_quiet_hours_a_notification_is_sent(
    client: httpx.AsyncClient, db: Database
) -> None:
    await client.put(
        "/recipients/day",
        json={"email": "d@example.com", "timezone": "Europe/Berlin", "preferences": NIGHT},
    )
    n = await targeted(client, "day")
    batch = await frozen(db, utc("2027-01-15T12:00Z")).claim(10)
    assert [str(c.id) for c in batch.claimed] == [n["id"]]


@pytest.mark.parametrize(
    "fields",
    [{"priority": "HIGH"}, {"category": "critical"}],
    ids=["high-priority", "critical-category"],
)
async def test_high_priority_and_critical_pass_quiet_hours(
    client: httpx.AsyncClient, db: Database, fields: dict[str, str]
) -> None:
    await client.put(
        "/recipients/night",
        json={"email": "n@example.com", "timezone": "Europe/Berlin", "preferences": NIGHT},
    )
    n = await targeted(client, "night", **fields)
    low = await targeted(client, "night", priority="LOW")
    batch = await frozen(db, utc("2027-01-15T23:00Z")).claim(10)
    assert [str(c.id) for c in batch.claimed] == [n["id"]]
    assert low["id"] not in {str(c.id) for c in batch.claimed}


async def test_an_expiry_inside_the_quiet_window_expires_instead_of_arriving_stale(
    client: httpx.AsyncClient, database_url: str, db: Database
) -> None:
    await client.put(
        "/recipients/sleepy",
        json={"email": "s@example.com", "timezone": "Europe/Berlin", "preferences": NIGHT},
    )
    n = await targeted(
        client, "sleepy", expiresAt="2027-01-16T05:00:00Z", webhookUrl="https://hooks.example/x"
    )
    later = await targeted(client, "sleepy", expiresAt="2027-01-16T09:00:00Z")
    await frozen(db, utc("2027-01-15T22:30Z")).claim(10)
    status, attempts, _, error = await row(database_url, n["id"])
    assert (status, attempts) == ("EXPIRED", 0) and "quiet hours" in error
    assert (await row(database_url, later["id"]))[0] == "PENDING"
    events = await sql(
        database_url,
        "SELECT payload::json->>'status' FROM nq_webhook_events WHERE notification_id = %s",
        (n["id"],),
    )
    assert events == [("EXPIRED",)]


async def test_in_the_second_occurrence_of_the_autumn_hour_a_notification_is_deferred_once(
    client: httpx.AsyncClient, database_url: str, db: Database
) -> None:
    """Issue 19. Berlin, 2027-10-31 (02:00-03:00 happens twice), quiet hours 22:00-02:30, the
    worker's clock in the second 02:10 (01:10Z). Claimed, it is deferred to the second 02:30
    (01:30Z), after the clock, and claimed again then it is handed out for sending.

    Time moves as a worker sees it: each claim happens when the row is due again, on a clock that
    never goes back (a deferral to the past is due at once: claimed again at the same moment).
    The database's clock is elsewhere (the claim takes what is due by it), so the row is made due
    there by hand. Counted: the claims that deferred and the one that sent, never the time.
    Negative control (by hand, `fold=0` as before): every claim defers to the first 02:30
    (00:30Z), half an hour before the clock: five claims, five deferrals, nothing handed out."""
    await client.put(
        "/recipients/autumn",
        json={
            "email": "a@example.com",
            "timezone": "Europe/Berlin",
            "preferences": {"quietHours": {"start": "22:00", "end": "02:30"}},
        },
    )
    n = await targeted(client, "autumn")
    clock = utc("2027-10-31T01:10Z")
    deferred_to: list[datetime] = []
    handed_out: list[str] = []
    for _ in range(5):
        batch = await frozen(db, clock).claim(10)
        if batch.claimed:
            handed_out = [str(c.id) for c in batch.claimed]
            break
        status, attempts, next_attempt_at, error = await row(database_url, n["id"])
        assert (status, attempts) == ("PENDING", 0) and "quiet hours" in error
        deferred_to.append(next_attempt_at)
        clock = max(clock, next_attempt_at)
        await sql(
            database_url, "UPDATE nq_jobs SET next_attempt_at = now() WHERE id = %s", (n["id"],)
        )
    assert deferred_to == [utc("2027-10-31T01:30Z")]
    assert handed_out == [n["id"]]


async def test_a_deleted_recipients_queued_notifications_are_suppressed(
    client: httpx.AsyncClient, database_url: str, db: Database
) -> None:
    await client.put("/recipients/gone", json={"email": "g@example.com"})
    n = await targeted(client, "gone")
    assert (await client.delete("/recipients/gone")).status_code == 204
    batch = await frozen(db, utc("2027-01-15T12:00Z")).claim(10)
    assert batch.claimed == []
    status, _, _, error = await row(database_url, n["id"])
    assert status == "SUPPRESSED" and "deleted" in error


# --- the window arithmetic on its own ---------------------------------------------------------


def prefs(start: str, end: str, timezone: str = "Europe/Berlin") -> Preferences:
    h1, m1 = map(int, start.split(":"))
    h2, m2 = map(int, end.split(":"))
    return Preferences(
        exists=True, timezone=timezone, quiet_start=time(h1, m1), quiet_end=time(h2, m2)
    )


@pytest.mark.parametrize(
    ("window", "now", "ends"),
    [
        (("09:00", "17:00"), "2027-01-15T08:00Z", "2027-01-15T16:00Z"),  # daytime, inside
        (("09:00", "17:00"), "2027-01-15T16:00Z", None),  # the end itself is outside
        (("09:00", "17:00"), "2027-01-15T07:59Z", None),  # before it
        (("22:00", "07:00"), "2027-01-15T21:00Z", "2027-01-16T06:00Z"),  # the start is inside
        (("22:00", "07:00"), "2027-01-15T20:59Z", None),
        # An end inside the spring gap (02:30 does not exist on 2027-03-28 in Berlin): the window
        # ends when the clock jumps over it, 02:00 CET -> 03:00 CEST.
        (("23:00", "02:30"), "2027-03-28T00:30Z", "2027-03-28T01:00Z"),
        # An end inside the repeated hour (02:00-03:00 twice on 2027-10-31 in Berlin): the
        # occurrence after now. In the first 02:10 (00:10Z), the first 02:30; in the second
        # 02:10 (01:10Z), the second 02:30 (the first, 00:30Z, is past: issue 19's busy loop).
        (("22:00", "02:30"), "2027-10-31T00:10Z", "2027-10-31T00:30Z"),
        (("22:00", "02:30"), "2027-10-31T01:10Z", "2027-10-31T01:30Z"),
        # A window covering the repeated hour covers both occurrences ...
        (("01:00", "04:00"), "2027-10-31T00:45Z", "2027-10-31T03:00Z"),
        # ... one that starts inside it ends where the clock falls back to before its start.
        (("02:30", "04:00"), "2027-10-31T00:45Z", "2027-10-31T01:00Z"),
    ],
)
def test_the_quiet_window_end_is_computed_in_local_time(
    window: tuple[str, str], now: str, ends: str | None
) -> None:
    result = quiet_hours_end(utc(now), prefs(*window))
    assert result == (utc(ends) if ends else None)


async def test_a_notification_quiet_hours_hold_takes_no_place_in_the_recipients_rate_window(
    client: httpx.AsyncClient, database_url: str, db: Database
) -> None:
    """One notification per window for this recipient. The older one, which quiet hours hold,
    ranks first; the critical one behind it passes quiet hours and is claimed now instead of a
    whole window later (issue 19). Negative control, by hand: with the claim's `quiet_ids` left
    empty (quiet rows ranked with sendable ones, as before), the critical one is deferred by the
    window and this test fails."""
    await client.put(
        "/recipients/owl",
        json={"email": "owl@example.com", "timezone": "Europe/Berlin", "preferences": NIGHT},
    )
    held = await targeted(client, "owl")
    critical = await targeted(client, "owl", category="critical")
    moment = utc("2027-01-15T23:00Z")
    service = DeliveryService(
        DeliveryRepository(db, defaults(rate_limit=1)),
        priorities=list(Priority),
        channels=list(Channel),
        clock=lambda: moment,
    )
    batch = await service.claim(10)
    assert [str(c.id) for c in batch.claimed] == [critical["id"]]
    assert batch.rate_limited == []
    status, attempts, _, error = await row(database_url, held["id"])
    assert (status, attempts) == ("PENDING", 0) and "quiet hours" in error
    # The critical notification holds the recipient's one slot; the held one took none.
    slots = await sql(database_url, "SELECT notification_id::text FROM nq_rate_window_entries")
    assert slots == [(critical["id"],)]
