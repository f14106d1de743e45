"""The deployed Workers SDK is the tested one (defect 2 of issue 16).

`pywrangler deploy` first runs `pywrangler sync`, which compiles pyproject.toml's [project] dependencies plus an
unpinned workers-runtime-sdk for Pyodide into pylock.toml, deletes python_modules/ and refills it
([dependency-groups] is never read). So the pin lives in [project] dependencies, behind a Pyodide-only marker, and
scripts/stage_worker.sh (wrangler's build step, after the sync) refuses to stage a bundle whose python_modules/ holds
another version. The staging runs in a scratch copy of the scripts, so the checkout's python_modules/ and build/ are
never touched.
"""

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
WORKER_PACKAGES = ("cloudflare", "protocol", "worker", "durable", "directory")


def _pinned_requirement() -> Requirement:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    sdk = [Requirement(d) for d in deps if Requirement(d).name == "workers-runtime-sdk"]
    assert len(sdk) == 1, deps
    return sdk[0]


def _pinned_version() -> str:
    (spec,) = _pinned_requirement().specifier
    assert spec.operator == "==", spec
    return spec.version


def _metadata_version(dist_info: Path) -> str:
    for line in (dist_info / "METADATA").read_text().splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Version in {dist_info}")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """Just enough of the repository for scripts/stage_worker.sh: the two scripts, pyproject.toml, the Worker's
    sources (stand-ins) — and no python_modules/ yet."""
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    for script in ("stage_worker.sh", "vendor_workers_sdk.sh"):
        shutil.copy2(REPO / "scripts" / script, root / "scripts" / script)
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "src").mkdir()
    (root / "src" / "entry.py").write_text("# entry\n")
    for pkg in WORKER_PACKAGES:
        (root / "src" / pkg).mkdir()
        (root / "src" / pkg / "__init__.py").write_text("")
    return root


def _vendor(root: Path, *versions: str, stamped: bool = False) -> None:
    """A python_modules/ as `pywrangler sync` leaves it: the SDK's modules and its dist-info (one per version)."""
    modules = root / "python_modules"
    (modules / "workers").mkdir(parents=True, exist_ok=True)
    (modules / "workers" / "__init__.py").write_text("")
    for version in versions:
        dist_info = modules / f"workers_runtime_sdk-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.4\nName: workers-runtime-sdk\nVersion: {version}\nRequires-Python: >=3.11\n"
        )
    if stamped:  # as scripts/vendor_workers_sdk.sh leaves it (stamp matching the pin: the script is a no-op)
        stamp = f"workers-runtime-sdk=={_pinned_version()} python3.14 wasm32-pyodide2025"
        (modules / ".flarebox-vendored").write_text(stamp)


def _stage(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "UV": "/nonexistent/uv"}  # never vendors from the network here
    return subprocess.run(
        ["bash", str(root / "scripts" / "stage_worker.sh")], cwd=root, env=env, capture_output=True, text=True
    )


def test_the_pin_is_exact_and_for_pyodide_only():
    req = _pinned_requirement()
    assert _pinned_version()  # an exact == pin, nothing looser
    assert req.marker is not None
    # what `pywrangler sync` resolves for (the Pyodide interpreter) gets it ...
    assert req.marker.evaluate({**default_environment(), "sys_platform": "emscripten", "platform_system": "Emscripten"})
    # ... `pip install -e .` of the standalone runtime does not (no `workers`/`asgi` modules, no .pth at startup)
    assert not req.marker.evaluate({**default_environment(), "sys_platform": "linux"})
    assert not req.marker.evaluate()


def test_the_pin_is_written_once():
    """One source: [dependency-groups] (never read by pywrangler) carries no second, drifting pin, and the vendor
    script reads the same version."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for group, deps in pyproject.get("dependency-groups", {}).items():
        assert not [d for d in deps if isinstance(d, str) and Requirement(d).name == "workers-runtime-sdk"], group
    out = subprocess.run(
        [str(REPO / "scripts" / "vendor_workers_sdk.sh"), "--pin"],
        cwd=REPO,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == _pinned_version()


def test_the_tested_copy_is_the_pinned_one():
    """The copy tests/cloudflare/ runs under Pyodide (vendored by scripts/vendor_workers_sdk.sh) is the pin."""
    subprocess.run([str(REPO / "scripts" / "vendor_workers_sdk.sh")], check=True, cwd=REPO)
    dist_infos = sorted((REPO / "python_modules").glob("workers_runtime_sdk-*.dist-info"))
    assert [_metadata_version(d) for d in dist_infos] == [_pinned_version()]


@pytest.mark.parametrize("stamped", [False, True], ids=["pywrangler-sync", "vendor-script"])
def test_staging_accepts_the_pinned_sdk(checkout, stamped):
    _vendor(checkout, _pinned_version(), stamped=stamped)
    proc = _stage(checkout)
    assert proc.returncode == 0, proc.stderr
    assert (checkout / "build" / "worker" / "entry.py").is_file()
    for pkg in WORKER_PACKAGES:
        assert (checkout / "build" / "worker" / pkg / "__init__.py").is_file()


def test_staging_refuses_another_sdk_version(checkout):
    """What an unpinned `pywrangler sync` would have left: the newest SDK, not the tested one."""
    pinned = _pinned_version()
    other = "99.0.0"
    (checkout / "build" / "worker").mkdir(parents=True)
    (checkout / "build" / "worker" / "entry.py").write_text("# stale\n")  # an earlier bundle
    _vendor(checkout, other)
    proc = _stage(checkout)
    assert proc.returncode != 0
    assert "refusing" in proc.stderr and other in proc.stderr and pinned in proc.stderr, proc.stderr
    assert "pyproject.toml" in proc.stderr
    assert not (checkout / "build" / "worker").exists()  # nothing staged, not even the old bundle


def test_staging_refuses_a_tampered_copy_of_its_own_vendoring(checkout):
    """The vendor script's stamp matches the pin (so it does nothing), but the copy is another version."""
    _vendor(checkout, "1.0.0", stamped=True)
    proc = _stage(checkout)
    assert proc.returncode != 0
    assert "refusing" in proc.stderr and "1.0.0" in proc.stderr, proc.stderr


@pytest.mark.parametrize("versions", [(), ("pinned", "1.0.0")], ids=["no-metadata", "two-copies"])
def test_staging_refuses_an_sdk_without_one_known_version(checkout, versions):
    _vendor(checkout, *(_pinned_version() if v == "pinned" else v for v in versions))
    proc = _stage(checkout)
    assert proc.returncode != 0
    assert "refusing" in proc.stderr and f"{len(versions)} METADATA files" in proc.stderr, proc.stderr
    assert not (checkout / "build" / "worker").exists()


def test_staging_refuses_a_pyproject_without_an_exact_pin(checkout):
    pyproject = checkout / "pyproject.toml"
    text = pyproject.read_text()
    pin = f"workers-runtime-sdk=={_pinned_version()}"
    assert pin in text
    pyproject.write_text(text.replace(pin, "workers-runtime-sdk>=1.9"))
    _vendor(checkout, _pinned_version())
    proc = _stage(checkout)
    assert proc.returncode != 0
    assert "must pin workers-runtime-sdk exactly once" in proc.stderr, proc.stderr
    assert not (checkout / "build" / "worker").exists()
