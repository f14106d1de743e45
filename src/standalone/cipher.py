"""ports.Cipher for one machine: AES-256-GCM (the `cryptography` package) under a key generated once into
<data-dir>/secrets.key (mode 0600, like the token). SECRETS_KEY (base64 of 32 bytes), when set, is used instead —
the same setting as on Cloudflare, so an operator can keep the key off the data disk."""

import base64
import os
import secrets
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from durable.services import NONCE_BYTES, decode_secrets_key
from standalone.token import write_private

KEY_FILE = "secrets.key"


def load_or_create_key(data_dir: Path, environ: dict | None = None) -> bytes:
    environ = os.environ if environ is None else environ
    if environ.get("SECRETS_KEY"):
        return decode_secrets_key(environ["SECRETS_KEY"])
    path = Path(data_dir) / KEY_FILE
    try:
        return decode_secrets_key(path.read_text(encoding="ascii"))
    except FileNotFoundError:
        pass
    text = base64.b64encode(secrets.token_bytes(32)).decode("ascii")
    write_private(path, text)
    return decode_secrets_key(text)


class AesGcmCipher:
    available = True

    def __init__(self, key: bytes):
        self._aead = AESGCM(key)

    async def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext, aad)

    async def open(self, sealed: bytes, aad: bytes) -> bytes:
        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
        except InvalidTag:
            raise ValueError("the value was not sealed under this key for this place") from None
