"""A digest's stored template renders at send time, in the worker (docs/digests.md, "What the
worker does"), through real processes: a `notify-queue api` takes the items, `notify-queue worker`
processes render and send them through the HTTP provider.

The template is changed after the items were created and before any worker runs: the message
is the new version rendered with the items, in the order they joined, and their count. A digest
whose template crosses a render bound at send time (docs/recipients.md, "Bounds on a render")
ends FAILED on every item with the rule in `lastError`, nothing sent; the digests beside it, with
a template and without, are sent.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from tests.digests.test_processes import item, peers, post, workers
from tests.support import eventually, running_api

LIKES = "likes-digest"
BOMB = "growing-digest"


async def _put_template(http: httpx.AsyncClient, name: str, subject: str, body: str) -> int:
    answer = await http.put(
        f"/templates/{name}", json={"channels": {"email": {"subject": subject, "body": body}}}
    )
    assert answer.status_code in (200, 201), answer.text
    return int(answer.json()["version"])


async def test_a_digest_renders_its_stored_template_at_send_time_and_a_bound_crossed_fails_only_it(
    database_url: str, tmp_path: Path
) -> None:
    async with (
        peers() as (provider, hooks),
        running_api(database_url, tmp_path / "api.log") as url,
        httpx.AsyncClient(base_url=url) as api,
    ):
        await _put_template(api, LIKES, "old subject", "old body")
        # Grows with the items: nothing to see at PUT (parsing runs none of it), a value of
        # 600,000 characters per item at send time, over the value size bound with two items.
        await _put_template(api, BOMB, "{{ count }} follows", "{{ 'x' * (count * 600000) }}")

        def digest(recipient: str, key: str, body: str, template: str | None) -> dict[str, Any]:
            made = item(recipient, key, body)
            made["digest"]["windowSeconds"] = 2
            if template is not None:
                made["digest"]["template"] = template
            return made

        # One at a time, so the join order is the creation order.
        liked = [
            await post(api, digest("ana@example.com", "likes", f"ana-{n}", LIKES)) for n in "abc"
        ]
        bombed = [
            await post(api, digest("bo@example.com", "follows", f"bo-{n}", BOMB)) for n in "ab"
        ]
        plain = [await post(api, digest("cy@example.com", "likes", f"cy-{n}", None)) for n in "ab"]
        # Changed after the items were created: the send renders this version.
        version = await _put_template(
            api,
            LIKES,
            "{{ count }} new likes, first {{ items[0].body }}",
            "{% for i in items %}{{ loop.index }}. {{ i.subject }}\n{% endfor %}",
        )
        assert version == 2
        made = liked + bombed + plain

        with workers(database_url, provider.url, hooks.url, tmp_path / "workers.log"):

            async def all_final() -> list[dict[str, Any]] | None:
                now = [(await api.get(f"/notifications/{n['id']}")).json() for n in made]
                done = all(n["status"] in ("SENT", "FAILED") for n in now)
                return now if done else None

            final = {n["id"]: n for n in await eventually(all_final, what="every item final")}

    calls = {c["key"]: c for c in provider.calls}
    assert Counter(c["key"] for c in provider.calls) == Counter(
        {liked[0]["digest"]["id"]: 1, plain[0]["digest"]["id"]: 1}
    )
    # The template's new version, with the items in the order they joined and their count.
    likes = calls[liked[0]["digest"]["id"]]
    assert likes["subject"] == "3 new likes, first ana-a"
    assert likes["body"] == "".join(
        f"{i}. ana-{n} liked your post\n" for i, n in enumerate("abc", start=1)
    )
    assert likes["metadata"]["digest"]["count"] == 3
    assert {final[n["id"]]["status"] for n in liked + plain} == {"SENT"}
    # Without a template, the default rendering.
    assert calls[plain[0]["digest"]["id"]]["subject"] == "cy-a liked your post (+1 more)"
    # The bound crossed at send time: FAILED on every item, the rule named, nothing sent.
    for n in bombed:
        failed = final[n["id"]]
        assert failed["status"] == "FAILED"
        assert failed["lastError"].startswith(f"digest template {BOMB}: ")
        assert "exceeds the value size bound" in failed["lastError"]
    assert bombed[0]["digest"]["id"] not in calls
