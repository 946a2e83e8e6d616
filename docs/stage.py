"""Stage the documentation site's sources for MkDocs: `python docs/stage.py [BUILD_DIR]` (default `_build/docs`).

The pages are written in `docs/` so that they also read well on a code host; MkDocs reads a staged copy, in which
- the figures of `nbs/images/` are copied to `images/`, and `nbs/images/` links are rewritten to point there;
- `docs/README.md` becomes `about.md` (MkDocs would take a README for the home page);
- the module notebooks `nbs/*.ipynb` are copied to `notebooks/` without their nbdev directives and hidden cells,
  with an index page listing them (their outputs, if any, are shown; they are never executed here);
- the API page's module paths are mapped onto the installed package: while `dwg/engine/` does not exist yet (the
  package before its split into engine/science/pipeline), `dwg.<wing>.<module>` becomes `dwg.<module>`, and blocks
  whose module is missing are dropped.
Nothing here imports dwg; the staged directory is git-ignored and rebuilt from scratch every time.
"""

from __future__ import annotations
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_PAGES = {"README.md", "requirements.txt", "stage.py"}


def rewrite_images(text: str) -> str:
    "Links to `(../)*nbs/images/x` (right from where the page sits in docs/) -> `(../)*images/x` in the staged tree."
    return re.sub(r"((?:\.\./)*)\.\./nbs/images/", lambda m: m.group(1) + "images/", text)


def notebook_links(text: str) -> str:
    """A notebook page is served at `<name>/` and its markdown links are not resolved by MkDocs: relative links get one
    more `../`, and `page.md` / `notebook.ipynb` become the pages' directory URLs."""

    def fix(m):
        target, anchor = (m.group(1).split("#", 1) + [""])[:2]
        if re.match(r"^[a-z]+:|^/", target) or not target:
            return m.group(0)
        if target.endswith(".md") or target.endswith(".ipynb"):
            target = re.sub(r"(^|/)index\.md$", r"\1", target)
            target = re.sub(r"\.(md|ipynb)$", "/", target)
        return f"](../{target}{'#' + anchor if anchor else ''})"

    return re.sub(r"\]\(([^)\s]+)\)", fix, text)


def stage_notebook(src: Path, dst: Path):
    "A docs notebook with its figure links pointing into the staged images/ and its links made site URLs."
    nb = json.loads(src.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for target in re.findall(r"\]\(([^)\s#]+)", text):  # MkDocs does not check these: fail here instead
                if not re.match(r"^[a-z]+:|^/", target) and not (src.parent / target).exists():
                    raise SystemExit(f"docs: {src.relative_to(ROOT)} links to {target}, which does not exist")
            cell["source"] = notebook_links(rewrite_images(text))
    dst.write_text(json.dumps(nb, indent=1))


def clean_notebook(nb: dict) -> dict:
    "A module notebook without hidden cells and `#|` directive lines."
    cells = []
    for cell in nb["cells"]:
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "code":
            lines = src.splitlines()
            directives = [l for l in lines if l.startswith("#|")]
            if any(re.match(r"#\|\s*(hide|exporti|default_exp)\b", l) for l in directives):
                continue
            src = "\n".join(l for l in lines if not l.startswith("#|")).strip("\n")
            if not src:
                continue
        cells.append({**cell, "source": src})
    return {**nb, "cells": cells}


def notebook_title(nb: dict, fallback: str) -> tuple[str, str]:
    "The first markdown cell's `# title` and its first `> summary` line (nbdev's convention), if any."
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        title = re.search(r"^#\s+(.+)$", src, re.M)
        summary = re.search(r"^>\s*(.+)$", src, re.M)
        if title:
            return title.group(1).strip(), summary.group(1).strip() if summary else ""
    return fallback, ""


def stage_notebooks(out: Path):
    "nbs/*.ipynb -> notebooks/, and notebooks/index.md listing them."
    (out / "notebooks").mkdir(parents=True)
    rows = []
    for path in sorted((ROOT / "nbs").glob("*.ipynb")):
        nb = clean_notebook(json.loads(path.read_text()))
        (out / "notebooks" / path.name).write_text(json.dumps(nb, indent=1))
        title, summary = notebook_title(nb, path.stem)
        rows.append(f"| [{path.stem}]({path.name}) | {title} | {summary.replace('|', '/')} |")
    (out / "notebooks" / "index.md").write_text(
        "# Module notebooks\n\nThe package is written as [nbdev](https://nbdev.fast.ai) notebooks in `nbs/`: each "
        "exports one module of `dwg` and explains it, with the tests that run on it. They are shown here as written "
        "(not executed), without nbdev's directives and hidden cells. To change the package, edit a notebook and run "
        "`./run_all.sh export`.\n\n| notebook | title | summary |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    )


def stage(out: Path) -> Path:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for src in DOCS.rglob("*"):
        rel = src.relative_to(DOCS)
        if src.is_dir() or rel.name in NOT_PAGES and rel.parent == Path(".") or ".ipynb_checkpoints" in rel.parts:
            continue
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.suffix == ".md":
            text = rewrite_images(src.read_text())
            dst.write_text(text)
        elif src.suffix == ".ipynb":
            stage_notebook(src, dst)
        else:
            shutil.copy2(src, dst)
    (out / "about.md").write_text(rewrite_images((DOCS / "README.md").read_text()))
    shutil.copytree(ROOT / "nbs" / "images", out / "images")
    stage_notebooks(out)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "_build" / "docs"
    print(f"docs: staged into {stage(target.resolve())}")
