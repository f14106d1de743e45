"""A Cloudflare Access team on loopback for the Access tests (standalone and under Pyodide): RSA keys published
the way Cloudflare publishes them, a certs endpoint serving whatever keys it holds, and real RS256 tokens."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

AUD = "0d3f5e7a9b1c2d4e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6"
CERTS = "/cdn-cgi/access/certs"


class Key:
    def __init__(self, kid: str):
        self.kid = kid
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        # as Cloudflare publishes them: with alg and use, which the Worker must not trip over
        self.jwk = {**RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True), "kid": kid}
        self.jwk.update(alg="RS256", use="sig")


class JwksServer:
    """The team's certs endpoint on loopback: serves whatever `keys` holds and records each request's path."""

    def __init__(self, *keys: Key):
        self.keys = list(keys)
        self.paths: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - the http.server API
                owner.paths.append(self.path)
                body = json.dumps({"keys": [k.jwk for k in owner.keys]}).encode()
                self.send_response(200 if self.path == CERTS else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "JwksServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)

    def token(self, key: Key, **claims) -> str:
        now = int(time.time())
        body = {"aud": [AUD], "iss": self.origin, "exp": now + 300, "nbf": now - 5, "iat": now, **claims}
        return jwt.encode(body, key.private, algorithm="RS256", headers={"kid": key.kid})
