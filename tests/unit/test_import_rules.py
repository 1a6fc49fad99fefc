"""The shape of the house, enforced: which package may import which (issue 9).

Every ``import`` and ``from ... import`` in a package's files counts, at any depth
(inside functions and ``TYPE_CHECKING`` blocks too), so an arrow the wrong way
fails here before it can land.

- ``schemas`` (the contract) imports nothing of ours but itself;
- ``kafka_settings`` (client config, topic layout) imports only the contract;
- ``producers`` (the client library) imports only the contract, ``kafka_settings`` and confluent-kafka;
- ``processor.core`` (the pure fold) imports only the contract, itself and pure libraries:
  no clock, randomness, environment, I/O, Kafka or SQL;
- ``logs`` (the port to a log and its two adapters, embedded and Kafka) imports only the contract,
  ``kafka_settings`` and confluent-kafka: its Kafka adapter builds its clients from ``kafka_settings.config``
  (the one place that says how a client connects, security settings included) and asks for watermarks through
  ``kafka_settings.topics``; never the fold, the runtime, the read side or the CLI;
- ``processor.runtime`` may import the core, ``logs`` and the client library (it publishes ticks), never the CLI
  or the read side, and reads a log only through ``logs`` (no Kafka client of its own);
- ``projections`` (the read side) imports the contract and ``logs``, never the fold or the CLI, and reads a log
  only through ``logs`` (no Kafka client, no SQL over the log's tables);
- no module outside ``logs`` runs SQL over the embedded log's tables;
- no package's modules import each other in a cycle.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("schemas", "kafka_settings", "logs", "producers", "processor", "projections", "gpufold", "tests", "bench")

# The standard-library modules the pure core may use: none of them reads the clock, the
# environment, randomness or does I/O.
PURE_STDLIB = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "dataclasses",
        "enum",
        "functools",
        "hashlib",
        "heapq",
        "itertools",
        "math",
        "operator",
        "re",
        "struct",
        "typing",
    }
)

RULES: dict[str, tuple[frozenset[str], bool]] = {
    # package -> (allowed packages of ours and third parties, whether any stdlib module is allowed)
    # mypy_extensions: only mypyc_attr, an annotation for the compiled build (build_config.py)
    "schemas": (frozenset({"schemas", "fastavro", "mypy_extensions"}), True),
    "kafka_settings": (frozenset({"kafka_settings", "schemas", "confluent_kafka"}), True),
    "producers": (frozenset({"producers", "schemas", "kafka_settings", "confluent_kafka"}), True),
    "processor.core": (frozenset({"processor.core", "schemas", "sortedcontainers", "mypy_extensions"}), False),
    # logs: kafka_settings and confluent_kafka for the Kafka adapter only (see the module docstring)
    "logs": (frozenset({"logs", "schemas", "kafka_settings", "confluent_kafka"}), True),
    "processor.runtime": (
        frozenset(
            {
                "processor",
                "logs",
                "schemas",
                "kafka_settings",
                "producers",
                "prometheus_client",
                "sortedcontainers",
            }
        ),
        True,
    ),
    "projections": (
        frozenset(
            {
                "projections",
                "logs",
                "schemas",
                "sqlalchemy",
                "alembic",
                "psycopg",
                "fastapi",
                "uvicorn",
                "pydantic",
                "starlette",
                "prometheus_client",
            }
        ),
        True,
    ),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def files_of(package: str) -> list[Path]:
    base = ROOT.joinpath(*package.split("."))
    return sorted(path for path in base.rglob("*.py") if "migrations" not in path.parts or package == "projections")


def imports_of(path: Path, *, names: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import statement of a file; with ``names``, also
    ``package.name`` for each name of a ``from package import name`` (a submodule when one exists:
    ``from processor.core import state`` imports the state module, not only the package)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" else module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            yield node.lineno, module
            if names:
                for alias in node.names:
                    yield node.lineno, f"{module}.{alias.name}"


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def is_stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def violations(package: str) -> list[str]:
    allowed, stdlib_ok = RULES[package]
    found = []
    for path in files_of(package):
        for line, module in imports_of(path):
            if any(within(module, ok) for ok in allowed):
                continue
            pure = module.split(".")[0] in PURE_STDLIB
            if is_stdlib(module) and (stdlib_ok or pure) and not any(within(module, ours) for ours in OURS):
                continue
            found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_imports_only_what_it_may(package: str) -> None:
    """Each package imports only the packages its rule allows."""
    assert violations(package) == []


def test_the_rules_catch_a_wrong_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A core module that reads the clock, or a contract module that imports the fold, is reported."""
    fake = tmp_path / "processor" / "core"
    fake.mkdir(parents=True)
    (fake / "sneaky.py").write_text("import time\nfrom processor.runtime.loop import Processor\n")
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "bad.py").write_text("def f():\n    from processor.core.fold import decide\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert violations("processor.core") == [
        "processor/core/sneaky.py:1 imports time",
        "processor/core/sneaky.py:2 imports processor.runtime.loop",
    ]
    assert violations("schemas") == ["schemas/bad.py:2 imports processor.core.fold"]


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for package in OURS[:7] for path in files_of(package)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, module in imports_of(path, names=True):
            # `from package import name` may name a submodule: count the deepest module that exists.
            while module and module not in modules:
                module = module.rpartition(".")[0]
            if module and module != name and not name.startswith(module + "."):
                targets.add(module)
        graph[name] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[str]:
    cycles = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*stack[stack.index(target) :], target]))
            elif target not in state:
                visit(target, [*stack, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_no_import_cycles() -> None:
    """No module imports itself back through others (state and fragmentation once did)."""
    assert find_cycles(import_graph()) == []


def test_a_cycle_through_from_package_import_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``from processor.core import state`` names the state module: a cycle through it is reported."""
    core = tmp_path / "processor" / "core"
    core.mkdir(parents=True)
    (tmp_path / "processor" / "__init__.py").write_text("")
    (core / "__init__.py").write_text("")
    (core / "state.py").write_text("from processor.core import fragmentation\n")
    (core / "fragmentation.py").write_text("from processor.core.state import ClusterState\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert find_cycles(import_graph()) == [
        "processor.core.fragmentation -> processor.core.state -> processor.core.fragmentation"
    ]


def test_the_client_library_does_not_load_the_scheduler() -> None:
    """Importing the producers loads neither the fold, its policies, sortedcontainers, the read side nor the CLI."""
    code = (
        "import sys, producers, producers.publisher, producers.outcomes\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('processor', 'projections', 'gpufold', 'sortedcontainers', 'sqlalchemy'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


def test_the_contract_loads_alone() -> None:
    """Importing every contract module loads nothing of ours outside ``schemas``."""
    names = [module_name(path) for path in files_of("schemas")]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('processor', 'projections', 'gpufold', 'producers', 'kafka_settings', 'sortedcontainers'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == ""


# The embedded log's tables (logs/embedded_format.py): SQL naming one of them outside ``logs`` bypasses the checks.
LOG_TABLE_SQL = re.compile(
    r'\b(FROM|INTO|UPDATE|JOIN|TABLE)\s+"?(records|consumer_offsets|ends|meta)\b"?', re.IGNORECASE
)


def raw_log_sql() -> list[str]:
    """``file:line`` of every string constant outside ``logs`` (and the tests) that runs SQL on the log's tables."""
    found = []
    for package in OURS:
        if package in ("logs", "tests"):
            continue
        for path in files_of(package):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and LOG_TABLE_SQL.search(node.value):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_only_logs_reads_the_log_tables() -> None:
    """No module outside ``logs`` runs SQL over the embedded log's tables (it would skip the CRC checks)."""
    assert raw_log_sql() == []


def test_raw_sql_over_the_log_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A projection module that selects from the log's ``records`` table is reported."""
    (tmp_path / "projections").mkdir()
    (tmp_path / "projections" / "sneaky.py").write_text(
        "def read(db):\n    return db.execute('SELECT value FROM records WHERE topic = ?', ('t',))\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert raw_log_sql() == ["projections/sneaky.py:2"]


def test_the_contract_names_no_module_of_the_fold() -> None:
    """schemas/ says nothing of who uses it: no processor module named in its code or docs (the compiled build's
    module list lives in build_config.py, beside setup.py)."""
    named = re.compile(r"\bprocessor[./][a-z_]")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted(ROOT.joinpath("schemas").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if named.search(line)
    ]
    assert found == []
