"""The package's shape: imports run one way through the layers the README names, modules stay small, functions short."""
import ast
from pathlib import Path

import dwg

PACKAGE = Path(dwg.__file__).parent
# Lowest first: a module may import only modules of a lower layer (the README's "How it fits together").
LAYERS = [["runs"], ["data"], ["custom"], ["lora"], ["models"], ["arch"], ["graft"], ["patch"], ["coverage"], ["plans"],
          ["evaluate"], ["interpolate"], ["localize"], ["config", "batches"], ["train"],
          ["sweep", "plots", "bench"], ["recovery", "runner", "localize_plots", "localize_bench"], ["local", "slurm"], ["cli"], ["testing"]]
RANK = {m: i for i, layer in enumerate(LAYERS) for m in layer}
MAX_MODULE_LINES = 520      # "about 500"
MAX_FUNCTION_LINES = 50
LONG_OK = "# long:"         # a function longer than that says why in a comment starting with this


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text()) for p in sorted(PACKAGE.glob("*.py")) if not p.stem.startswith("_")}


def _dwg_imports(tree: ast.Module) -> set[str]:
    "Names of the dwg modules a module imports, anywhere in it (inside functions too)."
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 or node.module == "dwg":
                out |= {node.module} if node.level == 1 and node.module else {a.name for a in node.names}
            elif node.module and node.module.startswith("dwg."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("dwg.")}
    return out - {"__version__"}


def test_every_module_has_a_layer():
    assert sorted(_modules()) == sorted(RANK), "add new modules to LAYERS (and to the README's table)"


def test_imports_run_one_way():
    wrong = [f"dwg.{m} imports dwg.{i}" for m, tree in _modules().items() for i in sorted(_dwg_imports(tree))
             if i != m and RANK.get(i, -1) >= RANK[m]]
    assert not wrong, "imports against the layers: " + "; ".join(wrong)


def test_import_check_can_fail():
    "The checker sees relative, absolute and in-function imports."
    tree = ast.parse("from .plots import x\nimport dwg.sweep\ndef f():\n    from dwg import cli\n")
    assert _dwg_imports(tree) == {"plots", "sweep", "cli"}


def test_modules_and_functions_stay_small():
    big = [f"{p.name}: {n} lines" for p in PACKAGE.glob("*.py") if not p.stem.startswith("_")
           and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    long = []
    for name, tree in _modules().items():
        src = (PACKAGE / f"{name}.py").read_text().splitlines()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and not any(LONG_OK in l for l in src[node.lineno - 1:node.end_lineno]):
                    long.append(f"dwg.{name}.{node.name}: {n} lines")
    assert not big and not long, big + long
