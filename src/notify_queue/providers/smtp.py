"""The SMTP provider: email notifications handed to a mail server with `aiosmtplib`.

SMTP has no idempotency key, so the notification id goes where mail systems look for one:
`Message-ID: <id@sender-domain>` (receivers and archives drop duplicates by it) and an explicit
`X-Idempotency-Key` header. The Message-ID is also the provider message id we record.

Classification follows SMTP's own split: 4xx replies are "try again later", 5xx are final. A 5xx
is only final for the notification when it is about that message (recipient refused, content
rejected). Replies about the session (authentication, HELO, the sender, the greeting) describe
our configuration or the server, not the notification, so they stay temporary: the notification
is retried and, once dead-lettered, can be retried again after the configuration is fixed.
Connection errors and timeouts are temporary too. One connection per message keeps failures
isolated; a mail relay, not this process, is the place to batch.

No header is injected through a value we set (docs/security.md): each value is refused when it
holds a control character, plainly or in an RFC 2047 encoded word (`notify_queue.headers`), and
the message is then written out the way aiosmtplib will send it and read back: a header block
with any header we did not set is refused. Pythons with CVE-2024-6923 fixed also refuse such a
header themselves while writing it (`verify_generated_headers`, on by default there). Either is a
permanent failure: the same text will never send.
"""

from __future__ import annotations

import asyncio
import email.errors
import email.policy
from email.message import EmailMessage
from email.parser import BytesHeaderParser
from email.utils import parseaddr

import aiosmtplib
from aiosmtplib.email import flatten_message

from notify_queue.headers import header_value_problem
from notify_queue.models import Channel, DeliveryResult, Outcome
from notify_queue.providers.base import DeliveryRequest


class SmtpProvider:
    def __init__(
        self,
        *,
        host: str,
        port: int,
        username: str | None,
        password: str | None,
        starttls: bool,
        from_address: str,
        timeout_seconds: float,
    ) -> None:
        self._host = host
        self._port = port
        self._username = username
        self._password = password
        # False means "never", not aiosmtplib's default "if offered": the operator chose plain
        # SMTP, and an unrequested upgrade could fail on a certificate they never configured.
        self._starttls = starttls
        self._from_address = from_address
        self._timeout_seconds = timeout_seconds
        domain = parseaddr(from_address)[1].rpartition("@")[2]
        self._message_id_domain = domain or "notify-queue.invalid"

    def message_id(self, request: DeliveryRequest) -> str:
        """The Message-ID of `request`'s email: the same on every attempt."""
        return f"<{request.id}@{self._message_id_domain}>"

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        if request.channel is not Channel.EMAIL:
            return DeliveryResult(
                Outcome.PERMANENT_FAILURE, error="smtp provider only delivers email"
            )
        try:
            message = self._build_message(request)
        except (ValueError, TypeError, email.errors.MessageError) as exc:
            # A header with a line break (HeaderWriteError is a MessageError) or an unparsable
            # address will never send.
            return DeliveryResult(Outcome.PERMANENT_FAILURE, error=f"invalid email: {exc}")
        try:
            # aiosmtplib's timeout is per command; this bounds the attempt as a whole.
            async with asyncio.timeout(self._timeout_seconds):
                await aiosmtplib.send(
                    message,
                    recipients=[request.recipient],
                    hostname=self._host,
                    port=self._port,
                    username=self._username,
                    password=self._password,
                    start_tls=self._starttls,
                    timeout=self._timeout_seconds,
                )
        except (TimeoutError, aiosmtplib.SMTPTimeoutError):
            return DeliveryResult(
                Outcome.TEMPORARY_FAILURE, error=f"timed out after {self._timeout_seconds:g}s"
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            return _classify_per_message(exc.recipients[0] if exc.recipients else None, exc)
        except (aiosmtplib.SMTPRecipientRefused, aiosmtplib.SMTPDataError) as exc:
            return _classify_per_message(exc, exc)
        except aiosmtplib.SMTPResponseException as exc:
            # A refusal before DATA was accepted: the server did not take the message.
            return DeliveryResult(
                Outcome.TEMPORARY_FAILURE,
                error=f"SMTP {exc.code}: {exc.message}",
                nothing_sent=True,
            )
        except (aiosmtplib.SMTPConnectError, ConnectionRefusedError) as exc:
            return DeliveryResult(
                Outcome.TEMPORARY_FAILURE, error=f"SMTP connection error: {exc}", nothing_sent=True
            )
        except (aiosmtplib.SMTPException, OSError) as exc:
            return DeliveryResult(Outcome.TEMPORARY_FAILURE, error=f"SMTP connection error: {exc}")
        return DeliveryResult(Outcome.SENT, provider_message_id=self.message_id(request))

    def _build_message(self, request: DeliveryRequest) -> EmailMessage:
        headers = {
            "From": self._from_address,
            "To": request.recipient,
            "Subject": request.subject,
            "Message-ID": self.message_id(request),
            "X-Idempotency-Key": request.idempotency_key,
            **request.headers,
        }
        message = EmailMessage()
        for name, value in headers.items():
            if value is None:
                continue
            problem = header_value_problem(value)
            if problem is not None:
                raise ValueError(f"{name} {problem}")
            message[name] = value
        message.set_content(request.body)
        _check_header_block(message, utf8=not (self._from_address + request.recipient).isascii())
        return message

    async def close(self) -> None:
        """Each message uses its own connection; nothing stays open between deliveries."""


def _check_header_block(message: EmailMessage, *, utf8: bool) -> None:
    """Raise ValueError unless `message`, written out as aiosmtplib writes it (SMTPUTF8 when an
    address needs it), reads back with exactly the headers that were set: one more means a value
    broke its line."""
    header_block = flatten_message(message, utf8=utf8).split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
    written = BytesHeaderParser(policy=email.policy.compat32).parsebytes(header_block).keys()
    if [n.lower() for n in written] != [n.lower() for n in message.keys()]:
        extra = sorted(set(written) - set(message.keys()))
        raise ValueError(
            f"the written headers differ from those set: {', '.join(extra) or 'order'}"
        )


def _classify_per_message(
    refusal: aiosmtplib.SMTPResponseException | None, exc: Exception
) -> DeliveryResult:
    if refusal is None:
        return DeliveryResult(Outcome.TEMPORARY_FAILURE, error=f"SMTP refused: {exc}")
    error = f"SMTP {refusal.code}: {refusal.message}"
    if refusal.code >= 500:
        return DeliveryResult(Outcome.PERMANENT_FAILURE, error=error)
    # The server refused the message for now: it was not accepted, so nothing was sent.
    return DeliveryResult(Outcome.TEMPORARY_FAILURE, error=error, nothing_sent=True)
