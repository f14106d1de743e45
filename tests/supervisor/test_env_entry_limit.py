"""An env entry longer than the kernel takes for one exec string is refused up front (400 invalid_field), never a
retryable-looking exec_failed; an entry right at the limit runs (issue 17, defect 9)."""

import errno
import subprocess

import pytest

from protocol.limits import MAX_ENV_ENTRY_BYTES

from .harness import new_id

pytestmark = pytest.mark.timeout(60)


def test_an_env_value_over_the_kernel_limit_is_refused_before_anything_runs(supervisor):
    marker = supervisor.workspace / "ran"
    body = {"request_id": new_id(), "command": "touch ran", "env": {"BIG": "v" * 200_000}}
    response = supervisor.post_exec(body)
    # without the check the kernel refuses the exec with E2BIG and the answer is 500 exec_failed ("retry")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_field"
    assert "BIG" in error["message"] and str(MAX_ENV_ENTRY_BYTES) in error["message"]
    assert not marker.exists()


def test_multibyte_values_count_in_utf8_bytes(supervisor):
    # 65,536 × "é" is 131,072 bytes of UTF-8 although it is only 65,536 characters
    response = supervisor.post_exec({"request_id": new_id(), "command": "true", "env": {"E": "é" * 65_536}})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_field", response.text


def test_an_env_entry_right_at_the_limit_runs(supervisor):
    name = "AT_LIMIT"
    value = "x" * (MAX_ENV_ENTRY_BYTES - len(name) - 1)  # "AT_LIMIT=xxx…" is exactly MAX_ENV_ENTRY_BYTES bytes
    result = supervisor.exec('printf %s "${#AT_LIMIT}"', env={name: value})
    assert result.status == 200, result.events
    assert result.terminal == {**result.terminal, "type": "exit", "exit_code": 0}, result.events
    assert result.output == str(len(value))


def test_the_limit_is_the_kernels():
    """MAX_ENV_ENTRY_BYTES is the longest "NAME=value" this kernel execs; one byte more is E2BIG."""
    at_limit = {"A": "x" * (MAX_ENV_ENTRY_BYTES - 2)}
    over = {"A": "x" * (MAX_ENV_ENTRY_BYTES - 1)}
    assert subprocess.run(["/bin/true"], env=at_limit).returncode == 0
    with pytest.raises(OSError) as refused:
        subprocess.run(["/bin/true"], env=over)
    assert refused.value.errno == errno.E2BIG
