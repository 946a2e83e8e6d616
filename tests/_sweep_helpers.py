"Shared helpers of tests/test_sweep.py and tests/test_slurm.py: stand-in sweeps, CLI calls, result tables."

import json
import os
import subprocess
import sys
from pathlib import Path
import yaml
from dwg.records.files import read_jsonl
from dwg.pipeline.sweep import read_graph, graph_runs
from dwg.pipeline.run_dirs import run_paths
from dwg.dev.testing import standin_notebooks

REPO = Path(__file__).resolve().parent.parent

# Two datasets, one tiny model; SFT models for both, position grafting on both, component grafting on d1, figures.
STANDIN_SWEEP = dict(
    name="standin",
    models=["tiny-llama"],
    datasets=dict(
        d1=dict(kind="fake_movies_fake_actors", n_facts=4, seed=0),
        d2=dict(kind="fake_movies_fake_actors", n_facts=4, seed=1),
    ),
    train=dict(config="tiny", relation_model="half"),  # three models on d1 (SFT on all facts, task, relation)
    graft_positions=dict(plans=["PRE", "SFT", "FE", "LT", "FE+LT"]),
    graft_components=dict(pairs=[["tiny-llama", "d1"]], plans=["TASK", "RELATION", "LT:o+ffn@all"]),
    figures=dict(k=5),
    slurm=dict(time="00:05:00", mem="1G", cpus=1),
)


def standin_setup(tmp_path, **changes):
    "A stand-in notebooks dir and a sweep file (STANDIN_SWEEP with top-level `changes`) under tmp_path."
    nbs = standin_notebooks(tmp_path / "nbs")
    sweep = tmp_path / "standin.yaml"
    sweep.write_text(yaml.safe_dump({**STANDIN_SWEEP, **changes}, sort_keys=False))
    return nbs, sweep


def sweep_cli(*args, env=None, timeout=600, cwd=REPO, **kw):
    "Run `python -m dwg.pipeline.cli ARGS` (in the repo unless `cwd`); the CompletedProcess (text)."
    e = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    e.pop("IN_TEST", None)
    return subprocess.run(
        [sys.executable, "-m", "dwg.pipeline.cli", *map(str, args)],
        cwd=cwd,
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )


def states(runs_dir):
    "{run key: state} from `status --json`."
    r = sweep_cli("status", "--runs", runs_dir, "--json")
    assert r.returncode == 0, r.stderr
    return {i["key"]: i for items in json.loads(r.stdout).values() for i in items}


def run_key(runs_dir, stage, label):
    "The key of the run of `stage` with `label` in the runs dir's graph."
    return next(r.key for r in graph_runs(read_graph(runs_dir)) if r.stage == stage and r.label == label)


def marker_snapshot(runs_dir):
    "{run.json path: (mtime_ns, content)} of every finished run."
    out = {}
    for r in graph_runs(read_graph(runs_dir)):
        m = run_paths(runs_dir, r).out / "run.json"
        if m.is_file():
            out[str(m)] = (m.stat().st_mtime_ns, m.read_text())
    return out


def results_table(runs_dir):
    "{(stage, plan, fact_id, template): (rank, prob)} over the grafting runs' results.jsonl."
    out = {}
    for r in graph_runs(read_graph(runs_dir)):
        if not r.stage.startswith("graft_"):
            continue
        for row in read_jsonl(run_paths(runs_dir, r).out / "results.jsonl"):
            if row.get("skipped"):
                continue
            out[(r.stage, row["plan"], row["fact_id"], row.get("template"))] = (row["rank"], row["prob"])
    return out
