"""ports.Cipher over WebCrypto (crypto.subtle AES-GCM) under the SECRETS_KEY secret: base64 of 32 random bytes
(`openssl rand -base64 32 | npx wrangler secret put SECRETS_KEY`).

A sealed value is a fresh 12-byte nonce followed by the ciphertext and its 16-byte tag — the byte format of
src/standalone/cipher.py, so a value sealed by one runtime opens with the other under the same key.
"""

import logging
from typing import Any

import js
from pyodide.ffi import JsException

from cloudflare.jsutil import jsobj, to_bytes, uint8
from durable.services import NONCE_BYTES, decode_secrets_key

log = logging.getLogger("flarebox.cloudflare.cipher")

TAG_BYTES = 16


class WebCryptoCipher:
    def __init__(self, secrets_key: str | None):
        self._raw: bytes | None = None
        self._key: Any = None  # the imported CryptoKey, on first use
        if secrets_key:
            try:
                self._raw = decode_secrets_key(secrets_key)
            except ValueError as err:
                log.error("%s; secrets are unavailable until it is fixed", err)  # the reason, never the value
        self.available = self._raw is not None

    async def _crypto_key(self) -> Any:
        if self._raw is None:
            raise ValueError("no SECRETS_KEY is configured")
        if self._key is None:
            self._key = await js.crypto.subtle.importKey(
                "raw", uint8(self._raw), jsobj({"name": "AES-GCM"}), False, js.Array.of("encrypt", "decrypt")
            )
        return self._key

    async def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        key = await self._crypto_key()
        nonce = to_bytes(js.crypto.getRandomValues(js.Uint8Array.new(NONCE_BYTES)))
        sealed = await js.crypto.subtle.encrypt(_params(nonce, aad), key, uint8(plaintext))
        return nonce + to_bytes(sealed)

    async def open(self, sealed: bytes, aad: bytes) -> bytes:
        key = await self._crypto_key()
        if len(sealed) < NONCE_BYTES + TAG_BYTES:
            raise ValueError("the value is too short to be a sealed one")
        try:
            plain = await js.crypto.subtle.decrypt(_params(sealed[:NONCE_BYTES], aad), key, uint8(sealed[NONCE_BYTES:]))
        except JsException:  # OperationError: the tag does not match (another key, another aad, altered bytes)
            raise ValueError("the value was not sealed under this key for this place") from None
        return to_bytes(plain)


def _params(nonce: bytes, aad: bytes) -> Any:
    params = jsobj({"name": "AES-GCM", "tagLength": TAG_BYTES * 8})
    params.iv = uint8(nonce)
    params.additionalData = uint8(aad)
    return params
