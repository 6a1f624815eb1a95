"""Templates: validation of a template, and rendering it for one channel at creation time.

Rendering happens when a notification is created, never at send time: a missing variable is a
400 to the client who can fix it, and a later edit of the template does not change text already
queued (the notification records the template's name and version).

The engine is Jinja2's `SandboxedEnvironment` with `StrictUndefined`: a template cannot reach
Python internals (`''.__class__` and friends raise), and a variable missing from `data` is an
error rather than an empty string. A template is client code, so its render is bounded: every
operation that can grow a value is checked (services.sandbox), and it runs in a worker process
with a wall-clock and a memory limit (services.rendering), never on the event loop; a bound
crossed is a 400 naming the rule. Values from `data` are inserted as text and never parsed as
template code, so `{{ 7*7 }}` in data stays `{{ 7*7 }}`.

Autoescaping is off, on purpose: every body this queue sends is plain text (SMTP sends
`text/plain`, SMS and push are text), and HTML-escaping would put `&amp;` in front of the person
reading it. A template that builds markup escapes explicitly with `{{ value | e }}`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jinja2 import TemplateSyntaxError

from notify_queue.errors import FieldError, TemplateRenderFailed, ValidationFailed
from notify_queue.headers import header_value_problem
from notify_queue.limits import MAX_BODY_BYTES, MAX_SUBJECT_CHARS
from notify_queue.models import Channel
from notify_queue.services.rendering import Renderer
from notify_queue.services.sandbox import ENVIRONMENT, RULE_OUTPUT

# Which parts each channel's entry has (docs/recipients.md, docs/channels.md): SMS, chat and
# webhook have no subject; an incident's subject is its summary.
CHANNEL_PARTS: dict[Channel, tuple[str, ...]] = {
    Channel.EMAIL: ("subject", "body"),
    Channel.SMS: ("body",),
    Channel.PUSH: ("subject", "body"),
    Channel.CHAT: ("body",),
    Channel.WEBHOOK: ("body",),
    Channel.INCIDENT: ("subject", "body"),
}
_TEMPLATE_CHANNELS = ", ".join(c.value for c in CHANNEL_PARTS)
MAX_TEMPLATE_PART_BYTES = MAX_BODY_BYTES
# Each part's output cap, in characters, where its render stops (the body's final check is in
# bytes, below).
_OUTPUT_CAPS = {"subject": MAX_SUBJECT_CHARS, "body": MAX_BODY_BYTES}


def check_template_channels(value: Any, *, prefix: str = "") -> dict[str, dict[str, str]]:
    """Validate a template's `channels` object; every template must parse. Raise naming fields."""
    errors: list[FieldError] = []
    where = prefix + "channels"
    if not isinstance(value, dict) or not value:
        raise ValidationFailed([FieldError(where, "must be an object with at least one channel")])
    checked: dict[str, dict[str, str]] = {}
    for name, entry in value.items():
        field = f"{where}.{name}"
        channel = next((c for c in CHANNEL_PARTS if c.value == name), None)
        if channel is None:
            errors.append(
                FieldError(field, f"is not a channel with templates ({_TEMPLATE_CHANNELS})")
            )
            continue
        if not isinstance(entry, dict):
            errors.append(FieldError(field, "must be an object"))
            continue
        allowed = CHANNEL_PARTS[channel]
        for part in entry:
            if part not in allowed:
                errors.append(FieldError(f"{field}.{part}", f"is not a field of a {name} template"))
        if "body" not in entry:
            errors.append(FieldError(f"{field}.body", "is required"))
        for part in allowed:
            text = entry.get(part)
            if text is None:
                continue
            if not isinstance(text, str) or not text:
                errors.append(FieldError(f"{field}.{part}", "must be a non-empty string"))
                continue
            if len(text.encode("utf-8", errors="surrogatepass")) > MAX_TEMPLATE_PART_BYTES:
                errors.append(
                    FieldError(f"{field}.{part}", f"is over {MAX_TEMPLATE_PART_BYTES} bytes")
                )
                continue
            try:
                ENVIRONMENT.parse(text)  # parsing runs none of the template's code
            except TemplateSyntaxError as exc:
                errors.append(
                    FieldError(f"{field}.{part}", f"is not a valid template: {exc.message}")
                )
            except RecursionError:
                errors.append(FieldError(f"{field}.{part}", "nests too deeply"))
            else:
                if channel is Channel.WEBHOOK and not _json_shaped(text):
                    errors.append(FieldError(f"{field}.{part}", "must be a JSON object or array"))
        checked[name] = {k: v for k, v in entry.items() if isinstance(v, str)}
    if errors:
        raise ValidationFailed(errors)
    return checked


async def render(
    renderer: Renderer,
    channels: Mapping[str, Mapping[str, str]],
    channel: Channel,
    data: Mapping[str, Any],
    *,
    field_prefix: str = "",
) -> tuple[str | None, str]:
    """(subject, body) of `channel`'s entry rendered with `data`; 400 naming what is wrong.

    A render bound crossed (services.sandbox, services.rendering) is a 400 on `template` naming
    the rule; the output is streamed and stopped at each part's cap, so a template cannot build a
    megabyte body only to be refused after.
    """
    entry = channels[channel.value]
    parts = {part: (text, _OUTPUT_CAPS.get(part, MAX_BODY_BYTES)) for part, text in entry.items()}
    try:
        rendered = await renderer.render(parts, data)
    except TemplateRenderFailed as exc:
        where = f"{channel.value} {exc.part}".rstrip()
        if exc.rule == RULE_OUTPUT:  # the output cap, reported as before streaming stopped it
            cap = _OUTPUT_CAPS.get(exc.part, MAX_BODY_BYTES)
            unit = "characters" if exc.part == "subject" else "bytes"
            message = f"{where} renders over {cap} {unit} ({RULE_OUTPUT} bound)"
            raise ValidationFailed([FieldError(field_prefix + "data", message)]) from None
        field = "data" if exc.kind == "data" else "template"
        raise ValidationFailed(
            [FieldError(field_prefix + field, f"{where}: {exc.message}")]
        ) from None
    body = rendered["body"]
    subject = rendered.get("subject")
    errors = []
    if not body.strip():
        errors.append(FieldError(field_prefix + "data", f"{channel.value} body renders empty"))
    problem = None if subject is None else header_value_problem(subject)
    if problem is not None:
        # The subject becomes a header: see notify_queue.headers.
        errors.append(FieldError(field_prefix + "data", f"{channel.value} subject {problem}"))
    # Streaming stopped at MAX_BODY_BYTES characters; in bytes the body can still be over.
    if len(body.encode("utf-8", errors="surrogatepass")) > MAX_BODY_BYTES:
        errors.append(
            FieldError(
                field_prefix + "data", f"{channel.value} body renders over {MAX_BODY_BYTES} bytes"
            )
        )
    if channel is Channel.WEBHOOK and not _json(body):
        # The rendered text is the POST body (docs/channels.md).
        errors.append(
            FieldError(field_prefix + "data", "webhook body renders as no JSON object or array")
        )
    if errors:
        raise ValidationFailed(errors)
    return subject, body


def _json_shaped(text: str) -> bool:
    """Whether a webhook template's text, before rendering, reads as a JSON object or array: it
    opens with `{` or `[` and closes with `}` or `]` (a `{{ data | tojson }}` does too)."""
    stripped = text.strip()
    return stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]")


def _json(text: str) -> bool:
    """Whether a rendered webhook body is a JSON object or array, which the provider POSTs as is."""
    try:
        return isinstance(json.loads(text), dict | list)
    except ValueError:
        return False
