"""The package's folders are its architecture: imports run one way, commands -> job (and serve beside it) -> data ->
hardware (with the lab and hf, Hugging Face interop, beside it, none of the three importing another)
-> training -> model -> the top of the package (config, errors, sharding, tokenizers), which imports
no folder; and no modules import each other in a circle.
Read from the source (ast), so an import inside a function counts as much as one at the top,
a folder's __init__.py as much as its modules, and a module named to importlib as an import."""

import ast
import re
import sys

import pytest
from conftest import ROOT

PACKAGE = ROOT / "jaxgpt"
# A module may import its own layer and below.
LAYERS = {
    "core": 0,
    "model": 1,
    "training": 2,
    "lab": 3,
    "hf": 3,
    "hardware": 3,
    "data": 4,
    "job": 5,
    "serve": 5,
    "commands": 6,
}


def layer_of(module: str) -> str:
    """'jaxgpt.job.trainer' and the folder itself ('from jaxgpt import job') -> 'job'; a
    module at the package's top ('jaxgpt.config') is the core."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def package_imports(path) -> set[str]:
    """Every jaxgpt module the file imports (absolute imports: the package uses no relative
    ones), and every string that is exactly a module's dotted name (what importlib is handed:
    jaxgpt/__init__.py's lazy exports)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            for alias in (
                node.names if node.module.startswith("jaxgpt") else ()
            ):  # `from jaxgpt.model import kv_cache` imports jaxgpt.model.kv_cache, not jaxgpt's __init__
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in ALL_MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("jaxgpt"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"jaxgpt(\.\w+)+", node.value)
        ):
            found.add(node.value)
    return found


def module_name(path) -> str:
    """jaxgpt/job/trainer.py -> jaxgpt.job.trainer; a folder's jaxgpt/job/__init__.py -> jaxgpt.job."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_of(name: str) -> str | None:
    """The module an imported name lives in ('jaxgpt.model.attention.Mask' -> 'jaxgpt.model.attention')."""
    while name and name not in ALL_MODULES:
        name = name.rpartition(".")[0]
    return name or None


def shims() -> set[str]:
    """Top-level modules that only start a command: __main__ (`python -m jaxgpt COMMAND`, the
    dispatcher), and nothing else (the commands' earlier names, python -m jaxgpt.check and the like, are retired)."""
    entry = {"__main__": "dispatch"}
    return {
        f"jaxgpt.{path.stem}"
        for path in PACKAGE.glob("*.py")
        if path.stem != "__init__" and package_imports(path) == {f"jaxgpt.commands.{entry.get(path.stem, path.stem)}"}
    }


MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts) for path in PACKAGE.rglob("*.py") if path.stem != "__init__"
)
ALL_MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}  # folders' __init__ too
SHIMS = shims()


def test_the_layers_are_what_the_listing_says():
    assert {layer_of(m) for m in MODULES} == set(LAYERS)
    assert layer_of("jaxgpt.config") == "core" and layer_of("jaxgpt.commands.cli") == "commands"
    assert layer_of("jaxgpt.model.attention") == "model" and layer_of("jaxgpt.training") == "training"
    assert layer_of("jaxgpt.hardware") == "hardware"  # `from jaxgpt import hardware` is an import of the folder
    assert SHIMS == {"jaxgpt.__main__"}


def test_the_top_of_the_package_holds_only_the_library():
    """No module at jaxgpt/'s top is named for a command (`python -m jaxgpt check` is served by
    jaxgpt.commands.dispatch); the commands live in jaxgpt/commands/, and nothing serves them
    under another name unseen (no import hook)."""
    import jaxgpt  # noqa: F401  (whatever importing the package installs, the check below sees)
    from jaxgpt.commands.dispatch import COMMANDS

    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top & {module for module, _ in COMMANDS.values()} == set(), top
    assert not [finder for finder in sys.meta_path if type(finder).__module__.startswith("jaxgpt")]
    assert "meta_path" not in (PACKAGE / "__init__.py").read_text()


# __main__ (`python -m jaxgpt COMMAND`) imports the dispatcher by design; the package's own
# __init__ is its front door (`from jaxgpt import GPT`, loaded lazily), which nothing inside imports.
@pytest.mark.parametrize("module", [m for m in ALL_MODULES if m not in SHIMS | {"jaxgpt"}])
def test_imports_run_one_way(module):
    path = ALL_MODULES[module]
    upward = sorted(
        imported
        for imported in package_imports(path)
        if LAYERS[layer_of(imported)] > LAYERS[layer_of(module)]
        or (LAYERS[layer_of(imported)] == LAYERS[layer_of(module)] and layer_of(imported) != layer_of(module))
    )
    assert not upward, f"{module} ({layer_of(module)}) imports from a layer above it or beside it: {upward}"


def test_nothing_inside_the_package_goes_through_its_front_door():
    """jaxgpt/__init__.py names the model's public parts for users; a module that imported them
    from there would import upward unseen."""
    through_front_door = sorted(module for module, path in ALL_MODULES.items() if "jaxgpt" in package_imports(path))
    assert through_front_door == []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one node (Tarjan's algorithm):
    each a set of modules that import one another, however indirectly."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_in_a_circle():
    graph = {
        module: {module_of(name) for name in package_imports(path)} - {module, None}
        for module, path in ALL_MODULES.items()
    }
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the finder finds one


def test_every_folder_of_the_package_is_installed():
    """pyproject.toml lists the packages a wheel carries: a new folder missing there installs
    a jaxgpt whose commands fail to import it (tests/test_install.py would find it, slowly)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {module_name(path) for path in PACKAGE.rglob("__init__.py")}
    assert folders <= listed, sorted(folders - listed)
