"""Keep the API token out of every log line, whatever a client put in a URL or a body.

The access log writes each request's path and query, and a client may well send the token there by mistake
(`?token=...`, a name): a filter on every handler replaces it before any record is written.
"""

import logging

REDACTED = "[redacted]"


class TokenRedactor(logging.Filter):
    def __init__(self, token: str):
        super().__init__()
        self._token = token

    def _clean(self, value):
        return value.replace(self._token, REDACTED) if isinstance(value, str) and self._token in value else value

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
    if not token:
        return
    redactor = TokenRedactor(token)
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, TokenRedactor) for f in handler.filters):
                handler.addFilter(redactor)
