"""One exception hierarchy for the whole program.

Driver errors are translated into these once, at the repository edge; the API maps each class to
one problem+json status, the CLI to a one-line message and an exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class NotifyQueueError(Exception):
    """Base of every error Notify Queue raises on purpose."""


@dataclass(frozen=True)
class FieldError:
    """One invalid field: its path (`sendAt`, `notifications[3].body`) and what is wrong."""

    field: str
    message: str


class ValidationFailed(NotifyQueueError):
    """A request or resource is invalid; nothing was stored. Carries every bad field."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))


class NotFound(NotifyQueueError):
    """The notification (or policy) does not exist."""


@dataclass
class Conflict(NotifyQueueError):
    """The request conflicts with the current state (wrong status, idempotency key reused)."""

    detail: str
    existing_id: str | None = None

    def __str__(self) -> str:
        return self.detail


class DatabaseUnavailable(NotifyQueueError):
    """PostgreSQL cannot be reached or stopped answering; the caller may retry later."""


class DatabaseBusy(DatabaseUnavailable):
    """A transaction lost to concurrent ones (a deadlock, a serialisation failure, a lock wait
    past `lock_timeout`) and was rolled back; running it again may succeed."""


class SchemaNotCurrent(NotifyQueueError):
    """The database schema is older than this program; run `notify-queue migrate`."""


class OlderReleaseRunning(NotifyQueueError):
    """`migrate --contract` while a process of an older release is still connected: its
    destructive steps would break that process (docs/upgrading.md)."""


class ContractStepWaits(NotifyQueueError):
    """A contract step found the work it depends on not done yet (an index the workers are still
    building, 0015); nothing was applied, and running it again later succeeds."""


class UpgradeThroughRelease(NotifyQueueError):
    """The database applied part of a release's steps, which this release keeps squashed into
    fewer (a build between two releases migrated it): the release that shipped those steps must
    finish its `migrate` first (docs/upgrading.md, "The history squashed")."""


class CannotListen(NotifyQueueError):
    """The address a process must listen on cannot be bound: taken, or not this machine's."""


@dataclass
class ConfigurationError(NotifyQueueError):
    """A setting is invalid or a combination of settings cannot work."""

    messages: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return "; ".join(self.messages)


@dataclass
class TemplateRenderFailed(NotifyQueueError):
    """A template could not be rendered with its data; the same template and data fail the same
    way, so it is permanent: a 400 at creation, a FAILED notification at send time.

    `part` is the channel's part (`email.body`); `kind` is `data` (a missing variable, a division
    by zero...), `template` (something the sandbox forbids) or `bound` (a render bound, named by
    `rule`: services.sandbox's RULE_*, the render's time or memory).
    """

    part: str
    kind: str
    message: str
    rule: str | None = None

    def __str__(self) -> str:
        return f"{self.part}: {self.message}"
