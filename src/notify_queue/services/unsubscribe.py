"""One-click unsubscribe links (RFC 8058; docs/receipts.md, "One-click unsubscribe").

A link names the tenant, the stored recipient and the category it opts out of, signed with
HMAC-SHA256 keyed by `--unsubscribe-secret`: `{payload}.{signature}`, both base64url, the payload
the JSON array `[tenant, recipient, category]`. Anyone holding the link can use it (that is what
one click means) and nobody can make one for another recipient or category. A token signed with
`--unsubscribe-previous-secret` is still accepted, so the secret can be rotated without breaking
the links in mail already sent.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass

from notify_queue.models import CRITICAL_CATEGORY, DEFAULT_CATEGORY, DEFAULT_TENANT, Channel

# Mail a recipient cannot opt out of carries no link.
UNLISTED_CATEGORIES = frozenset({DEFAULT_CATEGORY, CRITICAL_CATEGORY})


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """What a verified token opts out of."""

    tenant: str
    recipient_id: str
    category: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature(secret: str, payload: str) -> str:
    return _b64(hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest())


def sign_token(secret: str, unsubscribe: Unsubscribe) -> str:
    payload = _b64(
        json.dumps(
            [unsubscribe.tenant, unsubscribe.recipient_id, unsubscribe.category],
            separators=(",", ":"),
        ).encode()
    )
    return f"{payload}.{_signature(secret, payload)}"


def verify_token(secrets: tuple[str, ...], token: str) -> Unsubscribe | None:
    """What `token` opts out of, if one of `secrets` signed it; None for a forged or altered one."""
    payload, dot, signature = token.partition(".")
    if not dot or not any(
        hmac.compare_digest(_signature(secret, payload), signature) for secret in secrets
    ):
        return None
    try:
        tenant, recipient_id, category = json.loads(_unb64(payload))
    except (ValueError, binascii.Error, TypeError):
        return None
    if not all(isinstance(v, str) for v in (tenant, recipient_id, category)):
        return None
    return Unsubscribe(tenant, recipient_id, category)


@dataclass(frozen=True)
class UnsubscribeLinks:
    """The worker's links: `{public_url}/unsubscribe/{token}`, signed with the current secret."""

    public_url: str
    secret: str

    def headers_for(
        self, channel: Channel, recipient_id: str | None, category: str
    ) -> dict[str, str]:
        """The RFC 8058 headers of an email, or none: only email to a stored recipient of a
        category one may leave."""
        if channel is not Channel.EMAIL or recipient_id is None:
            return {}
        if category in UNLISTED_CATEGORIES:
            return {}
        token = sign_token(self.secret, Unsubscribe(DEFAULT_TENANT, recipient_id, category))
        return {
            "List-Unsubscribe": f"<{self.public_url}/unsubscribe/{token}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        }
