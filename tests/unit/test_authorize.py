"""The whole authorization policy (worker/authorize.py), exhaustively: every kind of principal × every route's need
× targets inside and outside its reach. The expectations are written out independently of the implementation."""

import itertools

import pytest

from protocol.keys import SCOPES
from worker.authorize import ADMIN, ADMIN_ONLY, ANY_SCOPE, Principal, allows, may_list, proxy_target
from worker.routes import DEPLOYMENT_ROUTES, PROXY_METHODS, WORKSPACE_ROUTES

NEEDS = [ADMIN_ONLY, ANY_SCOPE, *SCOPES]
TARGETS = [("ns", "ws"), ("ns", "other"), ("elsewhere", "ws"), ("ns", None), ("elsewhere", None), (None, None)]


def principals():
    yield ADMIN
    for size in range(len(SCOPES) + 1):
        for scopes in itertools.combinations(SCOPES, size):
            yield Principal("k1", "one", "ns", "ws", frozenset(scopes))  # one workspace
            yield Principal("k2", "all", "ns", None, frozenset(scopes))  # the whole namespace
            yield Principal("k3", "svc", "ns", "ws", frozenset(scopes), service="web")  # one service's proxy


def expected(p: Principal, need, namespace, workspace) -> bool:
    if p.key_id is None:
        return True
    if p.service is not None:  # it opens /v1/proxy (proxy_target) and no route that allows() decides
        return False
    if need is None:
        return False
    if need != "*" and need not in p.scopes:
        return False
    if namespace != "ns":
        return False
    if p.workspace is None:
        return True
    return workspace == "ws"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("need", NEEDS)
def test_allows_is_exactly_the_policy(need, target):
    for p in principals():
        assert allows(p, need, *target) is expected(p, need, *target), (p, need, target)


def test_a_key_never_mints_or_revokes_keys_whatever_its_scopes():
    everything = Principal("k", "x", "ns", None, frozenset(SCOPES))
    for methods in (DEPLOYMENT_ROUTES[("keys",)], DEPLOYMENT_ROUTES[("keys", "{key}")]):
        for endpoint in methods.values():
            assert endpoint.need is ADMIN_ONLY
            assert not allows(everything, endpoint.need, "ns", None)


def test_every_workspace_route_needs_the_scope_the_protocol_names():
    needs = {(path, method): e.need for path, methods in WORKSPACE_ROUTES.items() for method, e in methods.items()}
    assert needs == {
        ((), "GET"): ANY_SCOPE,
        ((), "PUT"): "manage",
        ((), "DELETE"): "manage",
        (("exec",), "POST"): "exec",
        (("exec", "{id}"), "GET"): "exec",
        (("exec", "{id}", "cancel"), "POST"): "exec",
        (("files",), "GET"): "files",
        (("files",), "PUT"): "files",
        (("files",), "DELETE"): "files",
        (("files", "stat"), "GET"): "files",
        (("files", "move"), "POST"): "files",
        (("files", "mkdir"), "POST"): "files",
        (("files", "archive"), "GET"): "files",
        (("files", "archive"), "PUT"): "files",
        (("processes",), "GET"): "exec",
        (("pty",), "GET"): "exec",
        (("processes", "{pid}", "signal"), "POST"): "exec",
        (("snapshot",), "POST"): "snapshots",
        (("snapshots",), "GET"): "snapshots",
        (("stop",), "POST"): "snapshots",
        (("snapshots", "{snapshot}"), "PATCH"): "snapshots",
        (("restore",), "POST"): "snapshots",
        (("export",), "GET"): "files",
        (("import",), "PUT"): "files",
        (("backup",), "POST"): "snapshots",
        (("backups",), "GET"): "snapshots",
        (("services",), "GET"): "manage",
        (("services", "{service}"), "PUT"): "manage",
        (("services", "{service}"), "DELETE"): "manage",
        (("services", "{service}", "logs"), "GET"): "manage",
        (("secrets",), "GET"): "manage",
        (("secrets", "{secret}"), "PUT"): "manage",
        (("secrets", "{secret}"), "DELETE"): "manage",
        **{(("ports", "{port}", "{path}"), method): "proxy" for method in PROXY_METHODS},
    }
    assert {method: e.need for method, e in DEPLOYMENT_ROUTES[("proxy", "{path}")].items()} == dict.fromkeys(
        PROXY_METHODS, "proxy"
    )


def test_what_changes_or_runs_something_is_audited_and_nothing_else():
    audited = {
        (path, method) for path, methods in WORKSPACE_ROUTES.items() for method, e in methods.items() if e.audited
    }
    audited |= {
        (path, method) for path, methods in DEPLOYMENT_ROUTES.items() for method, e in methods.items() if e.audited
    }
    assert audited == {
        ((), "PUT"),
        ((), "DELETE"),
        (("exec",), "POST"),
        (("exec", "{id}", "cancel"), "POST"),
        (("files",), "PUT"),
        (("files",), "DELETE"),
        (("files", "move"), "POST"),
        (("files", "mkdir"), "POST"),
        (("files", "archive"), "PUT"),
        (("processes", "{pid}", "signal"), "POST"),
        (("pty",), "GET"),
        (("snapshot",), "POST"),
        (("stop",), "POST"),
        (("snapshots", "{snapshot}"), "PATCH"),
        (("restore",), "POST"),
        (("import",), "PUT"),
        (("backup",), "POST"),
        (("services", "{service}"), "PUT"),
        (("services", "{service}"), "DELETE"),
        (("secrets", "{secret}"), "PUT"),
        (("secrets", "{secret}"), "DELETE"),
        (("keys",), "POST"),
        (("keys", "{key}"), "DELETE"),
    }


@pytest.mark.parametrize(
    "principal,namespace,workspace,ok",
    [
        (ADMIN, None, None, True),
        (ADMIN, "any", "thing", True),
        (Principal("k", "", "ns", "ws", frozenset({"exec"})), None, None, True),
        (Principal("k", "", "ns", "ws", frozenset({"exec"})), "ns", None, True),
        (Principal("k", "", "ns", "ws", frozenset({"exec"})), "ns", "ws", True),
        (Principal("k", "", "ns", "ws", frozenset({"exec"})), "ns", "other", False),
        (Principal("k", "", "ns", "ws", frozenset({"exec"})), "other", None, False),
        (Principal("k", "", "ns", None, frozenset({"exec"})), "ns", "any", True),
        (Principal("k", "", "ns", None, frozenset({"exec"})), "other", "any", False),
        (Principal("k", "", "ns", "ws", frozenset({"proxy"}), service="web"), "ns", "ws", False),
        (Principal("k", "", "ns", "ws", frozenset({"proxy"}), service="web"), None, None, False),
    ],
)
def test_listing_names_nothing_beyond_the_reach(principal, namespace, workspace, ok):
    assert may_list(principal, namespace, workspace) is ok


def test_the_admin_covers_everything_and_a_principal_is_frozen():
    import dataclasses

    assert ADMIN.covers("any", "thing") and ADMIN.covers(None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Principal("k", "", "ns").scopes = frozenset(SCOPES)  # type: ignore[misc]


@pytest.mark.parametrize(
    "principal,target",
    [
        (Principal("k", "", "ns", "ws", frozenset({"proxy"}), service="web"), ("ns", "ws", "web")),
        (ADMIN, None),  # the token names no service
        (Principal("k", "", "ns", "ws", frozenset({"proxy"})), None),  # a workspace's proxy key: …/ports/ only
        (Principal("k", "", "ns", "ws", frozenset({"exec"}), service="web"), None),  # no proxy scope
        (Principal("k", "", "ns", None, frozenset({"proxy"}), service="web"), None),  # no one workspace
    ],
)
def test_the_key_resolved_proxy_opens_exactly_the_service_the_key_names(principal, target):
    assert proxy_target(principal) == target
