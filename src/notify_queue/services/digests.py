"""What a digest's carrier sends: the digest rendered as one message (docs/digests.md).

The claim closes a digest and hands its carrier to the worker; the worker reads the digest's
items in a statement of its own (after the close committed, so it sees every item that joined)
and renders it here. With a template (the create's `digest.template`, a stored template), the
channel's entry is rendered with `items` (each `subject`, `body`, `metadata`, `createdAt`) and
`count`, in the same sandboxed renderer as creates use; without one, the default: the first
item's subject with ` (+N more)` when N > 0, and the bodies one a line. Rendering happens at
send time because the items are only known then; a template that is gone or fails to render ends
the digest FAILED with the reason (retrying would render the same), never a partial message.
"""

from __future__ import annotations

from typing import Any

from notify_queue.errors import ValidationFailed
from notify_queue.models import Channel
from notify_queue.repositories.delivery import DigestContents
from notify_queue.services import templates
from notify_queue.services.rendering import Renderer


class DigestRenderFailed(Exception):
    """The digest cannot be rendered; the message says why (its lastError)."""


def default_rendering(items: list[dict[str, Any]]) -> tuple[str | None, str]:
    """The contract's rendering without a template: (subject, body)."""
    first = items[0].get("subject")
    more = len(items) - 1
    subject = None if first is None else (f"{first} (+{more} more)" if more > 0 else first)
    return subject, "\n".join(str(item["body"]) for item in items)


async def render_digest(
    renderer: Renderer, contents: DigestContents, channel: Channel
) -> tuple[str | None, str]:
    """(subject, body) of the digest's one message on `channel`."""
    items = contents.items
    if not items:
        raise DigestRenderFailed(f"digest {contents.key} has no items left to send")
    if contents.template is None:
        return default_rendering(items)
    channels = contents.template_channels
    if channels is None:
        raise DigestRenderFailed(f"digest template {contents.template} does not exist")
    if channel.value not in channels:
        raise DigestRenderFailed(
            f"digest template {contents.template} has no {channel.value} entry"
        )
    try:
        return await templates.render(
            renderer, channels, channel, {"items": items, "count": len(items)}
        )
    except ValidationFailed as exc:
        reasons = "; ".join(e.message for e in exc.errors)
        raise DigestRenderFailed(f"digest template {contents.template}: {reasons}") from None
