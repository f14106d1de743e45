"""The request as the edge sees it: a runtime-neutral dataclass each adapter builds from its own request type."""

from dataclasses import dataclass, field

from durable.ports import RequestBody


@dataclass
class EdgeRequest:
    method: str
    path: str  # raw, still percent-encoded: `%` in a name must reach validation, not be decoded away
    query: str = ""  # raw query string, without the `?`
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: RequestBody | None = None
