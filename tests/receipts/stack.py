"""Real processes for the receipts tests: a `notify-queue api` and a `notify-queue worker` that
share a providers file, an HTTP provider that answers message ids and counts its calls, and a
webhook receiver; plus the vendors' side: keys and certificates made here with `cryptography`,
and requests signed the way each vendor signs them."""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import hashlib
import hmac
import json
import subprocess
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.x509.oid import NameOID

from tests.receivers import WebhookReceiver
from tests.support import eventually, running_api

PUBLIC_URL = "https://notify.example.com"
WHSEC = "whsec_" + base64.b64encode(b"receipts-secret-32-bytes-long!!!").decode()
TWILIO_TOKEN = "twilio-auth-token"


@dataclass
class CountingProvider:
    """An HTTP provider that answers `messageId: pm-<notification id>` and counts its calls."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> CountingProvider:
        app = web.Application()
        app.router.add_post("/send", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/send"
        return self

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append({"httpHeaders": dict(request.headers), **body})
        return web.json_response({"messageId": f"pm-{body['id']}"})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class Vendor:
    """The keys a vendor signs with, and the files the providers file points at."""

    sendgrid_key: ec.EllipticCurvePrivateKey
    sns_key: rsa.RSAPrivateKey
    sendgrid_public_file: Path
    sns_certificate_file: Path

    @classmethod
    def make(cls, where: Path) -> Vendor:
        sendgrid_key = ec.generate_private_key(ec.SECP256R1())
        sns_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = where / "sendgrid.pem"
        public.write_bytes(
            sendgrid_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sns.us-east-1.amazonaws.com")])
        now = dt.datetime.now(dt.UTC)
        certificate = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(sns_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .sign(sns_key, hashes.SHA256())
        )
        cert_file = where / "sns.pem"
        cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        return cls(sendgrid_key, sns_key, public, cert_file)


def providers_file(where: Path, provider_url: str, vendor: Vendor, email: str) -> Path:
    """email by `email` (sg: SendGrid, or ses: SES), sms by Twilio, push by a Standard Webhooks
    vendor, all through the one counting HTTP provider."""
    (where / "whsec").write_text(WHSEC)
    (where / "twilio").write_text(TWILIO_TOKEN)
    document = {
        "providers": [
            {
                "name": "sg",
                "type": "http",
                "channels": ["email"],
                "url": provider_url,
                "receipts": {
                    "scheme": "sendgrid",
                    "publicKeyFile": str(vendor.sendgrid_public_file),
                },
            },
            {
                "name": "ses",
                "type": "http",
                "channels": ["email"],
                "url": provider_url,
                "receipts": {"scheme": "ses", "certificateFile": str(vendor.sns_certificate_file)},
            },
            {
                "name": "tw",
                "type": "http",
                "channels": ["sms"],
                "url": provider_url,
                "receipts": {"scheme": "twilio", "authTokenFrom": {"file": str(where / "twilio")}},
            },
            {
                "name": "hooks",
                "type": "http",
                "channels": ["push"],
                "url": provider_url,
                "receipts": {"scheme": "http", "secretFrom": {"file": str(where / "whsec")}},
            },
        ],
        "chains": {"email": [email], "sms": ["tw"], "push": ["hooks"]},
    }
    path = where / "providers.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@dataclass
class Stack:
    api: httpx.AsyncClient
    provider: CountingProvider
    hooks: WebhookReceiver
    vendor: Vendor

    async def sent(self, **body: Any) -> dict[str, Any]:
        """Create a notification and wait until the worker has sent it; its final JSON."""
        created = await self.api.post(
            "/notifications", json=body, headers={"Idempotency-Key": f"k-{time.monotonic_ns()}"}
        )
        assert created.status_code == 201, created.text
        return await self.final(created.json()["id"])

    async def final(self, id_: str) -> dict[str, Any]:
        async def done() -> dict[str, Any] | None:
            found = (await self.api.get(f"/notifications/{id_}")).json()
            return found if found["status"] not in ("PENDING", "PROCESSING") else None

        found: dict[str, Any] = await eventually(done, timeout=60)
        return found

    async def delivery_events(self, id_: str) -> list[dict[str, Any]]:
        return [
            r.json
            for r in self.hooks.received
            if r.json.get("type") == "delivery" and r.json["jobId"] == id_
        ]


@contextlib.asynccontextmanager
async def stack(
    database_url: str,
    where: Path,
    *api_args: str,
    email: str = "sg",
    shared_args: tuple[str, ...] = (),
) -> AsyncIterator[Stack]:
    vendor = Vendor.make(where)
    provider = await CountingProvider().start()
    hooks = await WebhookReceiver().start()
    providers = providers_file(where, provider.url, vendor, email)
    shared = ["--providers-file", str(providers), "--public-url", PUBLIC_URL]
    shared += ["--webhook-url", hooks.url, *shared_args]
    log = (where / "worker.log").open("wb")
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "notify_queue", "worker", "--database-url", database_url),
            *("--poll-interval", "0.2", "--log-level", "WARNING", "--channels", "email,sms,push"),
            *shared,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        async with (
            running_api(database_url, where / "api.log", *shared, *api_args) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as api,
        ):
            yield Stack(api, provider, hooks, vendor)
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
        await provider.stop()
        await hooks.stop()


# --- the vendors' signatures, as their documentation gives them --------------------------------


def standard_webhooks(body: bytes, *, at: int | None = None, secret: str = WHSEC) -> dict[str, str]:
    msg_id, timestamp = (
        f"msg_{time.monotonic_ns()}",
        str(at if at is not None else int(time.time())),
    )
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": f"v1,{signature}",
        "content-type": "application/json",
    }


def twilio(path: str, form: dict[str, str], *, token: str = TWILIO_TOKEN) -> dict[str, str]:
    signed = PUBLIC_URL + path + "".join(k + form[k] for k in sorted(form))
    digest = hmac.new(token.encode(), signed.encode(), hashlib.sha1).digest()
    return {
        "X-Twilio-Signature": base64.b64encode(digest).decode(),
        "content-type": "application/x-www-form-urlencoded",
    }


def form_body(form: dict[str, str]) -> bytes:
    return urllib.parse.urlencode(form).encode()


def sendgrid(
    key: ec.EllipticCurvePrivateKey, body: bytes, *, at: int | None = None
) -> dict[str, str]:
    timestamp = str(at if at is not None else int(time.time()))
    signature = key.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
    return {
        "X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
        "X-Twilio-Email-Event-Webhook-Timestamp": timestamp,
        "content-type": "application/json",
    }


_SNS_SIGNED = {
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


def sns_message(
    key: rsa.RSAPrivateKey, ses_event: dict[str, Any], *, version: str
) -> dict[str, Any]:
    """An SNS Notification carrying an SES event, signed."""
    message = {
        "Type": "Notification",
        "MessageId": f"sns-{time.monotonic_ns()}",
        "TopicArn": "arn:aws:sns:us-east-1:123456789012:ses-events",
        "Subject": "Amazon SES Email Event Notification",
        "Message": json.dumps(ses_event),
        "Timestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "SignatureVersion": version,
        "SigningCertURL": "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem",
    }
    return sns_sign(key, message)


def sns_sign(key: rsa.RSAPrivateKey, message: dict[str, Any]) -> dict[str, Any]:
    """`message` with its Signature: SHA1withRSA (version 1) or SHA256withRSA (2) over
    `name\nvalue\n` of each signed field present, in the documented order."""
    canonical = "".join(
        f"{name}\n{message[name]}\n" for name in _SNS_SIGNED[message["Type"]] if name in message
    )
    # SignatureVersion 1 is SHA1withRSA: SNS's own choice, verified as such.
    algorithm = hashes.SHA1() if message["SignatureVersion"] == "1" else hashes.SHA256()  # noqa: S303
    signature = key.sign(canonical.encode(), padding.PKCS1v15(), algorithm)
    return {**message, "Signature": base64.b64encode(signature).decode()}
