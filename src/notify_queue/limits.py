"""The limits and patterns of a create request, one source for both doors: the API's validation
(services/validation.py) and the enqueue function (repositories/functions/nq_enqueue_errors.sql),
whose `{{limit:NAME}}` placeholders `migrate` fills from this module (repositories/schema.py,
`render_function`). Changing a limit here changes both; tests/enqueue/cases.py runs each case
through both doors.
"""

from __future__ import annotations

import re

from notify_queue.models import Channel

MAX_BODY_BYTES = 65_536
MAX_METADATA_BYTES = 16 * 1024
MAX_DELAY_SECONDS = 365 * 24 * 3600  # one year
MAX_RECIPIENT_CHARS = 320
MAX_SUBJECT_CHARS = 998  # RFC 5322's line limit
MAX_WEBHOOK_URL_CHARS = 2048

EMAIL_PATTERN = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s.]+$")
SMS_PATTERN = re.compile(r"^\+[0-9]{8,15}$")
# The recipient of chat, webhook and incident: a destination name that the provider maps to a
# channel id, URL or team (docs/channels.md).
DESTINATION_PATTERN = re.compile(r"^[a-z0-9][-a-z0-9._#]{0,127}$")
DESTINATION_CHANNELS = (Channel.CHAT, Channel.WEBHOOK, Channel.INCIDENT)
DESTINATION_MESSAGE = (
    "must be a destination name (a-z, 0-9 and -._#, at most 128, first a-z or 0-9)"
)
IDEMPOTENCY_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")
RFC3339_PATTERN = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)
POLICY_PATTERN = re.compile(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
)
# Recipient ids: chosen by the client, 1-255 printable ASCII characters (as idempotency keys).
RECIPIENT_ID_PATTERN = IDEMPOTENCY_KEY_PATTERN
# Template names and categories: DNS-label-like, so a NotificationTemplate's name fits.
TEMPLATE_NAME_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
CATEGORY_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9_.]{0,61}[a-z0-9])?$")
MAX_DATA_BYTES = 64 * 1024
# Digests (docs/digests.md).
MAX_DIGEST_WINDOW_SECONDS = 86_400
MIN_DIGEST_ITEMS = 2
MAX_DIGEST_ITEMS = 1_000
DEFAULT_DIGEST_ITEMS = 100
MAX_ESCALATION_STEPS = 10

# The channels a request may name, and pydantic's message for another value.
CHANNELS = tuple(channel.value for channel in Channel)
MAX_CHANNELS = len(CHANNELS)  # each at most once
CHANNEL_MESSAGE = (
    "Input should be " + ", ".join(f"'{c}'" for c in CHANNELS[:-1]) + f" or '{CHANNELS[-1]}'"
)
