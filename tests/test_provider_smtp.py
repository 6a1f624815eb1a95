"""The SMTP provider against a real SMTP server (aiosmtpd) on loopback.

Covers the message as received (headers that make retries recognisable as one message), and how
the server's answers map to outcomes: accepted → SENT, 5xx for the recipient → permanent,
4xx → temporary, no server → temporary; and that no header is injected through a value we set,
plainly or in an RFC 2047 encoded word (refused, permanently), on this machine's Python whether
or not it has CVE-2024-6923 fixed.
"""

from __future__ import annotations

import email
import email.policy
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from notify_queue.models import Channel, Outcome
from notify_queue.providers import smtp
from notify_queue.providers.base import DeliveryRequest
from notify_queue.providers.smtp import SmtpProvider


class Mailbox:
    """An aiosmtpd handler: keeps accepted mail, or refuses recipients with a set reply."""

    def __init__(self) -> None:
        self.envelopes: list[Envelope] = []
        self.refuse_recipients_with: str | None = None

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        if self.refuse_recipients_with is not None:
            return self.refuse_recipients_with
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        self.envelopes.append(envelope)
        return "250 Message accepted for delivery"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    handler = Mailbox()
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield handler, port
    finally:
        controller.stop()


def make_provider(port: int, timeout_seconds: float = 5.0) -> SmtpProvider:
    return SmtpProvider(
        host="127.0.0.1",
        port=port,
        username=None,
        password=None,
        starttls=False,
        from_address="Notify Queue <notify@example.org>",
        timeout_seconds=timeout_seconds,
    )


def make_request(**overrides: Any) -> DeliveryRequest:
    fields: dict[str, Any] = {
        "id": uuid.uuid4(),
        "channel": Channel.EMAIL,
        "recipient": "alice@example.com",
        "subject": "Your receipt",
        "body": "Thank you for order 1001.",
    }
    fields.update(overrides)
    return DeliveryRequest(**fields)


async def test_one_click_unsubscribe_headers_travel_in_the_message(
    mailbox: tuple[Mailbox, int],
) -> None:
    handler, port = mailbox
    link = "<https://notify.example.com/unsubscribe/abc.def>"
    request = make_request(
        headers={"List-Unsubscribe": link, "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}
    )

    assert (await make_provider(port).deliver(request)).outcome is Outcome.SENT

    [envelope] = handler.envelopes
    assert isinstance(envelope.content, bytes)
    message = email.message_from_bytes(envelope.content, policy=email.policy.default)
    assert message["List-Unsubscribe"] == link
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"


async def test_the_server_receives_the_message_with_its_identifying_headers(
    mailbox: tuple[Mailbox, int],
) -> None:
    handler, port = mailbox
    request = make_request()

    result = await make_provider(port).deliver(request)

    assert result.outcome is Outcome.SENT
    assert result.provider_message_id == f"<{request.id}@example.org>"
    [envelope] = handler.envelopes
    assert envelope.mail_from == "notify@example.org"
    assert envelope.rcpt_tos == ["alice@example.com"]
    assert isinstance(envelope.content, bytes)
    message = email.message_from_bytes(envelope.content, policy=email.policy.default)
    assert message["Subject"] == "Your receipt"
    assert message["From"] == "Notify Queue <notify@example.org>"
    assert message["To"] == "alice@example.com"
    assert message["Message-ID"] == f"<{request.id}@example.org>"
    assert message["X-Idempotency-Key"] == str(request.id)
    body = message.get_body()
    assert body is not None
    assert body.get_content().strip() == "Thank you for order 1001."


async def test_every_attempt_carries_the_same_message_id(mailbox: tuple[Mailbox, int]) -> None:
    handler, port = mailbox
    provider = make_provider(port)
    request = make_request()

    await provider.deliver(request)
    await provider.deliver(request)

    ids = {
        email.message_from_bytes(e.content, policy=email.policy.default)["Message-ID"]
        for e in handler.envelopes
        if isinstance(e.content, bytes)
    }
    assert ids == {f"<{request.id}@example.org>"}


async def test_a_recipient_refused_with_550_is_a_permanent_failure(
    mailbox: tuple[Mailbox, int],
) -> None:
    handler, port = mailbox
    handler.refuse_recipients_with = "550 5.1.1 No such mailbox"

    result = await make_provider(port).deliver(make_request())

    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error == "SMTP 550: 5.1.1 No such mailbox"
    assert handler.envelopes == []


async def test_a_recipient_deferred_with_451_is_a_temporary_failure(
    mailbox: tuple[Mailbox, int],
) -> None:
    handler, port = mailbox
    handler.refuse_recipients_with = "451 4.7.1 Greylisted, try again later"

    result = await make_provider(port).deliver(make_request())

    assert result.outcome is Outcome.TEMPORARY_FAILURE
    assert result.error == "SMTP 451: 4.7.1 Greylisted, try again later"


async def test_a_server_that_is_down_is_a_temporary_failure() -> None:
    result = await make_provider(free_port()).deliver(make_request())
    assert result.outcome is Outcome.TEMPORARY_FAILURE
    assert result.error is not None and result.error.startswith("SMTP connection error")


@pytest.mark.parametrize("channel", [Channel.SMS, Channel.PUSH])
async def test_channels_other_than_email_are_refused_permanently(channel: Channel) -> None:
    result = await make_provider(free_port()).deliver(make_request(channel=channel))
    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error == "smtp provider only delivers email"


async def test_a_subject_with_a_line_break_cannot_inject_headers(
    mailbox: tuple[Mailbox, int],
) -> None:
    handler, port = mailbox
    request = make_request(subject="Hi\r\nBcc: victim@example.com")

    result = await make_provider(port).deliver(request)

    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error is not None and result.error.startswith("invalid email")
    assert handler.envelopes == []


@pytest.mark.parametrize(
    "subject",
    [
        "=?utf-8?q?Hi=0D=0AReply-To:_evil@example.net?=",
        "=?utf-8?b?SGkNClJlcGx5LVRvOiBldmlsQGV4YW1wbGUubmV0?=",  # the same, base64
        "Your receipt =?utf-8?q?=0AReply-To:_evil@example.net?=",
        "=?utf-8?q?Hi=E2=80=A8Reply-To:_evil@example.net?=",  # U+2028
    ],
    ids=["q-crlf", "b-crlf", "q-lf-after-text", "q-line-separator"],
)
async def test_an_encoded_line_break_in_the_subject_adds_no_header(
    mailbox: tuple[Mailbox, int], subject: str
) -> None:
    """The email package decodes an RFC 2047 word when the header is set and, on a Python with
    CVE-2024-6923, writes its CR LF back out: a header of the client's own. It is refused."""
    handler, port = mailbox

    result = await make_provider(port).deliver(make_request(subject=subject))

    received = [
        email.message_from_bytes(e.content, policy=email.policy.default)
        for e in handler.envelopes
        if isinstance(e.content, bytes)
    ]
    assert [m["Reply-To"] for m in received if "Reply-To" in m] == []
    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error is not None and result.error.startswith("invalid email: Subject must not")
    assert handler.envelopes == []


async def test_a_written_header_block_with_a_header_not_set_is_refused_on_its_own(
    mailbox: tuple[Mailbox, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second check, with the first one switched off: the message is written out as it would
    be sent and read back, and a header nobody set stops it (on a Python with the CVE fixed, the
    email package refuses it first, while writing)."""
    handler, port = mailbox
    monkeypatch.setattr(smtp, "header_value_problem", lambda value: None)

    result = await make_provider(port).deliver(
        make_request(subject="=?utf-8?q?Hi=0D=0AReply-To:_evil@example.net?=")
    )

    assert result.outcome is Outcome.PERMANENT_FAILURE
    assert result.error is not None and result.error.startswith("invalid email")
    assert handler.envelopes == []


@pytest.mark.parametrize(
    "subject",
    [
        "Grüße =?iso-8859-1?q?Gr=FC=DFe?= =?utf-8?b?w6k=?=",
        "a\ttab",
        "long " * 250,  # folded over several lines when written
        "=?utf-8?q?not_closed",
    ],
    ids=["encoded-words", "tab", "folded", "unclosed-word"],
)
async def test_subjects_without_line_breaks_are_sent_as_they_are(
    mailbox: tuple[Mailbox, int], subject: str
) -> None:
    handler, port = mailbox

    result = await make_provider(port).deliver(make_request(subject=subject))

    assert result.outcome is Outcome.SENT, result.error
    [envelope] = handler.envelopes
    assert isinstance(envelope.content, bytes)
    message = email.message_from_bytes(envelope.content, policy=email.policy.default)
    assert "Reply-To" not in message
