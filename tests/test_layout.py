"""The package's folders are its architecture: imports run one way, commands -> job -> hardware
-> core, and nothing in the core imports a folder. Read from the source (ast), so an import
inside a function counts as much as one at the top."""

import ast

import pytest
from conftest import ROOT

PACKAGE = ROOT / "jaxgpt"
LAYERS = {"core": 0, "hardware": 1, "job": 2, "commands": 3}  # a module may import its own layer and below


def layer_of(module: str) -> str:
    """'jaxgpt.job.trainer' and the folder itself ('from jaxgpt import job') -> 'job'; a
    top-level module ('jaxgpt.model') is the core."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "core"


def package_imports(path) -> set[str]:
    """Every jaxgpt module the file imports (absolute imports: the package uses no relative ones)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(name for name in [node.module, *names] if name and name.startswith("jaxgpt"))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("jaxgpt"))
    return found


def shims() -> set[str]:
    """Top-level modules that only start a command: __main__ (`python -m jaxgpt COMMAND`, the
    dispatcher), and nothing else: the commands' earlier names are served without files."""
    entry = {"__main__": "dispatch"}
    return {
        f"jaxgpt.{path.stem}"
        for path in PACKAGE.glob("*.py")
        if path.stem != "__init__"
        and package_imports(path) == {f"jaxgpt.commands.{entry.get(path.stem, path.stem)}" + s for s in ("", ".main")}
    }


MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts) for path in PACKAGE.rglob("*.py") if path.stem != "__init__"
)
SHIMS = shims()


def test_the_layers_are_what_the_listing_says():
    assert {layer_of(m) for m in MODULES} == set(LAYERS)
    assert layer_of("jaxgpt.model") == "core" and layer_of("jaxgpt.commands.cli") == "commands"
    assert layer_of("jaxgpt.hardware") == "hardware"  # `from jaxgpt import hardware` is an import of the folder
    assert SHIMS == {"jaxgpt.__main__"}


def test_the_top_of_the_package_holds_only_the_library():
    """No module at jaxgpt/'s top is named for a command (`python -m jaxgpt.check` is served by
    jaxgpt.commands.dispatch); the commands live in jaxgpt/commands/."""
    from jaxgpt.commands.dispatch import COMMANDS

    top = {path.stem for path in PACKAGE.glob("*.py")}
    assert top & {module for module, _ in COMMANDS.values()} == set(), top


# __main__ (`python -m jaxgpt COMMAND`) imports the dispatcher by design.
@pytest.mark.parametrize("module", [m for m in MODULES if m not in SHIMS])
def test_imports_run_one_way(module):
    path = ROOT / (module.replace(".", "/") + ".py")
    upward = sorted(
        imported for imported in package_imports(path) if LAYERS[layer_of(imported)] > LAYERS[layer_of(module)]
    )
    assert not upward, f"{module} ({layer_of(module)}) imports from a layer above it: {upward}"
