"""Keep the API token and every key secret out of every log line, whatever a client put in a URL or a body.

The access log writes each request's path and query, and a client may well send a secret there by mistake
(`?token=...`, a name): a filter on every handler replaces it before any record is written. Key secrets are not
known to the server (only their digests), so anything shaped like a key is replaced (directory/audit.py).
"""

import logging

from directory.audit import REDACTED, redact
from protocol.keys import KEY_PREFIX

__all__ = ["REDACTED", "TokenRedactor", "install"]


class TokenRedactor(logging.Filter):
    def __init__(self, token: str | None):
        super().__init__()
        self._token = token or None

    def _clean(self, value):
        if not isinstance(value, str) or not (KEY_PREFIX in value or (self._token and self._token in value)):
            return value
        return redact(value, self._token)

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self._clean(record.msg)
        # uvicorn's access formatter unpacks record.args, so redact each argument instead of pre-formatting
        if isinstance(record.args, tuple):
            record.args = tuple(self._clean(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: self._clean(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            record.exc_text = self._clean(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = self._clean(record.exc_text)
        return True


def install(token: str | None, logger_names: tuple[str, ...] = ("", "uvicorn", "uvicorn.error", "uvicorn.access")):
    """Add the redactor to every handler of these loggers (call after uvicorn has configured its logging)."""
    redactor = TokenRedactor(token)
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, TokenRedactor) for f in handler.filters):
                handler.addFilter(redactor)
