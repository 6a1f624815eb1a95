"""Recipients and templates: validation and CRUD (docs/recipients.md).

A recipient is stored whole by PUT (idempotent: the same body again changes nothing visible but
`updatedAt`) and its preferences are merged by PATCH under a row lock. Validation follows the
notification rules: unknown fields are named, emails and phone numbers are normalised as a
notification's recipient is (services/addresses.py), a timezone must be one `zoneinfo` knows,
quiet hours are `HH:MM` (24 h).
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, time
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from notify_queue.errors import FieldError, NotFound, ValidationFailed
from notify_queue.limits import (
    CATEGORY_PATTERN,
    DESTINATION_MESSAGE,
    DESTINATION_PATTERN,
    MAX_RECIPIENT_CHARS,
    RECIPIENT_ID_PATTERN,
    TEMPLATE_NAME_PATTERN,
)
from notify_queue.models import Channel, Preferences, Recipient, Source, Template
from notify_queue.repositories.recipients import RecipientRepository
from notify_queue.services.addresses import normalise_email, normalise_phone
from notify_queue.services.templates import check_template_channels

HHMM_PATTERN = re.compile(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
MAX_PUSH_TOKENS = 20


class OptOutBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Not nullable: an absent field is kept by a PATCH (model_fields_set tells), null is a 400.
    channels: list[Channel] = Field(default_factory=list)
    categories: Annotated[list[StrictStr], Field(max_length=100)] = Field(default_factory=list)
    all: StrictBool = False

    @field_validator("categories")
    @classmethod
    def _categories(cls, value: list[str]) -> list[str]:
        for c in value:
            if not CATEGORY_PATTERN.fullmatch(c):
                raise ValueError(f"{c!r} is not a category (lowercase letters, digits, -_.)")
        return value


class QuietHoursBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    start: StrictStr
    end: StrictStr

    @field_validator("start", "end")
    @classmethod
    def _hhmm(cls, value: str) -> str:
        if not HHMM_PATTERN.fullmatch(value):
            raise ValueError("must be HH:MM, 00:00-23:59")
        return value


class PreferencesBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)

    opt_out: OptOutBody | None = Field(None, alias="optOut")
    quiet_hours: QuietHoursBody | None = Field(None, alias="quietHours")


class RecipientBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)

    email: Annotated[StrictStr | None, Field(max_length=MAX_RECIPIENT_CHARS)] = None
    phone: StrictStr | None = None
    # The number a voice call goes to (docs/escalation.md); absent: `phone`.
    voice: StrictStr | None = None
    # Destination names (docs/channels.md).
    chat: StrictStr | None = None
    webhook: StrictStr | None = None
    incident: StrictStr | None = None
    push_tokens: Annotated[
        list[Annotated[StrictStr, Field(min_length=1, max_length=MAX_RECIPIENT_CHARS)]],
        Field(max_length=MAX_PUSH_TOKENS),
    ] = Field(default_factory=list, alias="pushTokens")
    timezone: StrictStr = "UTC"
    preferences: PreferencesBody | None = None

    # Stored in their one form, as a notification's recipient is (services/addresses.py).
    @field_validator("email")
    @classmethod
    def _email(cls, value: str | None) -> str | None:
        return None if value is None else normalise_email(value)

    @field_validator("phone", "voice")
    @classmethod
    def _phone(cls, value: str | None, info: ValidationInfo) -> str | None:
        region = (info.context or {}).get("default_region")
        return None if value is None else normalise_phone(value, region)

    @field_validator("chat", "webhook", "incident")
    @classmethod
    def _destination(cls, value: str | None) -> str | None:
        if value is not None and not DESTINATION_PATTERN.fullmatch(value):
            raise ValueError(DESTINATION_MESSAGE)
        return value

    @field_validator("push_tokens")
    @classmethod
    def _tokens(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("must not list a token twice")
        if any(not t.strip() for t in value):
            raise ValueError("must not contain blank tokens")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError("must be an IANA time zone such as Europe/Berlin") from None
        return value


class TemplateBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    channels: dict[str, Any]


def _errors(exc: ValidationError, prefix: str = "") -> ValidationFailed:
    return ValidationFailed(
        [
            FieldError(
                prefix + (".".join(str(p) for p in e["loc"]) or "$"),
                e["msg"].removeprefix("Value error, "),
            )
            for e in exc.errors()
        ]
    )


def check_recipient_id(value: str) -> str:
    if not RECIPIENT_ID_PATTERN.fullmatch(value):
        raise ValidationFailed(
            [FieldError("id", "must be 1-255 printable ASCII characters without spaces")]
        )
    return value


def check_template_name(value: str) -> str:
    if not TEMPLATE_NAME_PATTERN.fullmatch(value):
        raise ValidationFailed(
            [FieldError("name", "must be lowercase letters, digits, '-' and '.' (max 253)")]
        )
    return value


def _hhmm(value: str) -> time:
    hours, minutes = value.split(":")
    return time(int(hours), int(minutes))


def _merge_preferences(current: Preferences, body: PreferencesBody, *, whole: bool) -> Preferences:
    """Apply `body` to `current`. `whole` (PUT): absent parts are cleared; else (PATCH) kept.
    A `quietHours` of null clears the window in both."""
    fields = body.model_fields_set
    opt = body.opt_out
    prefs = current if not whole else Preferences(exists=True, timezone=current.timezone)
    if opt is not None:
        opt_fields = opt.model_fields_set
        if "channels" in opt_fields:
            prefs = replace(prefs, opt_out_channels=frozenset(c.value for c in opt.channels or []))
        if "categories" in opt_fields:
            prefs = replace(prefs, opt_out_categories=frozenset(opt.categories or []))
        if "all" in opt_fields:
            prefs = replace(prefs, opt_out_all=bool(opt.all))
    if "quiet_hours" in fields:
        q = body.quiet_hours
        if q is None:
            prefs = replace(prefs, quiet_start=None, quiet_end=None)
        else:
            prefs = replace(prefs, quiet_start=_hhmm(q.start), quiet_end=_hhmm(q.end))
    return prefs


def parse_preferences(data: Any, *, prefix: str = "") -> PreferencesBody:
    if not isinstance(data, dict):
        raise ValidationFailed([FieldError(prefix.rstrip(".") or "$", "must be a JSON object")])
    try:
        body = PreferencesBody.model_validate(data)
    except ValidationError as exc:
        raise _errors(exc, prefix) from None
    q = body.quiet_hours
    if q is not None and q.start == q.end:
        raise ValidationFailed(
            [FieldError(prefix + "quietHours", "start and end must differ (null: no quiet hours)")]
        )
    return body


def parse_recipient(id: str, data: Any, *, default_region: str | None = None) -> Recipient:
    """A PUT body as the recipient it describes (timestamps are set by the database), its
    addresses normalised (`default_region`: of phone numbers written without `+`)."""
    check_recipient_id(id)
    if not isinstance(data, dict):
        raise ValidationFailed([FieldError("$", "must be a JSON object")])
    try:
        body = RecipientBody.model_validate(data, context={"default_region": default_region})
    except ValidationError as exc:
        raise _errors(exc) from None
    prefs = Preferences(exists=True, timezone=body.timezone)
    if body.preferences is not None:
        # Validated once more as raw data, for the start == end rule and exact field names.
        parse_preferences(data.get("preferences"), prefix="preferences.")
        prefs = _merge_preferences(prefs, body.preferences, whole=True)
    now = datetime.now(UTC)
    return Recipient(
        id=id,
        email=body.email,
        phone=body.phone,
        voice=body.voice,
        chat=body.chat,
        webhook=body.webhook,
        incident=body.incident,
        push_tokens=list(body.push_tokens),
        preferences=prefs,
        created_at=now,
        updated_at=now,
    )


class RecipientService:
    def __init__(
        self, repository: RecipientRepository, *, default_region: str | None = None
    ) -> None:
        self._repository = repository
        self._default_region = default_region

    async def put(self, id: str, data: Any) -> tuple[Recipient, bool]:
        recipient = parse_recipient(id, data, default_region=self._default_region)
        return await self._repository.recipient_put(recipient=recipient)

    async def get(self, id: str) -> Recipient:
        check_recipient_id(id)
        found = await self._repository.recipient_get(id=id)
        if found is None:
            raise NotFound(f"recipient {id} does not exist")
        return found

    async def delete(self, id: str) -> None:
        check_recipient_id(id)
        if not await self._repository.recipient_delete(id=id):
            raise NotFound(f"recipient {id} does not exist")

    async def merge_preferences(self, id: str, data: Any) -> Recipient:
        check_recipient_id(id)
        body = parse_preferences(data)
        merged = await self._repository.recipient_merge(
            id=id,
            merge=lambda r: replace(
                r, preferences=_merge_preferences(r.preferences, body, whole=False)
            ),
        )
        if merged is None:
            raise NotFound(f"recipient {id} does not exist")
        return merged

    async def opt_out_category(self, id: str, category: str) -> Recipient:
        """Add `category` to the recipient's opted-out categories (an unsubscribe link's click:
        docs/receipts.md); NotFound when the recipient is gone."""

        def merge(r: Recipient) -> Recipient:
            categories = r.preferences.opt_out_categories
            if category in categories:
                return r
            return replace(
                r,
                preferences=replace(
                    r.preferences, opt_out_categories=frozenset({*categories, category})
                ),
            )

        merged = await self._repository.recipient_merge(id=id, merge=merge)
        if merged is None:
            raise NotFound(f"recipient {id} does not exist")
        return merged

    # -- templates ---------------------------------------------------------------------------

    async def template_put(
        self, name: str, data: Any, *, source: Source = Source.API, prefix: str = ""
    ) -> tuple[Template, bool]:
        check_template_name(name)
        if not isinstance(data, dict):
            raise ValidationFailed([FieldError(prefix.rstrip(".") or "$", "must be a JSON object")])
        try:
            TemplateBody.model_validate(data)
        except ValidationError as exc:
            raise _errors(exc, prefix) from None
        channels = check_template_channels(data["channels"], prefix=prefix)
        return await self._repository.template_put(name=name, channels=channels, source=source)

    async def template_get(self, name: str) -> Template:
        check_template_name(name)
        found = await self._repository.template_get(name=name)
        if found is None:
            raise NotFound(f"template {name} does not exist")
        return found

    async def template_delete(self, name: str) -> None:
        check_template_name(name)
        if not await self._repository.template_delete(name=name):
            raise NotFound(f"template {name} does not exist")
