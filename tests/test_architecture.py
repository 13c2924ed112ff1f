"""How the code is put together, checked on its source: folders by owner, stacked in LAYERS, whose arrows only point
down (every import counted, inside functions and under TYPE_CHECKING too); settings import nothing of specdemo; few
modules loose at the root; strategies decide, not their names; no import cycle, counting the imports inside functions,
the drafters the package discovers and the modules the bench's registry names; the engine knows nothing of the page."""

import ast
from pathlib import Path

from specdemo.bench.settings import REGISTRY
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
    (its discovery imports them all), and the bench package → every module its REGISTRY names (bench.found imports
    them)."""
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
    graph["specdemo.bench"] |= {"specdemo.bench" + ref.partition(":")[0] for section in REGISTRY
                                for ref in (section.run, *(part for _, part in section.report), *section.plots)}
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


def test_no_import_cycle_counting_function_level_imports_the_drafters_discovery_and_the_bench_registry():
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


# The packages from the bottom up: a module may import its own package and those below it, never one above. Each
# package's __init__.py says what it owns and may import; this table is the rule those sentences state.
LAYERS = (
    ("specdemo.settings", "specdemo.errors", "specdemo.text", "specdemo.strict_json", "specdemo.names"),  # the leaves
    ("specdemo.host",),  # this machine and stack as facts: CPU, memory bound, compile configuration
    ("specdemo.models",),  # a source turned into a compiled model
    ("specdemo.decoding",),  # one lane's decoding: loops, events, acceptance, drafters, costs, planner, K rules
    ("specdemo.results",),  # what a run's records mean: figures, parting, failures, counterfactual, the run file
    ("specdemo.learning",),  # what this machine learns: profile, measuring, warm-up, tune, races, disk
    ("specdemo.run",),  # the engine, one side-by-side run, GenAI's lane
    ("specdemo.serve",),  # serving strangers on one machine: the line, engines, runs, background work, visitors
    ("specdemo.ui",),  # the page
    ("specdemo.bench",),  # the benchmark (it measures the page too)
    ("specdemo.cli",),  # the command line
    ("specdemo.__main__",),
)
LEAVES = LAYERS[0]  # import nothing of specdemo at all
MAX_AT_ROOT = 12  # .py files directly in specdemo/, __init__.py and __main__.py included


def owner(module: str) -> str | None:
    """The entry of LAYERS that `module` belongs to (the longest that is it or a package above it)."""
    names = [name for layer in LAYERS for name in layer if module == name or module.startswith(name + ".")]
    return max(names, key=len, default=None)


def level(module: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if owner(module) in layer), None)


def imported(module: str, source: str, is_package: bool = False) -> set[str]:
    """Every specdemo module or name `source` (the text of `module`) imports, anywhere in it: at the top, inside
    functions, under TYPE_CHECKING; relative imports resolved."""
    found = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found |= {f"{base}.{alias.name}" for alias in node.names} if base == "specdemo" else {base}
    return {name for name in found if name == "specdemo" or name.startswith("specdemo.")}


def upward_arrows(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """"importer -> imported" for every import of a module from a layer above its own, or of or by a module LAYERS does
    not place; `sources`: module → (its source, whether it is a package's __init__.py)."""
    found = []
    for module, (source, is_package) in sorted(sources.items()):
        if module == "specdemo":
            continue
        for target in sorted(imported(module, source, is_package)):
            if owner(target) == owner(module):
                continue
            low, high = level(target), level(module)
            if low is None or high is None or low >= high or module in LEAVES:
                found.append(f"{module} -> {target}")
    return found


def package_sources() -> dict[str, tuple[str, bool]]:
    return {name: (path.read_text(), path.name == "__init__.py") for name, path in modules().items()}


def test_every_arrow_points_down_the_layers_counting_imports_inside_functions():
    assert upward_arrows(package_sources()) == []


def test_the_layer_check_catches_an_added_upward_arrow_even_inside_a_function():
    sources = package_sources()
    source, is_package = sources["specdemo.decoding.loops"]
    sources["specdemo.decoding.loops"] = (source + "\n\ndef peek():\n    from specdemo.run import engine\n", is_package)
    sources["specdemo.models.probe"] = ("from ..results.metrics import summarize\n", False)  # relative, and up
    sources["specdemo.settings"] = (sources["specdemo.settings"][0] + "\nimport specdemo.host.machine\n", False)
    assert upward_arrows(sources) == ["specdemo.decoding.loops -> specdemo.run",
                                      "specdemo.models.probe -> specdemo.results.metrics",
                                      "specdemo.settings -> specdemo.host.machine"]


def reached(start: str) -> set[str]:
    """Every specdemo module `start` imports, and what those import, on down (imports inside functions counted)."""
    found = modules()
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        for target in imported(module, found[module].read_text(), found[module].name == "__init__.py"):
            target = next((name for name in (target, target.rpartition(".")[0]) if name in found), None)
            if target is not None and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_run_file_and_its_record_reach_nothing_of_run():
    """A saved run is read, written and shown from its Record alone: no engine, no model, nothing of run/."""
    for module in ("specdemo.results.runfile", "specdemo.results.record"):
        assert [name for name in reached(module) if name.startswith("specdemo.run")] == [], module


def test_every_module_has_a_place_in_the_layers():
    assert [name for name in modules() if name != "specdemo" and level(name) is None] == []


def test_settings_import_nothing_of_specdemo():
    assert imported("specdemo.settings", (PACKAGE / "settings.py").read_text()) == set()


def test_few_modules_sit_loose_at_the_root():
    assert len(list(PACKAGE.glob("*.py"))) <= MAX_AT_ROOT


def test_each_package_says_what_it_owns_and_may_import():
    for init in PACKAGE.glob("*/__init__.py"):
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "May import" in docstring or "may import" in docstring, init


def test_the_lane_names_are_spelled_once():
    """specdemo/names.py defines them; everyone else says AUTOREGRESSIVE and SPECULATIVE (an f-string's text aside)."""
    names = {"autoregressive", "speculative"}
    offenders = []
    for name, path in modules().items():
        if name == "specdemo.names":
            continue
        tree = ast.parse(path.read_text())
        in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
        offenders += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and node.value in names and id(node) not in in_fstrings]
    assert offenders == [], "use specdemo.names:\n" + "\n".join(offenders)


def test_no_package_hides_a_module_of_its_own_behind_an_imported_name():
    """A package's __init__.py that binds `memory` to another module makes `from package import memory` return that
    one, whatever the package's own memory.py holds."""
    hidden = []
    for init in PACKAGE.rglob("__init__.py"):
        own = {p.stem for p in init.parent.glob("*.py")} | {p.parent.name for p in init.parent.glob("*/__init__.py")}
        package = ".".join(init.parent.relative_to(PACKAGE.parent).parts)
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    source = f"{node.module}.{alias.name}" if isinstance(node, ast.ImportFrom) else alias.name
                    if bound in own and source != f"{package}.{bound}":
                        hidden.append(f"{package}: {bound} is {source}")
    assert hidden == []


def engine_handling(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every place a module is handed an engine or writes into one: a parameter named `engine`, a
    setattr() call, an assignment to an attribute of a name `engine`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [(node.lineno, "handed an engine") for a in arguments if a.arg == "engine"]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            found.append((node.lineno, "setattr"))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [(node.lineno, "assigns on an engine") for t in targets for n in ast.walk(t)
                      if isinstance(n, ast.Attribute) and getattr(n.value, "id", None) == "engine"]
    return found


def test_learning_takes_values_and_returns_results_never_the_engine():
    """learning/ imports nothing of specdemo.run, is handed no engine and writes into none: it is given runtimes, the
    profile, keys and examples, keeps what it learns in the profile and returns what the engine holds, and the engine
    assigns it."""
    offenders = []
    for name, path in modules().items():
        if not name.startswith("specdemo.learning"):
            continue
        source, where = path.read_text(), path.relative_to(PACKAGE.parent)
        offenders += [f"{where}: imports {target}" for target in imported(name, source, path.name == "__init__.py")
                      if target.startswith("specdemo.run")]
        offenders += [f"{where}:{line}: {what}" for line, what in engine_handling(ast.parse(source))]
    assert offenders == []


def test_the_engine_check_sees_an_engine_handed_in_and_written_into():
    tree = ast.parse('def warm(engine, k):\n    engine.noise = 1\n    setattr(engine, "keys", 2)\n'
                     'steps = [lambda engine: None]\n')
    assert engine_handling(tree) == [(1, "handed an engine"), (2, "assigns on an engine"), (3, "setattr"),
                                     (4, "handed an engine")]
# What a module-level name of the page or its serving may be bound to a call of: none of these, whose instances hold
# state that changes (a lock, a line, a registry); such state is the Server's (serve/server.py), made in app.py.
STATEFUL = {"Lock", "RLock", "Event", "Condition", "Semaphore", "Thread", "dict", "list", "set", "OrderedDict", "deque",
            "RunQueue", "Memories", "Engines", "Runs", "Background", "Server"}


def module_state(source: str) -> list[str]:
    """What in `source` is state of the module's own: a `global` statement, a module-level name that is not a constant
    (UPPER_CASE, or a CamelCase type alias), or one bound to an empty dict, list or set (a registry to fill) or to a
    call of a STATEFUL type."""
    tree = ast.parse(source)
    found = [f"{node.lineno}: global {', '.join(node.names)}" for node in ast.walk(tree) if isinstance(node, ast.Global)]
    for node in tree.body:
        if not isinstance(node, (ast.Assign, ast.AnnAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for name in [n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)]:
            if not (name.lstrip("_").isupper() or name[0].isupper()):
                found.append(f"{node.lineno}: {name}")
        calls = [n for n in ast.walk(node.value) if isinstance(n, ast.Call)] if node.value is not None else []
        found += [f"{node.lineno}: {ast.unparse(call)[:40]}" for call in calls
                  if getattr(call.func, "id", getattr(call.func, "attr", "")) in STATEFUL]
        value = node.value
        if (isinstance(value, ast.Dict) and not value.keys) or (isinstance(value, (ast.List, ast.Set)) and not value.elts):
            found.append(f"{node.lineno}: {ast.unparse(value)}")
    return found


def test_the_page_and_its_serving_keep_no_state_in_modules_only_in_the_server():
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}" for name, path in modules().items()
                 if name.startswith(("specdemo.ui", "specdemo.serve")) for line in module_state(path.read_text())]
    assert offenders == [], "make it a field of the Server (serve/server.py):\n" + "\n".join(offenders)


def test_the_state_check_finds_a_registry_a_lock_and_a_global():
    source = ("import threading\nRUNS: dict = {}\n_LOCK = threading.Lock()\nline = None\nMAX = 3\n"
              "def start():\n    global line\n    line = 1\n")
    assert module_state(source) == ["7: global line", "2: {}", "3: threading.Lock()", "4: line"]
