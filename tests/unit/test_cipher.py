"""The standalone cipher (standalone/cipher.py): its key file, SECRETS_KEY, and AES-GCM bound to where a value is."""

import base64
import os
import stat
import subprocess
import sys

import pytest

from durable.services import decode_secrets_key as decode_key
from standalone.cipher import KEY_FILE, AesGcmCipher, load_or_create_key


def test_a_key_is_generated_once_with_mode_0600_and_reused(tmp_path):
    key = load_or_create_key(tmp_path, environ={})
    path = tmp_path / KEY_FILE
    assert len(key) == 32 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_or_create_key(tmp_path, environ={}) == key
    assert [p.name for p in tmp_path.iterdir()] == [KEY_FILE]  # no temporary file left behind


def test_secrets_key_wins_and_writes_nothing(tmp_path):
    key = bytes(range(32))
    assert load_or_create_key(tmp_path, environ={"SECRETS_KEY": base64.b64encode(key).decode()}) == key
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["", "not base64!", base64.b64encode(b"short").decode(), "A" * 60])
def test_a_malformed_key_says_what_to_do(text):
    with pytest.raises(ValueError, match="openssl rand -base64 32"):
        decode_key(text)


async def test_a_sealed_value_opens_only_with_its_key_and_place():
    cipher = AesGcmCipher(bytes(32))
    sealed = await cipher.seal(b"value", b"ns/ws/A")
    assert b"value" not in sealed and len(sealed) == 12 + 5 + 16
    assert await cipher.open(sealed, b"ns/ws/A") == b"value"
    assert await cipher.seal(b"value", b"ns/ws/A") != sealed  # a fresh nonce every time
    for key, aad, blob in (
        (bytes(32), b"ns/ws/B", sealed),
        (b"\1" * 32, b"ns/ws/A", sealed),
        (bytes(32), b"ns/ws/A", sealed[:-1] + bytes([sealed[-1] ^ 1])),
    ):
        with pytest.raises(ValueError):
            await AesGcmCipher(key).open(blob, aad)


def test_a_bad_secrets_key_stops_the_server_at_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SECRETS_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "standalone.cli", "serve", "--port", "1", "--data-dir", str(tmp_path)],
        env={**env, "SECRETS_KEY": "too-short", "SANDBOX_API_TOKEN": "t" * 40},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "SECRETS_KEY" in done.stderr and "Traceback" not in done.stderr
