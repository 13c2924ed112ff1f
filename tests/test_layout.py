"""Where a test lives says what it costs and what it tests: tests marked real_models, browser or slow live in
tests/integration/ and only they do (so the fast loop is `python -m pytest -q tests --ignore=tests/integration`), every
other folder under tests/ is named after the package of specdemo/ it mirrors, and no two test files share a name
(the folders are not packages, so pytest imports each file by its name alone). Read from the source, so the files
the fast loop leaves out are checked too."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PACKAGE = TESTS.parent / "specdemo"
MARKERS = {"real_models", "browser", "slow"}


def markers(node: ast.AST) -> set[str]:
    """The cost markers written in `node` (`@pytest.mark.slow`, `pytestmark = [pytest.mark.real_models, …]`)."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and n.attr in MARKERS
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"}


def marked_tests_of(path: Path) -> dict[str, set[str]]:
    """Each top-level test of the file (function or class) → its cost markers, the module's included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module = set().union(*(markers(n) for n in tree.body if isinstance(n, ast.Assign)
                           and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in n.targets)))
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    tests = [n for n in tree.body if isinstance(n, definitions) and n.name.lower().startswith("test")]
    return {n.name: module.union(*(markers(d) for d in n.decorator_list)) for n in tests}


def modules_of_tests() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def folders() -> list[Path]:
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("__", ".")))


def test_marked_tests_live_in_integration_and_only_they_do():
    misplaced = []
    for path in modules_of_tests():
        inside = path.parent.name == "integration"
        for name, marked in marked_tests_of(path).items():
            if bool(marked) != inside:
                misplaced.append(f"{path.relative_to(TESTS)}::{name} ({', '.join(sorted(marked)) or 'unmarked'})")
    assert misplaced == [], "marked tests belong in tests/integration/, unmarked ones outside it"


def test_each_folder_mirrors_a_package_of_specdemo():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    mirroring_nothing = {f.name for f in folders()} - packages - {"integration"}
    assert mirroring_nothing == set(), "a folder under tests/ is named after the package of specdemo/ it tests"


def test_no_two_test_files_share_a_name():
    names = [p.name for p in modules_of_tests()]
    assert sorted({n for n in names if names.count(n) > 1}) == [], "pytest would import only one of each name"


def test_the_one_conftest_is_tests_conftest():
    # Test files import helpers with `from conftest import …`; a second conftest.py in a subfolder is imported under
    # the same name and whichever loads first wins, so those imports break in a full run and pass in a folder's own.
    conftests = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("conftest.py") if "__pycache__" not in p.parts)
    assert conftests == ["conftest.py"], "shared fixtures live in tests/conftest.py"


def test_the_layout_check_sees_a_decorator_and_a_module_mark(tmp_path):
    path = tmp_path / "test_example.py"
    path.write_text("import pytest\npytestmark = pytest.mark.slow\n\n"
                    "@pytest.mark.real_models\ndef test_a():\n    pass\n\n"
                    "@pytest.mark.parametrize('x', [1])\ndef test_b(x):\n    pass\n")
    assert marked_tests_of(path) == {"test_a": {"slow", "real_models"}, "test_b": {"slow"}}
    path.write_text("import pytest\n\n@pytest.mark.skipif(True, reason='')\ndef test_c():\n    pass\n")
    assert marked_tests_of(path) == {"test_c": set()}
