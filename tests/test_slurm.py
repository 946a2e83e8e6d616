"""The Slurm backend (dwg.pipeline.slurm) on a real cluster (CI starts one with scripts/slurm/start_slurm.sh): the smoke
sweep submitted with --slurm gives the same results as a local run, and a failing run is reported failed while the rest
complete and its dependants are cancelled. Skipped where there is no `sbatch`."""

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
import pytest
from dwg.pipeline import sweep as sw
from _sweep_helpers import standin_setup, sweep_cli, states, run_key, results_table


def _cluster_problem():
    if not shutil.which("sbatch"):
        return "no `sbatch` on PATH: start a one-node cluster with `sudo scripts/slurm/start_slurm.sh` (CI does)"
    r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"sbatch exists but no Slurm controller answers (sinfo: {r.stderr.strip()})"
    if not any(s.strip() in ("idle", "mixed", "allocated", "completing") for s in r.stdout.splitlines()):
        return f"no usable Slurm node (sinfo says: {r.stdout.strip() or 'nothing'})"
    return None


PROBLEM = _cluster_problem()
if PROBLEM and os.environ.get("DWG_REQUIRE_SLURM"):  # CI started a cluster: a missing one is a failure, not a skip
    raise RuntimeError(f"DWG_REQUIRE_SLURM is set but {PROBLEM}")
pytestmark = pytest.mark.skipif(bool(PROBLEM), reason=str(PROBLEM))


def test_failing_run_is_reported_and_its_dependants_cancelled(tmp_path):
    "One grafting run raises: it is FAILED, its sibling and the other stages complete, the figures job is cancelled."
    nbs, sweep = standin_setup(tmp_path)
    rd = tmp_path / "runs"
    g = sw.make_graph(str(sweep), rd, nbs)
    sft2 = next(r for r in sw.graph_runs(g) if r.label == "tiny-llama:d2:sft")
    t0 = time.time()
    r = sweep_cli(
        "run",
        "--sweep",
        sweep,
        "--runs",
        rd,
        "--notebooks",
        nbs,
        "--slurm",
        "--wait",
        "--no-progress",
        env={"DWG_STANDIN_FAIL": f"models/{sft2.id}/"},
        timeout=900,
    )
    print(r.stdout, r.stderr, f"{time.time() - t0:.0f}s")
    assert r.returncode == 1
    st = states(rd)
    bad, fig = run_key(rd, "graft_positions", "tiny-llama:d2"), run_key(rd, "figures", "standin")
    assert st[bad]["state"] == "failed" and Path(st[bad]["notebook"]).is_file()
    assert "stand-in failure" in Path(st[bad]["notebook"]).read_text()
    assert st[fig]["state"] == "cancelled" and "DependencyNeverSatisfied" in st[fig]["reason"]
    assert {k for k, i in st.items() if i["state"] == "done"} == set(st) - {bad, fig}
    assert f"FAILED {bad}" in r.stdout and f"CANCELLED {fig}" in r.stdout
    # the job records: the failed array task is FAILED in Slurm, the figures job never ran
    rec = json.loads((rd / ".sweep" / "slurm-last.json").read_text())
    job = rec["stages"]["graft_positions"]["job_id"]
    assert rec["stages"]["figures"]["depends_on"] == [job, rec["stages"]["graft_components"]["job_id"]]
    # resubmitting only submits what is not done: the failed run and the figures (the failure is gone now)
    r2 = sweep_cli(
        "run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "--slurm", "--wait", "--no-progress", timeout=900
    )
    assert r2.returncode == 0, r2.stdout + r2.stderr
    rec2 = json.loads((rd / ".sweep" / "slurm-last.json").read_text())
    assert {s: len(v["runs"]) for s, v in rec2["stages"].items()} == {"graft_positions": 1, "figures": 1}
    assert {i["state"] for i in states(rd).values()} == {"done"}


def test_smoke_sweep_on_slurm_matches_local(tmp_path_factory):
    "The smoke sweep submitted with --slurm: every run finishes and the ranks/probs equal a local smoke run's."
    local = Path(os.environ.get("DWG_TEST_SMOKE_DIR") or tmp_path_factory.mktemp("local") / "runs")
    r = sweep_cli("run", "--profile", "smoke", "--runs", local, "--no-progress", timeout=900)  # skips what is done
    assert r.returncode == 0, r.stdout + r.stderr
    rd = tmp_path_factory.mktemp("slurm") / "runs"
    t0 = time.time()
    r = sweep_cli("run", "--profile", "smoke", "--runs", rd, "--slurm", "--wait", "--log-every", "0", timeout=1200)
    print(r.stdout, r.stderr, f"slurm smoke: {time.time() - t0:.0f}s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"dwg: \d+/\d+ runs finished; \d+ in the queue; running models:", r.stderr), r.stderr  # the log
    assert {i["state"] for i in states(rd).values()} == {"done"}
    assert sorted(states(rd)) == sorted(states(local))  # same run ids
    a, b = results_table(local), results_table(rd)
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        assert a[k][0] == b[k][0], (k, a[k], b[k])  # ranks equal
        assert abs(a[k][1] - b[k][1]) <= 1e-5 + 1e-4 * abs(a[k][1]), (k, a[k], b[k])
    for stage in ("graft_positions", "graft_components", "figures"):
        for d in (rd / stage).iterdir():
            assert (d / "notebook.ipynb").is_file() and (d / "sweep_run.json").is_file()
            assert json.loads((d / "sweep_run.json").read_text())["slurm_job"]
