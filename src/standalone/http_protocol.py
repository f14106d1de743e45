"""uvicorn's h11 protocol, answering an oversized request head with the documented 431 `headers_too_large`.

A request head bigger than h11's buffer limit (serve.MAX_INCOMPLETE_EVENT) never reaches the ASGI app: h11 raises
"Receive buffer too long" (its status hint is 431) and stock uvicorn answers a plain-text 400 instead. Heads that fit
the buffer but exceed server.MAX_HEADER_BYTES are refused by the app itself, with the same answer.
"""

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from protocol.errors import ProtocolError


class FlareboxH11Protocol(H11Protocol):
    def send_400_response(self, msg: str) -> None:
        buffered, _ = self.conn.trailing_data
        if len(buffered) <= self.config.h11_max_incomplete_event_size:
            super().send_400_response(msg)  # malformed HTTP, not an API request: uvicorn's answer stands
            return
        err = ProtocolError("headers_too_large")
        body = json.dumps(err.body(), separators=(",", ":")).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (h11.Response(status_code=err.status, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
