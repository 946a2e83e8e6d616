"""The generated parts of README.md and docs/results.md are what the committed snapshots say: `results --check` passes
on the committed pages and fails on a page with a number typed over a generated one."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def results_check(root: Path) -> subprocess.CompletedProcess:
    "`python -m dwg.pipeline.cli results --check` run from `root`."
    cmd = [sys.executable, "-m", "dwg.pipeline.cli", "results", "--check"]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)


def test_committed_pages_match_the_snapshots():
    "Regenerating the pages from the committed snapshots changes nothing."
    r = results_check(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_number_typed_over_a_generated_one_fails(tmp_path):
    "A copy of the pages with one generated number edited by hand: exit 1, the diff names the page."
    for rel in ("README.md", "docs/results.md"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    shutil.copytree(ROOT / "docs/snapshots", tmp_path / "docs/snapshots")
    readme = tmp_path / "README.md"
    text = readme.read_text()
    start = text.index('name="FE+LT nearly recovers SFT" show=value -->') + len(
        'name="FE+LT nearly recovers SFT" show=value -->'
    )
    was = text[start : start + 4]
    typed = "0.99" if was != "0.99" else "0.11"
    readme.write_text(text[:start] + typed + text[start + 4 :])
    r = results_check(tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "+++ README.md (regenerated)" in lines
    assert any(x.startswith("-") and f"-->{typed}<" in x for x in lines), r.stdout
    assert any(x.startswith("+") and f"-->{was}<" in x for x in lines), r.stdout


def test_snapshots_are_small():
    "Each committed snapshot file (one per cell) under 200 KB, each committed figure under 300 KB."
    for path in (ROOT / "docs/snapshots").rglob("*.csv"):
        assert path.stat().st_size < 200_000, path
    for path in (ROOT / "nbs/images").glob("*.png"):
        assert path.stat().st_size < 300_000, path
