"""Delivery receipts from vendors: verified first, then read (docs/receipts.md).

Each provider with `receipts: {scheme, ...}` gets one `ReceiptVerifier`, built once from its
spec (keys and certificates read at start, so a bad file stops the API with one line). A
request is checked against the vendor's signature over the exact bytes received before any of
it is parsed; only then are its events read into `Receipt`s, the one shape the rest of the
system sees. Each scheme follows its vendor's published verification:

- `http`: Standard Webhooks (the `standardwebhooks` library, as our own webhooks are signed),
  which also refuses a `webhook-timestamp` more than 5 minutes off.
- `twilio`: `X-Twilio-Signature`, base64 HMAC-SHA1 keyed with the auth token over the public URL
  of the request followed by each form parameter's name and value, sorted by name (Twilio's
  RequestValidator).
- `sendgrid`: the Event Webhook's ECDSA P-256 / SHA-256 signature (base64 DER) over the
  `X-Twilio-Email-Event-Webhook-Timestamp` value followed by the body; the timestamp within 5
  minutes.
- `ses`: an SNS message's RSA PKCS#1 v1.5 signature (SignatureVersion 1: SHA-1, 2: SHA-256) over
  its canonical string, checked with the configured certificate's key. The `SigningCertURL` a
  message names is never fetched: whoever sends the message would choose the key.

The crypto is the `cryptography` library's and the standard library's `hmac`; nothing here
implements a primitive.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from notify_queue.errors import ConfigurationError
from notify_queue.models import RECEIPT_STATES, Receipt
from notify_queue.providers.specs import (
    HttpReceipts,
    ProviderSpec,
    SendgridReceipts,
    SesReceipts,
    TwilioReceipts,
)

log = logging.getLogger(__name__)

# Signed timestamps (http, sendgrid) further than this from our clock are refused as replays.
TOLERANCE_SECONDS = 5 * 60
_REASON_CHARS = 1000


class ReceiptRefused(Exception):
    """Not signed by the vendor (unsigned, badly signed or replayed): 401, nothing read."""


class ReceiptInvalid(Exception):
    """Signed, but not a receipt this scheme knows how to read: 400."""


class ReceiptVerifier(Protocol):
    def receipts(self, *, path: str, headers: Mapping[str, str], body: bytes) -> list[Receipt]:
        """The request's receipts once its signature holds; ReceiptRefused / ReceiptInvalid.
        `path` is the request's path and query as received; `headers` are case-insensitive."""
        ...


def verifier_for(spec: ProviderSpec, *, public_url: str | None) -> ReceiptVerifier | None:
    """The verifier of `spec`'s receipts scheme, or None when it takes no receipts."""
    config = spec.receipts
    where = f"--providers-file: providers.{spec.name}.receipts"
    if config is None:
        return None
    if isinstance(config, HttpReceipts):
        try:
            return StandardWebhooksVerifier(Webhook(config.secret_from.read()))
        except Exception as exc:  # the library raises RuntimeError, ValueError or its own
            raise ConfigurationError([f"{where}.secretFrom: not a whsec_ secret ({exc})"]) from None
    if isinstance(config, TwilioReceipts):
        if public_url is None:
            raise ConfigurationError([f"{where}: the twilio scheme needs --public-url"])
        return TwilioVerifier(config.auth_token_from.read().encode(), public_url)
    if isinstance(config, SendgridReceipts):
        key = serialization.load_pem_public_key(_read(config.public_key_file, where))
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise ConfigurationError([f"{where}.publicKeyFile: not an ECDSA public key"])
        return SendgridVerifier(key)
    assert isinstance(config, SesReceipts)
    try:
        certificate = x509.load_pem_x509_certificate(_read(config.certificate_file, where))
    except ValueError as exc:
        raise ConfigurationError([f"{where}.certificateFile: {exc}"]) from None
    public_key = certificate.public_key()
    if not isinstance(public_key, rsa.RSAPublicKey):
        raise ConfigurationError([f"{where}.certificateFile: not an RSA certificate"])
    return SnsVerifier(public_key)


def _read(path: Any, where: str) -> bytes:
    try:
        data: bytes = path.read_bytes()
    except OSError as exc:
        raise ConfigurationError([f"{where}: cannot read {path}: {exc}"]) from None
    return data


def _reason(value: object) -> str | None:
    return None if value in (None, "") else str(value)[:_REASON_CHARS]


def _from_unix(value: object) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    return None


def _from_rfc3339(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _fresh(timestamp: str | None) -> None:
    try:
        seconds = int(timestamp or "")
    except ValueError:
        raise ReceiptRefused("the signed timestamp is missing or not unix seconds") from None
    if abs(time.time() - seconds) > TOLERANCE_SECONDS:
        raise ReceiptRefused("the signed timestamp is more than 5 minutes off: a replay?")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise ReceiptInvalid("the body is not JSON") from None


@dataclass(frozen=True)
class StandardWebhooksVerifier:
    webhook: Webhook

    def receipts(self, *, path: str, headers: Mapping[str, str], body: bytes) -> list[Receipt]:
        try:
            self.webhook.verify(body, dict(headers))
        except WebhookVerificationError as exc:
            raise ReceiptRefused(f"Standard Webhooks signature: {exc}") from None
        event = _json(body)
        if not isinstance(event, dict):
            raise ReceiptInvalid("the body must be a JSON object")
        message_id, state = event.get("providerMessageId"), event.get("event")
        if not isinstance(message_id, str) or not message_id:
            raise ReceiptInvalid("providerMessageId must be a non-empty string")
        if state not in RECEIPT_STATES:
            raise ReceiptInvalid("event must be delivered, bounced or complained")
        permanent = event.get("permanent", False)
        if not isinstance(permanent, bool):
            raise ReceiptInvalid("permanent must be true or false")
        return [Receipt(message_id, state, permanent, _reason(event.get("reason")), None)]


# Twilio error codes that say the number will never take a message: 21211 invalid number,
# 21610 the recipient replied STOP, 21614 not a mobile number, 30005 unknown destination,
# 30006 landline or unreachable carrier.
TWILIO_PERMANENT_ERRORS = frozenset({"21211", "21610", "21614", "30005", "30006"})


@dataclass(frozen=True)
class TwilioVerifier:
    auth_token: bytes
    public_url: str

    def receipts(self, *, path: str, headers: Mapping[str, str], body: bytes) -> list[Receipt]:
        signature = headers.get("x-twilio-signature")
        if not signature:
            raise ReceiptRefused("X-Twilio-Signature is missing")
        try:
            params = urllib.parse.parse_qs(
                body.decode(), keep_blank_values=True, strict_parsing=bool(body)
            )
        except (UnicodeDecodeError, ValueError):
            raise ReceiptRefused("the body is not a signed form") from None
        signed = self.public_url + path
        for name in sorted(params):
            signed += "".join(name + value for value in sorted(params[name]))
        expected = base64.b64encode(
            hmac.new(self.auth_token, signed.encode(), hashlib.sha1).digest()
        ).decode()
        if not hmac.compare_digest(expected, signature):
            raise ReceiptRefused("X-Twilio-Signature does not match")
        form = {name: values[0] for name, values in params.items()}
        message_id, status = form.get("MessageSid"), form.get("MessageStatus")
        if not message_id:
            raise ReceiptInvalid("MessageSid is missing")
        if status == "delivered":
            return [Receipt(message_id, "delivered", False, None, None)]
        if status in ("undelivered", "failed"):
            code = form.get("ErrorCode") or None
            return [
                Receipt(
                    message_id,
                    "bounced",
                    code in TWILIO_PERMANENT_ERRORS,
                    _reason(f"{status} (error {code})" if code else status),
                    None,
                )
            ]
        return []  # queued, sending, sent, read...: nothing said about the outcome yet


@dataclass(frozen=True)
class SendgridVerifier:
    public_key: ec.EllipticCurvePublicKey

    def receipts(self, *, path: str, headers: Mapping[str, str], body: bytes) -> list[Receipt]:
        signature = headers.get("x-twilio-email-event-webhook-signature")
        timestamp = headers.get("x-twilio-email-event-webhook-timestamp")
        if not signature or not timestamp:
            raise ReceiptRefused("the Event Webhook signature or timestamp header is missing")
        try:
            self.public_key.verify(
                base64.b64decode(signature, validate=True),
                timestamp.encode() + body,
                ec.ECDSA(hashes.SHA256()),
            )
        except (InvalidSignature, binascii.Error):
            raise ReceiptRefused("the Event Webhook signature does not match") from None
        _fresh(timestamp)
        events = _json(body)
        if not isinstance(events, list):
            raise ReceiptInvalid("the body must be a JSON array of events")
        return [r for e in events if isinstance(e, dict) for r in self._receipt(e)]

    @staticmethod
    def _receipt(event: dict[str, Any]) -> list[Receipt]:
        sg_message_id = event.get("sg_message_id")
        if not isinstance(sg_message_id, str) or not sg_message_id:
            return []
        # sg_message_id is the X-Message-Id the send answered, then ".filter…" and more.
        message_id = sg_message_id.split(".", 1)[0]
        at, reason = _from_unix(event.get("timestamp")), _reason(event.get("reason"))
        kind = event.get("event")
        if kind == "delivered":
            return [Receipt(message_id, "delivered", False, None, at)]
        if kind == "bounce":
            # type "blocked" is a temporary refusal; "bounce" (or none) the address is bad.
            permanent = event.get("type", "bounce") == "bounce"
            return [Receipt(message_id, "bounced", permanent, reason, at)]
        if kind == "dropped":
            # SendGrid did not send it (its own suppression or a bad message): not delivered,
            # but not a bounce from the recipient's server either.
            return [Receipt(message_id, "bounced", False, reason or "dropped", at)]
        if kind == "spamreport":
            return [Receipt(message_id, "complained", True, "spam report", at)]
        return []  # processed, deferred, open, click, unsubscribe...


# The fields of each SNS message type that its signature covers, in the documented order.
_SNS_SIGNED_FIELDS = {
    "Notification": ("Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"),
    "SubscriptionConfirmation": (
        "Message",
        "MessageId",
        "SubscribeURL",
        "Timestamp",
        "Token",
        "TopicArn",
        "Type",
    ),
}
_SNS_SIGNED_FIELDS["UnsubscribeConfirmation"] = _SNS_SIGNED_FIELDS["SubscriptionConfirmation"]
_SNS_HASHES: dict[str, type[hashes.HashAlgorithm]] = {"1": hashes.SHA1, "2": hashes.SHA256}


def sns_canonical_string(message: Mapping[str, Any]) -> bytes:
    """The bytes an SNS message's signature covers: each signed field present, as
    `name\\nvalue\\n` (Subject only when the message has one)."""
    fields = _SNS_SIGNED_FIELDS[message["Type"]]
    return "".join(
        f"{name}\n{message[name]}\n" for name in fields if message.get(name) is not None
    ).encode()


@dataclass(frozen=True)
class SnsVerifier:
    public_key: rsa.RSAPublicKey

    def receipts(self, *, path: str, headers: Mapping[str, str], body: bytes) -> list[Receipt]:
        message = _json(body)
        if not isinstance(message, dict) or message.get("Type") not in _SNS_SIGNED_FIELDS:
            raise ReceiptRefused("not an SNS message")
        algorithm = _SNS_HASHES.get(str(message.get("SignatureVersion")))
        if algorithm is None:
            raise ReceiptRefused("SignatureVersion must be 1 or 2")
        try:
            self.public_key.verify(
                base64.b64decode(str(message.get("Signature", "")), validate=True),
                sns_canonical_string(message),
                padding.PKCS1v15(),
                algorithm(),
            )
        except (InvalidSignature, binascii.Error, KeyError, TypeError):
            raise ReceiptRefused("the SNS signature does not match") from None
        if message["Type"] != "Notification":
            # Confirming would mean fetching a URL the sender chose; an operator does it once.
            log.warning(
                "SNS %s for %s: confirm it by opening its SubscribeURL: %s",
                message["Type"],
                message.get("TopicArn"),
                message.get("SubscribeURL"),
            )
            return []
        event = _json(str(message.get("Message", "")).encode())
        if not isinstance(event, dict):
            raise ReceiptInvalid("the SNS Message is not an SES event")
        return self._receipt(event)

    @staticmethod
    def _receipt(event: dict[str, Any]) -> list[Receipt]:
        # Event publishing says eventType; the older identity notifications, notificationType.
        kind = event.get("eventType") or event.get("notificationType")
        mail = event.get("mail")
        message_id = mail.get("messageId") if isinstance(mail, dict) else None
        if not isinstance(message_id, str) or not message_id:
            raise ReceiptInvalid("the SES event has no mail.messageId")
        if kind == "Delivery":
            detail = event.get("delivery") or {}
            return [
                Receipt(
                    message_id, "delivered", False, None, _from_rfc3339(detail.get("timestamp"))
                )
            ]
        if kind == "Bounce":
            bounce = event.get("bounce") or {}
            recipients = bounce.get("bouncedRecipients") or [{}]
            first = recipients[0] if isinstance(recipients[0], dict) else {}
            reason = first.get("diagnosticCode") or bounce.get("bounceSubType")
            return [
                Receipt(
                    message_id,
                    "bounced",
                    bounce.get("bounceType") == "Permanent",
                    _reason(reason),
                    _from_rfc3339(bounce.get("timestamp")),
                )
            ]
        if kind == "Complaint":
            complaint = event.get("complaint") or {}
            reason = complaint.get("complaintFeedbackType") or "complaint"
            return [
                Receipt(
                    message_id,
                    "complained",
                    True,
                    _reason(reason),
                    _from_rfc3339(complaint.get("timestamp")),
                )
            ]
        return []  # Send, Reject, Open, Click, DeliveryDelay...
