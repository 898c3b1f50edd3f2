"""Who may call what: the admin key on admin routes, per-session tokens on session routes.

Keys and tokens are compared in constant time, so a sandboxed agent cannot learn the admin
key or another session's token by timing its guesses.
"""

from __future__ import annotations

import hmac

from rllm.gateway.errors import GatewayError
from rllm.runtime.http_messages import Request


def bearer(request: Request) -> str | None:
    """The key a request presents: ``Authorization: Bearer <key>``, else ``X-API-Key``."""
    auth = request.headers.get("Authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("X-API-Key")


def same_secret(presented: str | None, secret: str | None) -> bool:
    """Whether ``presented`` is ``secret`` (False when either is missing), in constant time."""
    return (
        secret is not None
        and presented is not None
        and hmac.compare_digest(presented.encode(), secret.encode())
    )


def require_admin(request: Request, admin_key: str | None) -> None:
    """401 without a key, 403 with the wrong one; anyone passes when no admin key is set."""
    if admin_key is None:
        return
    presented = bearer(request)
    if presented is None:
        raise GatewayError(
            401, "admin route needs 'Authorization: Bearer <admin key>'", code="missing_api_key"
        )
    if not same_secret(presented, admin_key):
        raise GatewayError(403, "the API key is not the admin key", code="invalid_api_key")


def session_denied(session_id: str) -> GatewayError:
    """The one 401 for an unknown session and a wrong token alike, so ids cannot be probed."""
    return GatewayError(401, f"invalid or missing token for session {session_id!r}", code="invalid_api_key")


__all__ = ["bearer", "require_admin", "same_secret", "session_denied"]
