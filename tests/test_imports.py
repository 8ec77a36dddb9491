"""The package's imports run one way: no module imports, directly or through others, a module
that imports it (function-level imports included, since they run too)."""

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _modules() -> dict[str, Path]:
    mods = {}
    for top, prefix in ((ROOT / "klrelease", ("klrelease",)), (ROOT / "solvers",
                                                                ("klrelease", "solvers"))):
        for p in top.rglob("*.py"):
            parts = prefix + p.relative_to(top).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = p
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> every module it imports, and the packages whose ``__init__`` that runs
    (the importer's own ancestors excluded: they are initialised before it)."""
    mods = _modules()
    g: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                parts = t.split(".")
                for i in range(1, len(parts) + 1):
                    dep = ".".join(parts[:i])
                    if dep in mods and dep != name and dep not in ancestors:
                        g[name].add(dep)
    return g


def _reaches(g, a, b) -> bool:
    seen, todo = set(), [a]
    while todo:
        m = todo.pop()
        if m == b:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(g[m])
    return False


def test_the_import_graph_has_no_cycle():
    g = import_graph()
    assert sum(map(len, g.values())) > 100  # the graph was read
    try:
        list(TopologicalSorter(g).static_order())
    except CycleError as exc:
        raise AssertionError(f"import cycle: {' -> '.join(exc.args[1])}") from None


def test_the_layers_named_in_the_docs_run_one_way():
    g = import_graph()
    for low, high in (("klrelease.rows", "klrelease.domain"), ("klrelease.domain",
                      "klrelease.data"), ("klrelease.data", "klrelease.statistics"),
                      ("klrelease.stream.moments", "klrelease.statistics")):
        assert _reaches(g, high, low)
        assert not _reaches(g, low, high)
