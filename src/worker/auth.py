"""The deployment token check. Runs before anything else on every route, so it touches neither body nor workspace."""

import base64
import hashlib
import hmac

from protocol import limits
from protocol.errors import ProtocolError


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


def bearer(authorization: str | None) -> str:
    """The credential of an `Authorization: Bearer …` header ("" when there is none)."""
    if authorization:
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() == "bearer":
            return credentials.strip()
    return ""


# A browser's WebSocket cannot send an Authorization header (and a token never goes in a URL), so a WebSocket
# request may offer its credential as a subprotocol instead: `flarebox.bearer.<base64url of it, unpadded>`, beside
# `flarebox` (the one the server selects, so the credential is never echoed).
SUBPROTOCOL = "flarebox"
_BEARER_SUBPROTOCOL = "flarebox.bearer."


def credential(headers: dict[str, str], *, websocket: bool = False) -> str:
    """The request's credential: the Authorization header's bearer; for a WebSocket without one, the bearer
    subprotocol's ("" when there is none, or it is not valid base64url of UTF-8)."""
    presented = bearer(headers.get("authorization"))
    if presented or not websocket:
        return presented
    for offered in headers.get("sec-websocket-protocol", "").split(","):
        offered = offered.strip()
        if offered.startswith(_BEARER_SUBPROTOCOL):
            encoded = offered[len(_BEARER_SUBPROTOCOL) :]
            try:
                return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                return ""
    return ""


class TokenCheck:
    def __init__(self, token: str | None):
        # A short secret is treated as no secret: answering 503 beats accepting a guessable token.
        self._configured = isinstance(token, str) and len(token) >= limits.MIN_TOKEN_CHARS
        self._expected = _digest(token) if self._configured else b""

    def require_configured(self) -> None:
        if not self._configured:
            raise ProtocolError("not_configured")

    def is_token(self, presented: str) -> bool:
        """Compares fixed-length digests with compare_digest, so neither the token's length nor a matching prefix
        shows in the timing; always compares, even for an empty credential, so every rejection takes one path."""
        return hmac.compare_digest(_digest(presented), self._expected) and bool(presented)
