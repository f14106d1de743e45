"""Who may do what: a credential's principal, and the one decision every request goes through.

The edge turns a credential into a Principal (the deployment token: ADMIN; a scoped key: its record) and each route
declares what it needs (worker/routes.py). `allows` is the whole policy; it knows nothing of whether a workspace
exists, so an answer can never say so (out of scope is 403 either way).
"""

from dataclasses import dataclass

ADMIN_ONLY = None  # a route's need when no key may use it (minting and revoking keys)


@dataclass(frozen=True)
class Principal:
    key_id: str | None  # None: the deployment token
    label: str = ""
    namespace: str | None = None  # a key's namespace
    workspace: str | None = None  # a key's one workspace, or None for every workspace of its namespace
    scopes: frozenset[str] = frozenset()
    service: str | None = None  # a proxy key bound to one service: it opens that service's /v1/proxy and nothing else

    @property
    def admin(self) -> bool:
        return self.key_id is None

    def covers(self, namespace: str | None, workspace: str | None) -> bool:
        """The target lies inside this principal's reach (admin: everything). A None target component means
        "all of them": a namespace-wide key covers (ns, None), a one-workspace key does not."""
        if self.admin:
            return True
        if namespace != self.namespace:
            return False
        return self.workspace is None or workspace == self.workspace


ADMIN = Principal(None)

# What a route needs: a scope, ANY_SCOPE (reading a workspace's status: every key on it may), or ADMIN_ONLY.
ANY_SCOPE = "*"


def allows(principal: Principal, need: str | None, namespace: str | None, workspace: str | None) -> bool:
    """May `principal` do what needs `need` on (namespace, workspace)? None components mean the route's whole
    range (listing every workspace of a namespace, or of the deployment)."""
    if principal.admin:
        return True
    if principal.service is not None:  # it names one service: every other route is out of its reach
        return False
    if need is ADMIN_ONLY:  # (None is in no key's scopes either: the next test says the same)  # pragma: no mutate
        return False  # pragma: no mutate
    if need != ANY_SCOPE and need not in principal.scopes:
        return False
    return principal.covers(namespace, workspace)


def may_list(principal: Principal, namespace: str | None, workspace: str | None = None) -> bool:
    """Listing (workspaces, audit records) is filtered to the principal's reach; naming a namespace or workspace
    outside it is refused rather than answered empty, so a key learns nothing of what lies beyond."""
    if principal.admin:
        return True
    if principal.service is not None:
        return False
    if namespace is not None and namespace != principal.namespace:
        return False
    return workspace is None or principal.workspace is None or workspace == principal.workspace


def proxy_target(principal: Principal) -> tuple[str, str, str] | None:
    """The (namespace, workspace, service) that /v1/proxy opens for `principal`: a `proxy` key bound to a service
    of one workspace, and nothing else — the deployment token names no service, and the path never names one."""
    if principal.admin or principal.service is None or "proxy" not in principal.scopes:
        return None
    if principal.namespace is None or principal.workspace is None:
        return None
    return principal.namespace, principal.workspace, principal.service
