"""Instance types → resource limits, applied to each sandbox with cgroups where the host allows it.

| instance   | memory  | pids | CPU share (relative weight, like vCPUs) |
|------------|---------|------|-----------------------------------------|
| lite       | 256 MiB |  128 | 1/16                                    |
| standard-1 |   4 GiB | 1024 | 1/2                                     |
| standard-2 |   6 GiB | 2048 | 1                                       |
| standard-3 |   8 GiB | 3072 | 2                                       |
| standard-4 |  12 GiB | 4096 | 4                                       |

Memory follows Cloudflare's instance types. CPU is a relative share (cpu.shares / cpu.weight), not a hard cap, so
a lone workspace may use idle cores; under contention workspaces get CPU in proportion to their type.

cgroup v2 (`/sys/fs/cgroup/cgroup.controllers` exists): one group per sandbox under `/sys/fs/cgroup/flarebox`.
cgroup v1: one group per sandbox under the server's own group in each of the memory, pids and cpu hierarchies
(nested, so the server's own limits still cover its sandboxes). Both need root (or a delegated hierarchy); without
it sandboxes run unlimited and `limits_report()` says why.
"""

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from protocol import limits as protocol_limits

MiB = 1024 * 1024
GiB = 1024 * MiB
CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "flarebox"


@dataclass(frozen=True)
class InstanceLimits:
    memory_bytes: int
    pids: int
    cpus: float


INSTANCE_LIMITS: dict[str, InstanceLimits] = {
    "lite": InstanceLimits(256 * MiB, 128, 1 / 16),
    "standard-1": InstanceLimits(4 * GiB, 1024, 0.5),
    "standard-2": InstanceLimits(6 * GiB, 2048, 1),
    "standard-3": InstanceLimits(8 * GiB, 3072, 2),
    "standard-4": InstanceLimits(12 * GiB, 4096, 4),
}
assert set(INSTANCE_LIMITS) == set(protocol_limits.INSTANCE_TYPES)


def limits_for(instance: str) -> InstanceLimits:
    try:
        return INSTANCE_LIMITS[instance]
    except KeyError:
        raise ValueError(f"unknown instance type {instance!r}") from None


@dataclass
class SandboxGroup:
    """One sandbox's cgroup(s): a directory per hierarchy (one on v2, one per controller on v1)."""

    dirs: list[Path]

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in self.dirs:
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def read(self, name: str) -> str | None:
        """A control file's value, from whichever directory has it (e.g. `memory.limit_in_bytes`, `pids.max`)."""
        for d in self.dirs:
            path = d / name
            if path.exists():
                return path.read_text().strip()
        return None


class Cgroups:
    """Creates, fills and removes per-sandbox groups. Build with `Cgroups.detect()`; `None` means not enforceable."""

    def __init__(self, version: int, bases: dict[str, Path]):
        self.version = version
        self.bases = bases  # v2: {"": parent}; v1: {"memory": parent, "pids": parent, "cpu": parent}

    # ---- detection ----------------------------------------------------------------------------------------
    @classmethod
    def detect(cls, root: Path = CGROUP_ROOT) -> tuple["Cgroups | None", str]:
        """(manager, human-readable report). The manager is None when limits cannot be enforced here."""
        if os.geteuid() != 0:
            return None, "not enforced: the server is not root (cgroups need root or a delegated cgroup)"
        try:
            if (root / "cgroup.controllers").exists():
                manager = cls._detect_v2(root)
            else:
                manager = cls._detect_v1(root)
            manager._self_test()
        except (OSError, _Unsupported) as exc:
            return None, f"not enforced: {exc}"
        where = ", ".join(str(p) for p in manager.bases.values())
        return manager, f"memory, pids and CPU share per instance type via cgroup v{manager.version} ({where})"

    @classmethod
    def _detect_v2(cls, root: Path) -> "Cgroups":
        available = set((root / "cgroup.controllers").read_text().split())
        missing = {"memory", "pids"} - available
        if missing:
            raise _Unsupported(f"cgroup v2 lacks the {', '.join(sorted(missing))} controller(s)")
        wanted = [c for c in ("memory", "pids", "cpu") if c in available]
        parent = root / PARENT
        parent.mkdir(exist_ok=True)
        enable = " ".join("+" + c for c in wanted)
        (root / "cgroup.subtree_control").write_text(enable)
        (parent / "cgroup.subtree_control").write_text(enable)
        return cls(2, {"": parent})

    @classmethod
    def _detect_v1(cls, root: Path) -> "Cgroups":
        own = _own_v1_groups()
        bases: dict[str, Path] = {}
        for controller in ("memory", "pids", "cpu"):
            mount = root / controller
            if not (mount / "cgroup.procs").exists():
                if controller == "cpu":
                    continue  # CPU shares are a nicety; memory and pids are the limits that matter
                raise _Unsupported(f"no cgroup v1 {controller} hierarchy at {mount}")
            base = mount / own.get(controller, "").lstrip("/") / PARENT
            base.mkdir(parents=True, exist_ok=True)
            bases[controller] = base
        return cls(1, bases)

    def _self_test(self) -> None:
        group = self.create("selftest-" + str(os.getpid()), INSTANCE_LIMITS["lite"])
        self.remove(group)

    # ---- groups -------------------------------------------------------------------------------------------
    def create(self, name: str, lim: InstanceLimits) -> SandboxGroup:
        """Create (or reuse, after a crash) the group `name` and write its limits."""
        dirs = [base / name for base in self.bases.values()]
        for d in dirs:
            d.mkdir(exist_ok=True)
        group = SandboxGroup(dirs)
        self.kill(group)  # a leftover group from a crashed server may still hold processes
        if self.version == 2:
            d = dirs[0]
            (d / "memory.max").write_text(str(lim.memory_bytes))
            if (d / "memory.swap.max").exists():
                (d / "memory.swap.max").write_text("0")
            (d / "pids.max").write_text(str(lim.pids))
            if (d / "cpu.weight").exists():
                (d / "cpu.weight").write_text(str(max(1, min(10000, round(100 * lim.cpus)))))
        else:
            by_controller = dict(zip(self.bases, dirs, strict=True))
            memory = by_controller["memory"]
            (memory / "memory.limit_in_bytes").write_text(str(lim.memory_bytes))
            with contextlib.suppress(OSError):  # only with swap accounting
                (memory / "memory.memsw.limit_in_bytes").write_text(str(lim.memory_bytes))
            (by_controller["pids"] / "pids.max").write_text(str(lim.pids))
            if "cpu" in by_controller:
                (by_controller["cpu"] / "cpu.shares").write_text(str(max(2, round(1024 * lim.cpus))))
        return group

    def kill(self, group: SandboxGroup) -> None:
        """SIGKILL every process in the group (what is left of a sandbox after its bwrap died)."""
        if self.version == 2 and (group.dirs[0] / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (group.dirs[0] / "cgroup.kill").write_text("1")
            return
        for pid in group.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, group: SandboxGroup, wait: float = 5.0) -> None:
        """Kill what is left and remove the group's directories (retrying while the kernel reaps the dead)."""
        self.kill(group)
        deadline = time.monotonic() + wait
        for d in group.dirs:
            while d.exists():
                try:
                    d.rmdir()
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    self.kill(group)
                    time.sleep(0.02)


class _Unsupported(Exception):
    pass


def _own_v1_groups() -> dict[str, str]:
    """The server's own v1 group per controller, from /proc/self/cgroup (`4:memory:/some/path`)."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                for controller in parts[1].split(","):
                    own[controller] = parts[2]
    return own


def limits_report() -> str:
    """One line for `flarebox serve` to print at startup: are instance limits enforced here, and if not, why."""
    return Cgroups.detect()[1]
