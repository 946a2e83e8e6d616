"""The user documentation: README's example runs as written, and no document names a tracker issue or a path outside
the repository."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a tracker reference: "issue" or "issues" and a number (any case, "#" allowed); "../shared": a path outside the
# repository
FORBIDDEN = re.compile(r"\bissues?\s+#?\d+\b|\.\./shared", re.I)


def readme_snippet() -> str:
    "The first ```python block of README.md."
    m = re.search(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    assert m, "README.md has no ```python block"
    return m.group(1)


def test_readme_snippet_runs(tmp_path):
    "Exactly README's example, in a fresh interpreter, offline, from a directory outside the repository."
    script = tmp_path / "readme_example.py"
    script.write_text(readme_snippet())
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, f"README's example failed:\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip(), "README's example printed nothing"


def hits(text: str) -> list[str]:
    "Each forbidden phrase in `text`, with a little context."
    return [text[max(0, m.start() - 40) : m.end() + 40].replace("\n", " ") for m in FORBIDDEN.finditer(text)]


def notebook_text(path: Path) -> str:
    "The sources and text outputs of every cell of a notebook."
    nb = json.loads(path.read_text())
    parts = []
    for cell in nb.get("cells", []):
        src = cell.get("source", "")
        parts.append("".join(src) if isinstance(src, list) else src)
        for out in cell.get("outputs", []):
            for text in [out.get("text", ""), out.get("data", {}).get("text/plain", "")]:
                parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


def found_in(paths) -> dict[str, list[str]]:
    out = {}
    for path in paths:
        text = notebook_text(path) if path.suffix == ".ipynb" else path.read_text(errors="replace")
        if h := hits(text):
            out[str(path.relative_to(ROOT))] = h
    return out


def doc_files() -> list[Path]:
    "README, mkdocs.yml and every page and notebook under docs/."
    docs = [
        p
        for p in (ROOT / "docs").rglob("*")
        if p.is_file()
        and p.suffix in (".md", ".ipynb", ".yml", ".yaml", ".txt", ".py")
        and ".ipynb_checkpoints" not in p.parts
    ]
    return [ROOT / "README.md", ROOT / "mkdocs.yml", *docs]


def test_docs_name_no_tracker_issue():
    assert (ROOT / "docs").is_dir()
    assert not (bad := found_in(doc_files())), f"documents naming a tracker issue or ../shared: {bad}"


def module_docstrings(path: Path) -> str:
    "The docstrings of a module, its classes and functions."
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]
    return "\n".join(d for n in nodes if (d := ast.get_docstring(n)))


def test_docstrings_name_no_tracker_issue():
    bad = {}
    for path in sorted((ROOT / "dwg").rglob("*.py")):
        if h := hits(module_docstrings(path)):
            bad[str(path.relative_to(ROOT))] = h
    assert not bad, f"docstrings naming a tracker issue or ../shared: {bad}"


def test_notebooks_name_no_tracker_issue():
    "The module and experiment notebooks, and the packaged sweep and training profiles (users read their comments)."
    paths = sorted(
        [
            *(ROOT / "nbs").rglob("*.ipynb"),
            *(ROOT / "dwg" / "experiments").glob("*.ipynb"),
            *(ROOT / "dwg" / "sweeps").glob("*.yaml"),
            *(ROOT / "dwg" / "configs").glob("*.yaml"),
        ]
    )
    assert paths
    assert not (bad := found_in(paths)), f"notebooks naming a tracker issue or ../shared: {bad}"


def test_sweep_file_example_loads(tmp_path):
    "The sweep file of docs/how-to/sweeps.md expands, with the packaged custom example as its `data/` files."
    from dwg.pipeline.sweep import expand

    text = (ROOT / "docs" / "how-to" / "sweeps.md").read_text()
    m = re.search(r"^```yaml\n(name: my_sweep\n.*?)^```", text, re.S | re.M)
    assert m, "docs/how-to/sweeps.md has no sweep file example (```yaml starting with name: my_sweep)"
    (tmp_path / "data").mkdir()
    for f in ("facts.csv", "templates.yaml"):
        (tmp_path / "data" / f).write_text((ROOT / "dwg" / "assets" / "custom_example" / f).read_text())
    (tmp_path / "my_sweep.yaml").write_text(m.group(1))
    runs = expand(str(tmp_path / "my_sweep.yaml"))
    stages = {r.stage for r in runs}
    assert {"datasets", "models", "graft_positions", "graft_components", "graft_methods", "figures"} <= stages, stages
