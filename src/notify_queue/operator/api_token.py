"""Create the API token's Secret once, at install, and never touch it again.

The chart cannot generate the token itself: a template that draws a random value renders a new
one every time (`helm template`, Argo CD), and `lookup`, which could read the old one back, does
nothing when rendering without a cluster. So, when no token is given, the chart's
pre-install/pre-upgrade hook runs this step (`python -m notify_queue.operator.api_token`) with a
ServiceAccount that may read only this Secret (and the 0.1.0 Secret it adopts from) and create
Secrets:

- the Secret exists: it is left exactly as it is (kept across upgrades; a Secret without the
  api-token key is an error, never repaired, since someone made it by hand);
- it does not, but the Secret of a 0.1.0 release holds an api-token (the chart rendered one into
  it then): that token is copied, so upgrading from 0.1.0 does not rotate it;
- neither: a new random token (48 letters and digits, 285 bits).

Helm does not own the Secret (it is in no manifest), so `helm uninstall` leaves it, and a
reinstall keeps the token. Two runs at once are harmless: the create of the second is refused
(409) and it keeps what the first made.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import secrets
import string
import sys
from pathlib import Path

from notify_queue.errors import ConfigurationError
from notify_queue.operator.kubeapi import KubeApi, load_kube_configuration

TOKEN_KEY = "api-token"  # noqa: S105 - the key's name, not a token
TOKEN_LENGTH = 48
# Letters and digits only: the token goes into shell commands and HTTP headers unquoted.
ALPHABET = string.ascii_letters + string.digits
NOTE = (
    "Made once by the notify-queue chart's api-token hook, which never changes it. Helm does "
    "not manage it: helm uninstall leaves it. To rotate the token, write a new api-token here "
    "and restart the API."
)


class Outcome(enum.StrEnum):
    CREATED = "created with a new token"
    ADOPTED = "created with the token of the release's previous Secret"
    KEPT = "exists: kept as it is"


def new_token() -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(TOKEN_LENGTH))


async def ensure_api_token(
    kube: KubeApi,
    *,
    namespace: str,
    name: str,
    adopt_from: str | None = None,
    labels: dict[str, str] | None = None,
) -> Outcome:
    """Make sure Secret `name` holds an api-token; create it only when it does not exist."""
    existing = await kube.secret_data(namespace=namespace, name=name)
    if existing is not None:
        _check_has_token(existing, namespace, name)
        return Outcome.KEPT
    token, outcome = new_token().encode(), Outcome.CREATED
    if adopt_from:
        previous = await kube.secret_data(namespace=namespace, name=adopt_from)
        if previous and previous.get(TOKEN_KEY):
            token, outcome = previous[TOKEN_KEY], Outcome.ADOPTED
    created = await kube.secret_create(
        namespace=namespace,
        name=name,
        data={TOKEN_KEY: token},
        labels=labels or {},
        annotations={"notifyqueue.io/note": NOTE},
    )
    if created:
        return outcome
    # Another run created it between our read and our create: theirs stands.
    existing = await kube.secret_data(namespace=namespace, name=name)
    _check_has_token(existing or {}, namespace, name)
    return Outcome.KEPT


def _check_has_token(data: dict[str, bytes], namespace: str, name: str) -> None:
    if not data.get(TOKEN_KEY):
        raise ConfigurationError(
            [
                f"Secret {namespace}/{name} exists without an {TOKEN_KEY} key; it is not ours "
                f"to change: add the key, or delete the Secret to have a token generated"
            ]
        )


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KEY=VALUE")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m notify_queue.operator.api_token",
        description="Create the Secret holding the API token, with a random token, unless it "
        "exists (then it is left as it is).",
    )
    parser.add_argument("--namespace", required=True, help="namespace of the Secret")
    parser.add_argument("--secret", required=True, help="name of the Secret to create")
    parser.add_argument(
        "--adopt-from",
        help="a Secret whose api-token key, if any, becomes the new Secret's token "
        "(the chart-made Secret of a 0.1.0 release)",
    )
    parser.add_argument(
        "--label",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of the created Secret (repeatable)",
    )
    parser.add_argument("--kubeconfig", type=Path, help="default: in-cluster or $KUBECONFIG")
    return parser


async def _run(args: argparse.Namespace) -> Outcome:
    kube = KubeApi(load_kube_configuration(args.kubeconfig))
    try:
        return await ensure_api_token(
            kube,
            namespace=args.namespace,
            name=args.secret,
            adopt_from=args.adopt_from,
            labels=dict(args.label),
        )
    finally:
        await kube.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        outcome = asyncio.run(_run(args))
    except Exception as exc:  # one line, as every command of this program
        print(f"api-token failed: {exc}", file=sys.stderr)
        return 1
    # Never the token itself: Job logs are readable by more people than the Secret.
    print(f"Secret {args.namespace}/{args.secret}: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
