"""The package's layout stays readable: no module over 600 lines, no function over 90, no import
cycle between its modules nor between its packages (top-level folders and modules), no private
name imported from another module, every module named in docs/code-map.md, and no rank check in
the training loop's module (the rank is decided once, by the caller: see
kronos_mlflow/training/loop.py's docstring).

Read from the source (``ast``, and grimp under import-linter); nothing is imported, so this runs in a second or two.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kronos_mlflow"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 90
# Names whose presence means "am I rank 0?" is being asked (nanoGPT's master_process included).
RANK_FLAGS = {"is_main", "is_rank_zero", "master_process", "is_main_process"}


def _modules(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, packages named by their ``__init__.py``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _trees() -> dict[str, tuple[Path, ast.Module]]:
    return {name: (path, ast.parse(path.read_text(encoding="utf-8"), str(path))) for name, path in _modules().items()}


def _imports(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its body (function-local imports
    count: a lazy import still ties the two modules together)."""
    package = PACKAGE.name
    is_package = path.name == "__init__.py"
    deps: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            deps.update(alias.name for alias in node.names if alias.name.split(".")[0] == package)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != package:
                continue
            subs = {f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known}
            # ``from . import checkpoint`` imports the submodule itself; from inside the package
            # it needs nothing of the package's ``__init__`` (already running, or done)
            if not (name.startswith(target + ".") and len(subs) == len(node.names)):
                deps.add(target)
            deps.update(subs)
    return {d for d in deps if d in known and d != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _rank_checks(tree: ast.Module) -> list[tuple[int, str]]:
    """Comparisons of a rank with a number (``rank == 0``, ``0 != info.rank``...) and any use of
    a main-process flag. Docstrings and comments may talk about ranks; code may pass them on."""
    def is_rank(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name == "rank" or name.endswith("_rank")

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(is_rank(o) for o in operands) and any(isinstance(o, ast.Constant) for o in operands):
                hits.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Name) and node.id in RANK_FLAGS:
            hits.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in RANK_FLAGS:
            hits.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.arg) and node.arg in RANK_FLAGS:
            hits.append((node.lineno, node.arg))
    return sorted(hits)


def test_no_module_is_over_600_lines():
    long = {name: n for name, path in _modules().items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them where their concerns part): {long}"


def test_no_function_is_over_90_lines():
    long = []
    for name, (_, tree) in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_import_cycle_inside_the_package():
    trees = _trees()
    known = set(trees)
    graph = {name: _imports(name, path, tree, known) for name, (path, tree) in trees.items()}
    assert "kronos_mlflow.training.checkpoint" in graph["kronos_mlflow.training.loop"]  # the graph sees imports at all
    assert not _cycles(graph), f"import cycles between modules: {_cycles(graph)}"


#: What the top level of the package may hold besides packages.
TOP_LEVEL_FILES = {"__init__.py", "__main__.py", "errors.py"}


def test_the_top_level_holds_packages():
    """Every module sits in a package named for its role (docs/code-map.md); the top level keeps
    only the package's own ``__init__``, ``__main__`` and ``errors``."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in TOP_LEVEL_FILES)
    assert not loose, f"modules at the top of kronos_mlflow/ (move each into the package of its role): {loose}"
    bare = sorted(d.name for d in PACKAGE.iterdir() if d.is_dir() and d.name != "__pycache__"
                  and not (d / "__init__.py").exists())
    assert not bare, f"folders of kronos_mlflow/ that are not packages: {bare}"


def test_every_package_says_what_it_is_for():
    """Each package's ``__init__`` docstring says what it is for and what it may import."""
    silent = [str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.glob("*/__init__.py")
              if "import" not in (ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "")]
    assert not silent, f"package docstrings that do not say what the package may import: {silent}"


def _lint_imports():
    """import-linter's contracts of pyproject.toml (the layers of docs/code-map.md) checked on
    the package: the report, and whether every contract was kept."""
    import contextlib
    import io

    from importlinter.application import use_cases
    from importlinter.configuration import configure

    configure()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        kept = use_cases.lint_imports(config_filename=str(PACKAGE.parent / "pyproject.toml"), cache_dir=None,
                                      no_logo=True)
    return out.getvalue(), kept


def test_imports_follow_the_layers():
    """A package imports only the packages below it (pyproject.toml, ``[tool.importlinter]``;
    the picture in docs/code-map.md), and the model, data, config and process packages never
    import MLflow, Comet or Optuna. ``lint-imports`` prints the same report."""
    report, kept = _lint_imports()
    assert "Analyzed" in report  # the contracts ran on the package
    assert kept, report[report.find("Broken contracts"):] or report


def test_the_layers_are_those_the_code_map_draws():
    """docs/code-map.md's layer picture lists the contract's layers, top to bottom."""
    import re
    import tomllib

    layers = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))
    layers = layers["tool"]["importlinter"]["contracts"][0]["layers"]
    wanted = [sorted(n.strip().removeprefix("kronos_mlflow.") for n in layer.split("|")) for layer in layers]
    text = (PACKAGE.parent / "docs" / "code-map.md").read_text(encoding="utf-8")
    picture = text[text.index("## The layers"):].split("```")[1]
    drawn = [sorted(re.findall(r"[a-z_]+", line.split("#")[0])) for line in picture.strip().splitlines()
             if line.split("#")[0].strip()]
    assert drawn == wanted, f"docs/code-map.md draws {drawn}; pyproject.toml's contract has {wanted}"


def test_no_private_name_is_imported_from_another_module():
    found = []
    for name, (_, tree) in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGE.name)):
                found += [f"{name}:{node.lineno} imports {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, f"private names imported across modules (make them public or keep them home): {found}"


def _own_function_imports(tree: ast.Module):
    """The imports of the package's own modules (relative, or ``kronos_mlflow...``) made inside a
    function, each with that function."""
    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else function
            if function is not None and isinstance(child, ast.ImportFrom) and (
                    child.level or (child.module or "").split(".")[0] == PACKAGE.name):
                yield child, function
            elif function is not None and isinstance(child, ast.Import) and any(
                    a.name.split(".")[0] == PACKAGE.name for a in child.names):
                yield child, function
            yield from walk(child, inner)
    yield from walk(tree, None)


def test_own_imports_are_at_module_level_or_say_why():
    """The package's own modules are imported at module level; an import left inside a function
    says why on its line (``# lazy: torch``: what it would load when the module is imported, on a
    path such as ``kronos-mlflow <cmd> --help`` that must stay light). One such comment covers the
    rest of that function's own imports."""
    bare = []
    for name, (path, tree) in _trees().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        explained = set()
        for node, function in _own_function_imports(tree):
            said = any("# lazy:" in line for line in lines[node.lineno - 1:node.end_lineno])
            if said:
                explained.add(id(function))
            elif id(function) not in explained:
                bare.append(f"{name}:{node.lineno} {lines[node.lineno - 1].strip()}")
    assert not bare, f"function-level imports of the package's own modules without '# lazy: <why>': {bare}"


def test_own_function_import_detection():
    tree = ast.parse("import os\nfrom . import a\ndef f():\n    import json\n    from .b import c\n"
                     "    import kronos_mlflow.d\n    from mlflow import e\n")
    assert [node.lineno for node, _ in _own_function_imports(tree)] == [5, 6]


def test_the_code_map_names_every_module():
    """docs/code-map.md names each module (by its path, or by its bare name in its folder's row),
    and every ``kronos_mlflow/...`` path it names exists."""
    import re

    text = (PACKAGE.parent / "docs" / "code-map.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([A-Za-z_][\w]*)(?:\.py|/)?`", text))
    paths = set(re.findall(r"kronos_mlflow/[\w/]*(?:\.py)?", text))
    missing = []
    for name, path in _modules().items():
        rel = path.relative_to(PACKAGE.parent).as_posix()
        stem = path.parent.name if path.name == "__init__.py" and path.parent != PACKAGE else path.stem
        if rel in paths or rel.removesuffix("/__init__.py") + "/" in paths or stem in named:
            continue
        missing.append(rel)
    assert not missing, f"modules docs/code-map.md does not name: {missing}"
    gone = [p for p in paths if not (PACKAGE.parent / p.rstrip("/")).exists()]
    assert not gone, f"docs/code-map.md names paths that do not exist: {gone}"


def test_the_loop_module_has_no_rank_check():
    tree = ast.parse((PACKAGE / "training" / "loop.py").read_text(encoding="utf-8"))
    assert not _rank_checks(tree), (
        f"kronos_mlflow/training/loop.py decides ranks at {_rank_checks(tree)}; decide once in the caller "
        "(train.py, build_tracking) and pass a Console, RunFiles and logger in")


#: What a command line names: the ``python -m`` modules and the launcher's helper flag.
COMMAND_NAMES = {"kronos_mlflow", "kronos_mlflow.train", "kronos_mlflow.launch", "kronos_mlflow.train_predictor",
                 "--keep-killed-after"}


def test_command_lines_are_built_where_the_commands_live():
    """Only kronos_mlflow/cli/commands.py spells the project's commands as strings: the workflows,
    tracking and runtime get their child processes' command lines handed down (``args.commands``)."""
    spelled = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value!r}"
               for path in sorted(PACKAGE.rglob("*.py")) if path != PACKAGE / "cli" / "commands.py"
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, ast.Constant) and node.value in COMMAND_NAMES]
    assert not spelled, f"command names spelled outside kronos_mlflow/cli/commands.py: {spelled}"


@pytest.mark.parametrize("source, hits", [
    ("main = rank == 0", 1),
    ("if 0 != info.rank: pass", 1),
    ("if dist.is_main: pass", 1),
    ("loader = train_loader_for(ds, config, rank, world_size)", 0),
    ('"""every rank runs the same code; rank 0 writes"""', 0),
])
def test_rank_check_detection(source, hits):
    assert len(_rank_checks(ast.parse(source))) == hits


def test_cycle_detection():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
