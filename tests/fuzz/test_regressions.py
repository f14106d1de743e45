"""Defects the fuzzer found, pinned as plain tests (the fuzz run is randomised; these always run)."""

import pytest
from e2e import ws_url

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("config", "code"),
    [
        ({"image": None}, "invalid_field"),  # was a 500: null reached the image pattern
        ({"persistent": None}, "invalid_field"),
        ({"cwd": None}, "invalid_cwd"),
    ],
)
def test_null_where_the_config_takes_no_null_is_400(fuzz_server, config, code):
    with fuzz_server.client() as client:
        response = client.put(ws_url("regress", "nulls"), json=config)
        assert response.status_code == 400 and response.json()["error"]["code"] == code, response.text
        assert client.get(ws_url("regress", "nulls")).status_code == 404  # nothing was created
        # null where the spec allows it means the default
        assert client.put(ws_url("regress", "nulls"), json={"instance": None}).status_code == 201
        assert client.delete(ws_url("regress", "nulls"), params={"confirm": "true"}).status_code == 200


def test_a_since_in_non_ascii_digits_is_invalid_query(fuzz_server):
    with fuzz_server.client() as client:
        response = client.get("/v1/audit", params={"since": "２０２６-01-01T00:00:00Z"})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_query", response.text
