"""The regimes notebook (dwg/experiments/regimes.ipynb) on finished grafting runs: cells from `train_regime` as the runs
record it, the claims table's numbers per cell, a cell whose fine-tune did not learn left out, the run record last."""

import ast
import json
from pathlib import Path

import pandas as pd
import pytest

from dwg.dev.testing import synthetic_paper_results
from dwg.science.verdicts import regimes
from dwg.science.verdicts.claims import claims_table
from dwg.science.scoring.tables import load_runs

NB = Path(__file__).resolve().parents[1] / "dwg" / "experiments" / "regimes.ipynb"
REGIMES = {"fast": {"learning_rate": 3e-4, "epochs": 3}, "slow": {"learning_rate": 1e-5, "epochs": 1}}


def _write_run(d: Path, rows: pd.DataFrame):
    "A finished grafting run: its results and a run record."
    d.mkdir(parents=True)
    (d / "results.jsonl").write_text(rows.to_json(orient="records", lines=True))
    (d / "run.json").write_text(json.dumps({"config": {}}))


def _execute(tmp_path: Path, **parameters):
    "Run the regimes notebook with papermill."
    import papermill as pm

    return pm.execute_notebook(
        str(NB),
        str(tmp_path / "out.ipynb"),
        cwd=str(NB.parent),
        kernel_name="python3",
        parameters=parameters,
        progress_bar=False,
    )


def test_regimes_notebook(tmp_path):
    "Two regimes' runs (slow: its SFT model misses every answer): the claims table's numbers per cell, slow left out."
    runs, out = tmp_path / "runs", tmp_path / "regimes"
    fast = synthetic_paper_results(n_facts=6, seed=0).assign(train_regime="fast", train_seed=0)
    slow = synthetic_paper_results(n_facts=6, seed=1).assign(train_regime="slow", train_seed=0)
    slow = slow.assign(rank=slow["rank"].where(slow["plan"] != "SFT", slow["rank"] + 1000))
    _write_run(runs / "graft" / "fast", fast)
    _write_run(runs / "graft" / "slow", slow)
    _execute(tmp_path, runs_dir=str(runs), out_dir=str(out), n_boot=50, regimes=REGIMES)
    learned = pd.read_csv(out / "learned.csv")
    assert list(learned.regime) == ["fast", "slow"] and list(learned.learns) == [True, False]
    # the claims of the fast cell: the claims table's own numbers on that run's rows, as load_runs reads them
    by_cell = pd.read_csv(out / "regime_claims.csv", keep_default_na=False)
    rows = load_runs(runs, include="graft/fast")
    want = claims_table(rows, n_boot=50, level=regimes.cell_level(2)).query(
        "prompts == 'all'"
    )  # Bonferroni over 2 cells
    got = by_cell[by_cell.regime == "fast"]
    assert list(got.claim) == list(want.claim) and list(got.ours) == list(want.ours)
    assert list(got.verdict) == list(map(str, want.verdict))  # the file holds each Verdict as the table shows it
    summary = pd.read_csv(out / "regime_summary.csv", keep_default_na=False)
    assert set(summary["left out (not learning)"]) == {"lr 1e-5 x 1 ep · 6 facts"}
    claims = summary.set_index("claim")["class"]
    assert set(claims.drop("FE x LT interaction")) == {"too few regimes"}  # one cell learns: nothing to compare
    assert claims["FE x LT interaction"] == "a measure"  # a measure: no thresholds, no class
    record = json.loads((out / "run.json").read_text())
    assert record["synthetic_data"] is False and record["cells"] == 2 and len(record["claims_sha256"]) == 64
    assert {"learned.csv", "regime_claims.csv", "regime_summary.csv", "tables.md", "report.html"} <= set(
        record["outputs"]
    )
    html = (out / "report.html").read_text()
    assert record["claims_sha256"] in html and "data:image/" in html and "SYNTHETIC" not in html
    png = (out / "regimes.png").read_bytes()
    assert png[:4] == b"\x89PNG" and int.from_bytes(png[16:20], "big") >= 600


def test_regimes_notebook_no_results(tmp_path):
    "A runs_dir without finished runs is an error that says what to run (an empty runs_dir draws the demo)."
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="No finished results"):
        _execute(tmp_path, runs_dir=str(tmp_path), out_dir=str(tmp_path / "r"))


def test_regimes_module_imports_no_altair():
    "The numbers need no plotting library: the chart (altair) lives in dwg.science.pictures.regime_charts."
    tree = ast.parse(Path(regimes.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "altair" not in imported and "pandas" in imported
