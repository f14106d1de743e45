"""Mutation testing for Flarebox's decision modules: `make mutate` (see the README's "Mutation testing").

    .venv/bin/python scripts/mutate.py [--jobs N] [--tests SELECTION ...] MODULE.py ...

Each module (a file path) is parsed, and every mutant below is made from its AST, one at a time: a comparison
flipped (`<` ↔ `<=`, `==` ↔ `!=`, `in` ↔ `not in`, …), `and` ↔ `or`, an `if`/`while`/conditional negated, a `not`
removed, an int constant ±1, True ↔ False, `+` ↔ `-`, one simple statement replaced by `pass`, one member dropped
from a set/list/tuple/dict literal. Each mutant runs the module's tests (the --tests selection, else the table
below) in a fresh pytest process with a timeout. The source tree is never modified: the mutated source is written
to a temporary directory and served in place of the module by an import hook (a sitecustomize on PYTHONPATH), so
the supervisor processes the tests start see the mutant too, and other work in the tree is undisturbed.

A mutant is `killed` when the tests fail, `timeout` when they run past the limit (counted as killed: the tests
noticed), `survived` when they pass. A line ending in `# pragma: no mutate` is skipped. The score is
(killed + timeout) / mutants. Survivors are listed with their line: each is a missing test, or an equivalent mutant
(no behaviour can tell it apart) to be explained or marked.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# module file (relative to the repo) -> the tests that cover it (used when --tests is not given)
DEFAULT_TESTS: dict[str, list[str]] = {
    "src/protocol/limits.py": ["tests/wire", "tests/docs/test_protocol_docs.py"],
    "src/protocol/": [
        "tests/wire",
        "tests/unit/test_edge_routing.py",
        "tests/unit/test_edge_queries.py",
        "tests/unit/test_operations.py",
    ],
    "src/worker/": [
        "tests/unit/test_edge_routing.py",
        "tests/unit/test_edge_auth.py",
        "tests/unit/test_edge_queries.py",
        "tests/unit/test_edge_keys.py",
        "tests/unit/test_edge_deployment_routes.py",
        "tests/unit/test_authorize.py",
        "tests/unit/test_operations.py",
    ],
    "src/directory/": [
        "tests/unit/test_directory.py",
        "tests/unit/test_edge_keys.py",
        "tests/unit/test_edge_deployment_routes.py",
    ],
    "src/durable/retention.py": ["tests/unit/test_retention.py", "tests/unit/test_retention_edges.py"],
    "src/durable/": ["tests/unit"],
    "container/supervisor/journal.py": [
        "tests/supervisor/test_journal_output_units.py",
        "tests/supervisor/test_follow_and_fds.py",
        "tests/supervisor/test_reattach.py",
        "tests/supervisor/test_exec.py",
    ],
    "container/supervisor/output.py": [
        "tests/supervisor/test_journal_output_units.py",
        "tests/supervisor/test_output_pipe.py",
        "tests/supervisor/test_follow_and_fds.py",
        "tests/supervisor/test_exec.py",
        "tests/supervisor/test_background.py",
    ],
    "container/supervisor/": ["tests/supervisor"],
    "plugin/config.py": ["tests/client/test_config.py", "tests/client/test_config_edges.py"],
    "plugin/": ["tests/client"],
}
DEFAULT_MODULES = [
    "src/protocol/validate.py",
    "src/protocol/limits.py",
    "src/worker/prepare.py",
    "src/worker/query.py",
    "src/worker/routes.py",
    "src/worker/edge.py",
    "src/worker/auth.py",
    "src/worker/authorize.py",
    "src/protocol/keys.py",
    "src/directory/directory.py",
    "src/durable/state.py",
    "src/durable/retention.py",
    "src/durable/ledger.py",
    "src/durable/schedule.py",
    "container/supervisor/journal.py",
    "container/supervisor/output.py",
    "plugin/config.py",
]

# The import hook, written as sitecustomize.py into a directory put first on PYTHONPATH.
HOOK = """
import importlib.util, os, sys
_name = os.environ.get("FLAREBOX_MUTANT_MODULE")
_file = os.environ.get("FLAREBOX_MUTANT_FILE")
if _name and _file:
    class _MutantFinder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            if fullname != _name:
                return None
            try:
                open(_file + ".loaded", "a").close()
            except OSError:
                pass
            return importlib.util.spec_from_file_location(fullname, _file)
    sys.meta_path.insert(0, _MutantFinder)
"""

COMPARE_SWAPS = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult, ast.Div: ast.Mult}
TYPE_NAMES = frozenset(
    {
        "Callable",
        "Awaitable",
        "Iterable",
        "Iterator",
        "AsyncIterator",
        "Mapping",
        "Sequence",
        "Optional",
        "Union",
        "Generator",
        "dict",
        "list",
        "tuple",
        "set",
        "frozenset",
        "type",
    }
)
DELETABLE = (
    ast.Expr,
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Return,
    ast.Raise,
    ast.Continue,
    ast.Break,
    ast.Delete,
    ast.Assert,
)


@dataclass(frozen=True)
class Mutant:
    index: int  # position of the node in ast.walk order
    kind: str
    arg: int
    line: int
    description: str


def module_name(path: Path) -> str:
    """The import name of a module file, from pyproject's [tool.setuptools] package-dir."""
    rel = path.resolve().relative_to(ROOT)
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(package_dir.items(), key=lambda kv: -len(kv[1])):
        if name and rel.is_relative_to(folder):
            parts = [name, *rel.relative_to(folder).with_suffix("").parts]
            break
    else:
        parts = list(rel.relative_to(package_dir.get("", ".")).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes never mutated: docstrings and type expressions (no behaviour depends on them)."""
    skip: set[int] = set()

    def mark(node):
        if node is not None:
            skip.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                mark(first)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mark(node.returns)
        if isinstance(node, ast.arg):
            mark(node.annotation)
        if isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        if isinstance(node, ast.Subscript) and _name_of(node.value) in TYPE_NAMES:
            mark(node)  # a type expression outside an annotation (an alias such as Callable[[A, B], C])
    return skip


def _name_of(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def enumerate_mutants(source: str) -> list[Mutant]:
    tree = ast.parse(source)
    lines = source.splitlines()
    skip = _skipped_nodes(tree)
    mutants: list[Mutant] = []
    for index, node in enumerate(ast.walk(tree)):
        line = getattr(node, "lineno", 0)
        if id(node) in skip or (line and lines[line - 1].rstrip().endswith("# pragma: no mutate")):
            continue

        def add(kind, arg, description, node=node, index=index, line=line):
            mutants.append(Mutant(index, kind, arg, getattr(node, "lineno", line), description))

        if isinstance(node, ast.Compare):
            for j, op in enumerate(node.ops):
                if type(op) in COMPARE_SWAPS:
                    add("compare", j, f"{type(op).__name__} -> {COMPARE_SWAPS[type(op)].__name__}")
        elif isinstance(node, ast.BoolOp):
            add("boolop", 0, "and <-> or")
        elif isinstance(node, ast.BinOp) and type(node.op) in BINOP_SWAPS:
            add("binop", 0, f"{type(node.op).__name__} -> {BINOP_SWAPS[type(node.op)].__name__}")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            add("drop_not", 0, "`not` removed")
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            add("const", 0, f"{node.value} -> {not node.value}")
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            add("const", 1, f"{node.value} -> {node.value + 1}")
            add("const", -1, f"{node.value} -> {node.value - 1}")
        elif isinstance(node, (ast.Set, ast.List, ast.Tuple)) and len(node.elts) >= 2:
            if not isinstance(getattr(node, "ctx", None), (ast.Store, ast.Del)):
                for j, elt in enumerate(node.elts):
                    add("drop_elt", j, f"member {ast.unparse(elt)[:40]} dropped")
        elif isinstance(node, ast.Dict) and len(node.keys) >= 2:
            for j, key in enumerate(node.keys):
                add("drop_elt", j, f"entry {ast.unparse(key)[:40] if key is not None else '**'} dropped")
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            add("negate", 0, "condition negated")
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list):
                continue
            for j, stmt in enumerate(stmts):
                if (
                    isinstance(stmt, DELETABLE)
                    and id(stmt) not in skip
                    and not (stmt.lineno and lines[stmt.lineno - 1].rstrip().endswith("# pragma: no mutate"))
                ):
                    code = ast.unparse(stmt).splitlines()[0][:50]
                    mutants.append(Mutant(index, f"delete:{field}", j, stmt.lineno, f"statement deleted: {code}"))
    return mutants


def apply(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    node = list(ast.walk(tree))[mutant.index]
    if mutant.kind == "compare":
        node.ops[mutant.arg] = COMPARE_SWAPS[type(node.ops[mutant.arg])]()
    elif mutant.kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif mutant.kind == "binop":
        node.op = BINOP_SWAPS[type(node.op)]()
    elif mutant.kind == "drop_not":
        _replace(tree, node, node.operand)
    elif mutant.kind == "const":
        node.value = (not node.value) if mutant.arg == 0 else node.value + mutant.arg
    elif mutant.kind == "drop_elt":
        if isinstance(node, ast.Dict):
            del node.keys[mutant.arg], node.values[mutant.arg]
        else:
            del node.elts[mutant.arg]
    elif mutant.kind == "negate":
        node.test = ast.UnaryOp(ast.Not(), node.test)
    elif mutant.kind.startswith("delete:"):
        getattr(node, mutant.kind.split(":", 1)[1])[mutant.arg] = ast.Pass()
    else:
        raise ValueError(mutant.kind)
    return ast.unparse(ast.fix_missing_locations(tree))


def _replace(tree: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is old:
                setattr(parent, field, new)
                return
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if item is old:
                        value[i] = new
                        return
    raise ValueError("node not found")


def run_tests(tests: list[str], module: str, source: str, workdir: Path, timeout: float | None) -> tuple[str, float]:
    """Run the tests with `source` served as `module`: ('passed' | 'failed' | 'timeout' | 'not-loaded', seconds)."""
    workdir.mkdir(parents=True)
    mutant_file = workdir / (module.rsplit(".", 1)[-1] + ".py")
    mutant_file.write_text(source)
    hook_dir = workdir / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    env = dict(
        os.environ, FLAREBOX_MUTANT_MODULE=module, FLAREBOX_MUTANT_FILE=str(mutant_file), PYTHONDONTWRITEBYTECODE="1"
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook_dir), env.get("PYTHONPATH")]))
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "--no-header",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        *tests,
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the pytest process group it started (its own session): nothing else
        proc.wait()
        return "timeout", time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    elapsed = time.monotonic() - started
    if not Path(str(mutant_file) + ".loaded").exists():
        return "not-loaded", elapsed
    return ("passed" if code == 0 else "failed"), elapsed


def tests_for(path: Path) -> list[str]:
    rel = path.resolve().relative_to(ROOT).as_posix()
    for prefix in sorted(DEFAULT_TESTS, key=len, reverse=True):
        if rel == prefix or (prefix.endswith("/") and rel.startswith(prefix)):
            return DEFAULT_TESTS[prefix]
    raise SystemExit(f"no default tests for {rel}: give --tests")


def mutate_module(path: Path, tests: list[str], jobs: int, tmp: Path, show_all: bool) -> tuple[int, int, int]:
    module = module_name(path)
    source = path.read_text()
    mutants = enumerate_mutants(source)
    baseline_source = ast.unparse(ast.parse(source))
    outcome, seconds = run_tests(tests, module, baseline_source, tmp / "baseline", None)
    rel = path.resolve().relative_to(ROOT)
    if outcome != "passed":
        print(f"{rel}: the tests do not pass on the unmutated module ({outcome}): {' '.join(tests)}", flush=True)
        return 0, 0, 0
    timeout = max(10.0, 3 * seconds + 5)
    seen: set[str] = {baseline_source}
    work: list[tuple[Mutant, str]] = []
    for mutant in mutants:
        mutated = apply(source, mutant)
        if mutated not in seen:  # the same program twice (or the original) is not a new mutant
            seen.add(mutated)
            work.append((mutant, mutated))
    print(
        f"{rel} ({module}): {len(work)} mutants, tests {' '.join(tests)} "
        f"(baseline {seconds:.1f}s, timeout {timeout:.0f}s)",
        flush=True,
    )

    def one(item):
        n, (mutant, mutated) = item
        return mutant, run_tests(tests, module, mutated, tmp / f"m{n}", timeout)[0]

    lines = source.splitlines()
    killed = survived = timed_out = 0
    with ThreadPoolExecutor(jobs) as pool:
        for mutant, result in pool.map(one, enumerate(work)):
            if result == "failed":
                killed += 1
            elif result == "timeout":
                timed_out += 1
            else:
                survived += 1
            if result not in ("failed", "timeout") or show_all:
                status = "SURVIVED" if result == "passed" else result.upper()
                print(
                    f"  {status} {rel}:{mutant.line}: {mutant.description}  | {lines[mutant.line - 1].strip()[:90]}",
                    flush=True,
                )
    total = killed + survived + timed_out
    score = 100 * (killed + timed_out) / total if total else 100.0
    print(f"{rel}: killed {killed}, survived {survived}, timed out {timed_out} of {total}: {score:.1f}%", flush=True)
    return killed, survived, timed_out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="module files (default: the decision modules)")
    parser.add_argument("--tests", nargs="+", help="pytest selection (default: the table in this script)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--list", action="store_true", help="only list the mutants")
    parser.add_argument("--all", action="store_true", help="print killed mutants too")
    args = parser.parse_args(argv)
    paths = [Path(m) for m in (args.modules or [str(ROOT / m) for m in DEFAULT_MODULES])]
    if args.list:
        for path in paths:
            for mutant in enumerate_mutants(path.read_text()):
                print(f"{path}:{mutant.line}: {mutant.description}")
        return 0
    totals = [0, 0, 0]
    tmp = Path(tempfile.mkdtemp(prefix="flarebox-mutate-"))
    try:
        for n, path in enumerate(paths):
            counts = mutate_module(path, args.tests or tests_for(path), args.jobs, tmp / str(n), args.all)
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    killed, survived, timed_out = totals
    total = sum(totals)
    if len(paths) > 1 and total:
        print(
            f"total: killed {killed}, survived {survived}, timed out {timed_out} of {total}: "
            f"{100 * (killed + timed_out) / total:.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
