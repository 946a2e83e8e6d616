"""The package's shape: wings whose imports run one way (engine <- science <- pipeline), layers inside each wing, no
module reaching for another's private names. Line layout and complexity are left to the linter (ruff, configured in
pyproject.toml)."""

import ast
from pathlib import Path

import dwg

PACKAGE = Path(dwg.__file__).parent
# Wings, lowest first: a module may import its own wing's lower layers and any lower wing, never a higher one.
# `records` (atomic writes, JSONL, progress, provenance, run records) sits beneath the science and the pipeline; the
# engine imports nothing of dwg.
WINGS = {
    "engine": [["hooks", "cache"], ["arch"], ["lora"], ["prompts"], ["graft"], ["patch"], ["prefix"], ["interpolate"]],
    "records": [["files", "provenance"], ["progress"], ["run_record"]],
    "science": [  # subpackages, lowest first: facts <- scoring <- verdicts <- pictures
        ["facts.data"],
        ["facts.custom"],
        ["facts.embedded"],
        ["facts.models"],
        ["scoring.plans"],
        ["scoring.evaluate"],
        ["scoring.readout"],
        ["scoring.grafting", "scoring.localize"],
        ["scoring.tables", "scoring.scores"],
        ["scoring.recovery", "scoring.splits"],
        ["verdicts.claims_file"],
        ["verdicts.claims"],
        ["verdicts.chance", "verdicts.regimes", "verdicts.unembedding", "verdicts.cross_model"],
        ["verdicts.snapshot"],  # a regimes run's classes as the pages show them
        ["pictures.localize_plots", "pictures.charts", "pictures.report", "pictures.pages"],
        ["pictures.recovery_charts", "pictures.regime_charts"],
        ["pictures.figures_run"],
    ],
    "pipeline": [
        ["config", "batches", "speed", "locks", "log", "loss"],
        ["train"],
        ["sweep_file"],
        ["sweep_checks"],
        ["sweep"],
        ["run_dirs", "space"],
        ["execute"],
        ["status", "results"],
        ["local", "slurm"],
        ["cli"],
    ],
    "dev": [["coverage"], ["bench", "train_bench"], ["localize_bench"], ["testing"]],
}
WING_ORDER = list(WINGS)
RANK = {}
for w, layers in WINGS.items():
    for i, layer in enumerate(layers):
        for m in layer:
            RANK[f"{w}.{m}"] = (WING_ORDER.index(w), i)


def _name(path: Path) -> str:
    "`engine.graft` for dwg/engine/graft.py, `records.files` for dwg/records/files.py."
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def _modules() -> dict[str, ast.Module]:
    "Every module of the package but `__init__` files and the nbdev index, by dotted name below dwg."
    return {_name(p): ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py")) if not p.stem.startswith("_")}


def _resolve(module: str, node: ast.ImportFrom) -> list[str]:
    "The dwg modules (dotted below dwg) an ImportFrom names, relative or absolute; names may be modules themselves."
    if node.level:
        base = module.split(".")[: -node.level] if node.level <= module.count(".") + 1 else []
        target = [*base, *(node.module.split(".") if node.module else [])]
    elif node.module and (node.module == "dwg" or node.module.startswith("dwg.")):
        target = node.module.split(".")[1:]
    else:
        return []
    prefix = ".".join(target)
    out = []
    for a in node.names:
        full = f"{prefix}.{a.name}" if prefix else a.name
        out.append(full if full in RANK else prefix)
    return [o for o in out if o]


def _dwg_imports(module: str, tree: ast.Module) -> set[str]:
    "The dwg modules a module imports, anywhere in it (inside functions too)."
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out |= set(_resolve(module, node))
        elif isinstance(node, ast.Import):
            out |= {a.name[4:] for a in node.names if a.name.startswith("dwg.")}
    return out


def _private_imports(module: str, tree: ast.Module) -> list[str]:
    "`from <another dwg module> import _name` in a module."
    return [
        f"{module} imports {src}.{a.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for src in set(_resolve(module, node))
        if src != module
        for a in node.names
        if a.name.startswith("_") and a.name != "__version__"
    ]


def test_every_module_has_a_place():
    assert sorted(_modules()) == sorted(RANK), "add new modules to WINGS (and to the architecture page)"


def test_imports_run_one_way():
    "Down the wings (engine <- records <- science <- pipeline <- dev) and the layers inside a wing; the engine alone."
    wrong = []
    for m, tree in _modules().items():
        for i in sorted(_dwg_imports(m, tree)):
            if i == m or i not in RANK and i.split(".")[0] in WINGS:  # a wing's __init__: part of that wing
                continue
            if i not in RANK or RANK[i] >= RANK[m]:
                wrong.append(f"dwg.{m} imports dwg.{i}")
    assert not wrong, "imports against the wings: " + "; ".join(wrong)
    engine = [
        f"dwg.{m} imports dwg.{i}"
        for m, tree in _modules().items()
        if m.startswith("engine.")
        for i in _dwg_imports(m, tree)
        if not i.startswith("engine.")
    ]
    assert not engine, "the engine imports nothing else of dwg: " + "; ".join(engine)


def test_no_module_imports_another_modules_private_names():
    wrong = [w for m, tree in _modules().items() for w in _private_imports(m, tree)]
    assert not wrong, "; ".join(wrong)


SCIENCE_PACKAGES = ["facts", "scoring", "verdicts", "pictures"]


def test_science_subpackages_say_what_they_hold():
    "Each subpackage of dwg.science, in the order of its layers, opens with a docstring saying what it holds."
    order = list(dict.fromkeys(m.split(".")[0] for layer in WINGS["science"] for m in layer))
    assert order == SCIENCE_PACKAGES
    found = sorted(p.parent.name for p in (PACKAGE / "science").glob("*/__init__.py"))
    assert found == sorted(SCIENCE_PACKAGES), "add the subpackage to WINGS and SCIENCE_PACKAGES"
    for name in SCIENCE_PACKAGES:
        doc = ast.get_docstring(ast.parse((PACKAGE / "science" / name / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"dwg.science.{name} needs a docstring saying what it holds"


def test_import_check_can_fail():
    "The checkers see relative, absolute and in-function imports, and private names."
    tree = ast.parse(
        "from .tables import x\nfrom ...engine.graft import _y\nimport dwg.pipeline.sweep\n"
        "def f():\n    from dwg.pipeline import cli\n"
    )
    assert _dwg_imports("science.scoring.recovery", tree) == {
        "science.scoring.tables",
        "engine.graft",
        "pipeline.sweep",
        "pipeline.cli",
    }
    assert _private_imports("science.scoring.recovery", tree) == ["science.scoring.recovery imports engine.graft._y"]
    assert RANK["pipeline.sweep"] > RANK["science.scoring.tables"] > RANK["records.files"] > RANK["engine.graft"]


def _notebook_imports(name: str) -> str:
    "The import statements of an experiment notebook (dwg/experiments/<name>.ipynb), joined into one script."
    import json

    nb = json.loads((PACKAGE / "experiments" / f"{name}.ipynb").read_text())
    src = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    return "\n".join(ast.unparse(n) for n in ast.parse(src).body if isinstance(n, (ast.Import, ast.ImportFrom)))


MAX_CELL_LINES = 40  # an experiment notebook's cells call exported, tested functions: longer logic goes to nbs/


def _long_cells(notebook: Path) -> list[str]:
    "`<notebook> cell <i>: <n> lines` for each code cell of `notebook` with more than MAX_CELL_LINES source lines."
    import json

    cells = json.loads(notebook.read_text())["cells"]
    sizes = [(i, len("".join(c["source"]).splitlines())) for i, c in enumerate(cells) if c["cell_type"] == "code"]
    return [f"{notebook.name} cell {i}: {n} lines" for i, n in sizes if n > MAX_CELL_LINES]


def test_experiment_cells_are_short():
    "No code cell of an experiment notebook is over 40 lines: the logic lives in modules, where it is tested."
    notebooks = sorted((PACKAGE / "experiments").glob("*.ipynb"))
    assert len(notebooks) >= 5, notebooks  # the experiment notebooks were found
    long = [c for nb in notebooks for c in _long_cells(nb)]
    assert not long, f"move the logic of these cells into an nbs/ notebook (exported and tested): {long}"


def test_long_cell_check_can_fail(tmp_path):
    "A cell of 41 lines is named; one of 40 is not."
    import json

    cells = [{"cell_type": "code", "source": ["x = 1\n"] * n} for n in (40, 41)] + [
        {"cell_type": "markdown", "source": ["a\n"] * 50}
    ]
    (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": cells}))
    assert _long_cells(tmp_path / "nb.ipynb") == ["nb.ipynb cell 1: 41 lines"]


def _venv_modules(script: str) -> set[str]:
    "The modules from site-packages that running `script` in a fresh interpreter imports."
    import subprocess
    import sys

    probe = (
        script + "\nimport sys\nfor n, m in list(sys.modules.items()):\n"
        "    if 'site-packages' in (getattr(m, '__file__', None) or ''): print(n)"
    )
    return set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split())


def test_figures_notebook_imports_no_torch():
    "Drawing the figures from finished runs needs no torch: the figures stage does not pay its import (seconds)."
    imports = _notebook_imports("figures")
    assert (
        "from dwg.records.run_record import" in imports and "training_table" in imports
    )  # the notebook's imports were found
    assert "torch" not in _venv_modules(imports)
    assert "torch" in _venv_modules(imports + "\nimport dwg.pipeline.train")  # the probe can see torch


def _set_up_imports() -> str:
    "The import lines `run_all.sh setup` runs to write the main job's .pyc files (its `compile_job`)."
    import re

    body = (PACKAGE.parent / "run_all.sh").read_text().split("compile_job() {", 1)[1].split("\n}", 1)[0]
    return "\n".join(m.group(1) for m in re.finditer(r'^(?:.*-c ")?(import [\w., ]+)"?', body, re.M))


def test_set_up_compiles_what_the_main_job_imports():
    """Every venv module the main job's notebooks load through their import statements is byte-compiled by compile_job
    (what loads lazily, papermill and the kernel are covered by its other imports, not checked here)."""
    from dwg.pipeline.sweep import STAGES, expand

    stages = {r.stage for r in expand("embedded")}
    job = "\n".join(_notebook_imports(STAGES[s].notebook) for s in sorted(stages))
    set_up = _set_up_imports()
    assert "dwg.pipeline.train" in set_up and "papermill" in set_up  # run_all.sh's lines were found
    compiled, needed = _venv_modules(set_up), _venv_modules(job)
    assert "pip._internal.cli.main" in _venv_modules("import pip._internal.cli.main") - compiled  # can fail
    assert "torch" in needed and not needed - compiled, sorted(needed - compiled)[:20]
