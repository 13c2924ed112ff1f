"""How the code is put together, checked on its source: strategies decide, not their names; no import cycle, counting
the imports inside functions and the drafters the package discovers; the engine knows nothing of the page."""

import ast
from pathlib import Path

from specdemo.decoding.drafters import STRATEGIES

PACKAGE = Path(__file__).resolve().parent.parent / "specdemo"


def modules() -> dict[str, Path]:
    """Every module of specdemo by dotted name (a package by its own name, for its __init__.py)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def string_literals_compared(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, string) of every string constant that is an operand of a comparison (==, !=, in, not in, is), directly
    or inside a tuple, list or set operand, or the argument of a call to strategy()."""
    found = []

    def literals(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for element in node.elts:
                yield from literals(element)

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                found += [(c.lineno, c.value) for c in literals(operand)]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "strategy":
            found += [(c.lineno, c.value) for a in node.args for c in literals(a)]
    return found


def test_no_module_outside_the_drafters_decides_by_a_strategys_name():
    names = set(STRATEGIES)
    offenders = []
    for name, path in modules().items():
        if name.startswith("specdemo.decoding.drafters"):
            continue
        offenders += [f"{path.relative_to(PACKAGE.parent)}:{line}: {value!r}"
                      for line, value in string_literals_compared(ast.parse(path.read_text())) if value in names]
    assert offenders == [], "ask the Strategy instead:\n" + "\n".join(offenders)


def test_the_name_check_sees_a_comparison_with_a_name():
    tree = ast.parse('if settings.drafter == "model" or kind in ("hybrid", "x"):\n    strategy("prompt-lookup")\n')
    assert {value for _, value in string_literals_compared(tree)} >= {"model", "hybrid", "prompt-lookup"}


def runtime_nodes(tree: ast.AST):
    """Every node of `tree` but those under `if TYPE_CHECKING:` (imports for annotations, never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *runtime_nodes(child)])
            continue
        yield node
        yield from runtime_nodes(node)


def import_graph() -> dict[str, set[str]]:
    """Module → the specdemo modules it imports anywhere in its source (inside functions too; not for annotations
    alone, under TYPE_CHECKING), the parent packages an
    import runs first included (outside the importer's own package), and the drafters package → every module in it
    (its discovery imports them all)."""
    known = modules()
    graph = {name: set() for name in known}
    for name, path in known.items():
        own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in runtime_nodes(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for target in targets:
                while target:
                    if target in known and target != name and not own_package.startswith(target):
                        graph[name].add(target)
                    target = target.rpartition(".")[0]
    graph["specdemo.decoding.drafters"] |= {n for n in known if n.startswith("specdemo.decoding.drafters.")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_counting_function_level_imports_and_the_drafters_discovery():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_but_the_page_imports_gradio():
    for name, path in modules().items():
        if name.startswith("specdemo.ui"):
            continue
        imported = {alias.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Import)
                    for alias in node.names} | {node.module for node in ast.walk(ast.parse(path.read_text()))
                                                 if isinstance(node, ast.ImportFrom) and node.module}
        assert not any(m == "gradio" or m.startswith("gradio.") for m in imported), name
