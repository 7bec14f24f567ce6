"""API tokens: how a bearer string is made, stored, checked, and what each role may do.

A bearer string is ``cvy_<id>_<secret>``: ``id`` (12 hex characters) is public and names the row;
``secret`` is 256 random bits (43 URL-safe characters) and is never stored, only its SHA-256. A
fast hash is enough because the secret has full entropy: a slow password hash (bcrypt, argon2)
protects guessable secrets and would cost every request milliseconds. The presented secret's hash
is compared with the stored one by :func:`hmac.compare_digest` (constant time), so the comparison
does not reveal how many leading characters matched.

Roles are ranked: ``producer`` (send, publish, read the jobs it sent) < ``operator`` (read every
job, queue and dead letter, the audit log and schedules; replay; pause and resume schedules) <
``admin`` (purge, tokens). A token may be limited to some queues: it then sends to, reads and acts
on those queues only.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from conveyor._errors import Forbidden, Unauthenticated
from conveyor.backends.base import Token

Role = Literal["producer", "operator", "admin"]
ROLES: tuple[Role, ...] = ("producer", "operator", "admin")
_RANK: dict[str, int] = {role: rank for rank, role in enumerate(ROLES)}

#: The header the HTTP service stamps on every job it accepts: the name of the token that sent it,
#: so that a producer token can read its own jobs and no one else's.
SENT_BY = "sent_by"

_PREFIX = "cvy"
_ID_CHARS = 12


def mint() -> tuple[str, str, str]:
    """A new token's ``(id, secret, bearer string)``."""
    token_id = secrets.token_hex(_ID_CHARS // 2)
    secret = secrets.token_urlsafe(32)
    return token_id, secret, f"{_PREFIX}_{token_id}_{secret}"


def hash_secret(secret: str) -> str:
    """The stored form of a secret: its SHA-256, hex."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def parse_bearer(bearer: str | None) -> tuple[str, str]:
    """``(id, secret)`` of a bearer string; raise Unauthenticated for anything else. The message
    never quotes what was presented (it may be a secret pasted in the wrong place)."""
    if not bearer:
        raise Unauthenticated("a bearer token is required (Authorization: Bearer cvy_...)", "missing")
    prefix, _, rest = bearer.partition("_")
    token_id, _, secret = rest.partition("_")
    if prefix != _PREFIX or len(token_id) != _ID_CHARS or not secret or not _is_hex(token_id):
        raise Unauthenticated("malformed bearer token (expected cvy_<id>_<secret>)")
    return token_id, secret


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def verify(token: Token | None, token_id: str, secret: str, now: datetime) -> Token:
    """``token`` if ``secret`` is its secret and it is neither revoked nor expired; else raise
    Unauthenticated. The hashes are compared in constant time, also when there is no token."""
    stored = token.secret_hash if token is not None else "0" * 64
    matches = hmac.compare_digest(hash_secret(secret), stored)
    if token is None or not matches:
        raise Unauthenticated(f"unknown token {token_id} (or a wrong secret)")
    if token.revoked_at is not None:
        raise Unauthenticated(f"token {token.name!r} was revoked", "revoked")
    if token.expires_at is not None and token.expires_at <= now:
        raise Unauthenticated(f"token {token.name!r} expired at {token.expires_at.isoformat()}", "expired")
    return token


def has_role(token: Token, role: Role) -> bool:
    """Whether ``token`` has ``role`` or a higher one, whatever queues it is limited to."""
    return _RANK[role] <= _RANK.get(token.role, -1)


def allows(token: Token, role: Role, queue: str | None = None) -> bool:
    """Whether ``token`` has ``role`` (or a higher one) and, for an action on ``queue``, may act on it.
    An action on no one queue (``queue`` None) needs a token limited to no queues."""
    if _RANK[role] > _RANK.get(token.role, -1):
        return False
    if token.queues is None:
        return True
    return queue is not None and queue in token.queues


def require(token: Token, role: Role, queue: str | None = None) -> None:
    """Raise Forbidden unless :func:`allows`."""
    require_role(token, role)
    if token.queues is not None and (queue is None or queue not in token.queues):
        where = f"queue {queue!r}" if queue is not None else "every queue"
        raise Forbidden(f"token {token.name!r} is limited to queues {list(token.queues)}; this acts on {where}")


def require_role(token: Token, role: Role) -> None:
    """Raise Forbidden unless ``token`` has ``role`` or a higher one (whatever its queues)."""
    if _RANK[role] > _RANK.get(token.role, -1):
        raise Forbidden(f"token {token.name!r} is a {token.role} token; this needs {role}")


def stamp(headers: Mapping[str, Any] | None, token: Token) -> dict[str, Any]:
    """The headers of a job sent with ``token``: the sender's, with :data:`SENT_BY` set to its name
    (overwriting any value the sender gave, so that it cannot claim another token's jobs)."""
    return {**(headers or {}), SENT_BY: token.name}


def may_read(token: Token, queue: str, headers: Mapping[str, Any]) -> bool:
    """Whether ``token`` may read a job of ``queue`` with these ``headers``: operators and admins
    read every job of their queues, producers only the jobs they sent."""
    if not allows(token, "producer", queue):
        return False
    return _RANK.get(token.role, -1) >= _RANK["operator"] or headers.get(SENT_BY) == token.name
