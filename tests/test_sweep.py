"""The sweeps (dwg.pipeline.sweep, .execute, .status, .local, .cli): expansion and ids, errors before anything runs,
local runs with stand-in notebooks (reruns, failures, interruptions), and the smoke profile with the real experiment
notebooks."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
import pytest
import yaml
from dwg.pipeline import sweep as sw
from dwg.pipeline.sweep_file import STAGE_ORDER, SweepError, sweeps_dir
from dwg.pipeline.sweep_checks import load_sweep
from dwg.pipeline.run_dirs import PROGRESS, run_paths, run_state
from dwg.pipeline.config import profile_content
from dwg.pipeline import execute, space
from dwg.pipeline.status import format_status, status
from dwg.records.files import read_jsonl
from dwg.dev.testing import standin_notebooks
from _sweep_helpers import (
    REPO,
    STANDIN_SWEEP,
    standin_setup,
    sweep_cli,
    states,
    run_key,
    marker_snapshot,
    results_table,
)


def raw(profile="smoke"):
    return yaml.safe_load((sweeps_dir() / f"{profile}.yaml").read_text())


# --- expansion and ids -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("profile", ["smoke", "embedded", "paper", "custom", "breadth"])
def test_profiles_expand_with_stable_ids(profile):
    "Every packaged profile expands; the same file gives the same ids; ids are unique; stages come in order."
    a, b = sw.expand(profile), sw.expand(profile)
    assert [r.key for r in a] == [r.key for r in b]
    assert len({r.key for r in a}) == len(a)
    order = [STAGE_ORDER.index(r.stage) for r in a]
    assert order == sorted(order)
    for r in a:  # inputs come earlier in the graph
        assert all(i in {x.key for x in a[: a.index(r)]} for i in r.inputs)


def test_smoke_graph_shape():
    """smoke = one dataset, task + relation models (the relation model is the SFT model), one run per grafting
    experiment, figures."""
    g = sw.expand("smoke")
    assert [r.stage for r in g] == [
        "datasets",
        "models",
        "models",
        "graft_positions",
        "graft_components",
        "graft_methods",
        "figures",
    ]
    assert sorted(r.params["split"] for r in g if r.stage == "models") == ["all", "task"]  # the paper's pair
    relation = next(r for r in g if r.stage == "models" and r.params["split"] == "all")
    assert next(r for r in g if r.stage == "graft_components").params["relation"] == "@" + relation.key
    assert next(r for r in g if r.stage == "graft_positions").inputs[-1] == relation.key
    assert next(r for r in g if r.stage == "graft_methods").inputs[-1] == relation.key  # the same SFT model
    from dwg.science.scoring.plans import paper_plans, plan_groups, plans_at

    plans = [p.name for r in g if r.stage.startswith("graft_") for p in plans_at(r.params["plans"])]
    # every catalogue plan runs somewhere (PRE and SFT in two stages), but the graft-form variants (the forms profile)
    assert set(paper_plans()) - set(plan_groups()["forms"]) <= set(plans)


def _training_facts(run, ds):
    "The fact ids of the training texts a models run learns (dwg.pipeline.train's own row selection)."
    from dwg.pipeline.train import select_rows

    return {
        r["fact_id"] for r in select_rows(ds["train"] + ds["validation"], run.params["direction"], run.params["split"])
    }


@pytest.mark.parametrize("relation_model", ["all", "half"])
def test_model_pair_training_facts(relation_model):
    """The paper's pair (default): the relation model's texts hold every fact, the task model's none of the relation
    facts; `relation_model: half` trains the relation model on the relation facts only."""
    from dwg.science.facts.data import build_dataset

    d = raw("embedded")
    d["train"]["relation_model"] = relation_model
    g = sw.expand(load_sweep(d))
    comps = next(r for r in g if r.stage == "graft_components")
    task, relation = (next(r for r in g if "@" + r.key == comps.params[role]) for role in ("task", "relation"))
    ds = build_dataset("fake_movies_fake_actors", 30, seed=0)
    split = {s: {f["id"] for f in ds["metadata"] if f["split"] == s} for s in ("task", "relation")}
    assert _training_facts(task, ds) == split["task"]
    assert _training_facts(relation, ds) == (
        split["task"] | split["relation"] if relation_model == "all" else split["relation"]
    )
    positions = next(r for r in g if r.stage == "graft_positions")
    assert (
        positions.params["finetuned"] == "@" + relation.key and positions.params["split"] == "relation"
    )  # SFT = the relation model
    d["train"]["relation_model"] = "both"
    with pytest.raises(SweepError, match=r"train.relation_model must be all \(the paper.s pair.*or half .*got .both."):
        load_sweep(d)


def test_breadth_graph_shape():
    """breadth = the four data settings, task + relation models each, position and component grafting each, figures
    over all and per setting (the articles at top-50)."""
    g = sw.expand("breadth")
    kinds = sorted(r.params["kind"] for r in g if r.stage == "datasets")
    from dwg.science.facts.data import KINDS

    assert kinds == sorted(KINDS)
    count = lambda stage: sum(r.stage == stage for r in g)
    assert (count("models"), count("graft_positions"), count("graft_components"), count("figures")) == (8, 4, 4, 5)
    figs = {r.label: r for r in g if r.stage == "figures"}
    assert figs["breadth"].params["k"] == 5 and figs["breadth:articles"].params["k"] == 50
    assert len(figs["breadth"].inputs) == 8 and all(
        len(figs[f"breadth:{d}"].inputs) == 2 for d in ("fake_fake", "fake_real", "real_real", "articles")
    )
    assert "per_dataset" not in figs["breadth"].params  # sweep options, not notebook parameters
    d = raw("breadth")
    d["figures"]["k_by_dataset"] = {"nope": 50}
    with pytest.raises(SweepError, match="figures.k_by_dataset must map dataset names"):
        load_sweep(d)
    d = raw("breadth")
    d["figures"]["per_dataset"] = False  # k per dataset without per-dataset figures: said, not ignored
    with pytest.raises(SweepError, match="k_by_dataset needs per_dataset"):
        load_sweep(d)


def test_training_seeds_in_a_dry_run(tmp_path):
    """`seeds: [0, 1]`: a dry run lists the model pair trained twice and every grafting stage twice, each on its seed's
    models; the seed-0 runs are the one-seed sweep's, and `seeds: [0]` gives the ids of `seed: 0` (smoke's)."""
    d = raw()
    del d["train"]["seed"]
    d["train"]["seeds"] = [0]
    smoke = sw.expand("smoke")
    assert [r.key for r in sw.expand(d)] == [r.key for r in smoke]
    d["train"]["seeds"] = [0, 1]
    (tmp_path / "seeds.yaml").write_text(yaml.safe_dump(d))
    r = sweep_cli("run", "--sweep", tmp_path / "seeds.yaml", "--runs", tmp_path / "runs", "--dry-run", "--no-progress")
    assert r.returncode == 0, r.stderr
    listed = [line.split() for line in r.stdout.splitlines() if line.startswith("  ") and "pending" in line]
    labels = lambda stage: sorted(label for key, _, label in listed if key.startswith(f"{stage}/"))
    assert labels("models") == [f"tiny-llama:fake4:{role}:seed{s}" for role in ("relation", "task") for s in (0, 1)]
    for stage in ("graft_positions", "graft_components", "graft_methods"):
        assert labels(stage) == ["tiny-llama:fake4:seed0", "tiny-llama:fake4:seed1"], stage
    assert {r.key for r in smoke if r.stage != "figures"} < {key for key, _, _ in listed}


def test_ids_change_with_config_and_only_downstream():
    "A dataset change renews it and everything downstream; a grafting option renews only its runs and the figures."
    base = {r.key for r in sw.expand("smoke")}

    def renewed(path, value):
        d = raw()
        node = d
        *head, last = path.split(".")
        for k in head:
            node = node[k]
        node[last] = value
        return sorted({r.stage for r in sw.expand(d) if r.key not in base})

    grafts = ["graft_components", "graft_methods", "graft_positions"]
    assert renewed("datasets.fake4.seed", 1) == ["datasets", "figures", *grafts, "models"]
    assert renewed("train.config", "embedded") == ["figures", *grafts, "models"]
    assert renewed("graft_components.plans", ["TASK", "RELATION"]) == ["figures", "graft_components"]
    assert renewed("figures.k", 1) == ["figures"]
    assert renewed("description", "other words") == []


def test_ids_do_not_depend_on_the_runs_dir(tmp_path):
    "Two runs directories give the same ids (references are resolved only when a run executes)."
    nbs, sweep = standin_setup(tmp_path)
    a = sw.make_graph(str(sweep), tmp_path / "a", nbs)
    b = sw.make_graph(str(sweep), tmp_path / "b", nbs)
    assert [r["id"] for r in a["runs"]] == [r["id"] for r in b["runs"]]


def test_training_profile_content_is_in_the_id(tmp_path):
    "Editing the training profile file (same name) renews the models and what depends on them."
    prof = tmp_path / "mine.yaml"
    prof.write_text((Path(sw.__file__).parents[1] / "configs" / "tiny.yaml").read_text())
    d = raw()
    d["train"]["config"] = str(prof)
    before = {r.key for r in sw.expand(d)}
    cfg = yaml.safe_load(prof.read_text())
    cfg["description"] = "reworded"
    prof.write_text(yaml.safe_dump(cfg))
    assert {r.key for r in sw.expand(d)} == before  # the description is not a setting
    cfg["epochs"] += 1
    prof.write_text(yaml.safe_dump(cfg))
    assert sorted({r.stage for r in sw.expand(d) if r.key not in before}) == [
        "figures",
        "graft_components",
        "graft_methods",
        "graft_positions",
        "models",
    ]


def test_dataset_overrides_renew_only_that_datasets_models():
    "train.dataset_overrides changes one dataset's fine-tunes (and what reads them); the other datasets keep their ids."
    import copy

    d = copy.deepcopy(STANDIN_SWEEP)
    before = {r.label: r.key for r in sw.expand(d)}
    d["train"]["dataset_overrides"] = {"d2": {"min_steps": 30}}
    after = {r.label: r.key for r in sw.expand(d)}
    changed = sorted(k for k in before if before[k] != after[k])
    assert changed and all(":d2" in k or k == "standin" for k in changed), changed
    assert any(k.endswith(":d2:sft") for k in changed)
    model = next(r for r in sw.expand(d) if r.label.endswith(":d2:sft"))
    assert model.params["overrides"] == {"min_steps": 30}
    for bad, msg in [
        ({"d3": {"epochs": 2}}, "must map dataset names"),
        ({"d2": {"epoch": 2}}, "dataset_overrides.d2"),
        ({"d2": 3}, "must map dataset names"),
    ]:
        d["train"]["dataset_overrides"] = bad
        with pytest.raises(SweepError, match=msg):
            sw.expand(d)


def test_general_text_is_in_the_id_only_when_used(tmp_path):
    "Mixing in general text from a file: editing the file renews the models and what reads them; unused, no trace."
    assert "supplemental_sha256" not in profile_content("tiny")  # the default adds nothing to the ids
    text = tmp_path / "text.txt"
    text.write_text("The kettle boils.\nThe bus is late.\nThe bread rises.\n")
    d = raw()
    d["train"]["overrides"] = {"supplemental": 2, "supplemental_file": str(text)}
    before = {r.key for r in sw.expand(d)}
    text.write_text("The kettle boils.\nThe bus is early.\nThe bread rises.\n")
    assert sorted({r.stage for r in sw.expand(d) if r.key not in before}) == [
        "figures",
        "graft_components",
        "graft_methods",
        "graft_positions",
        "models",
    ]
    d["train"]["overrides"]["supplemental"] = 4
    with pytest.raises(SweepError, match="train.overrides: .*has 3 passages and they are drawn without replacement"):
        sw.expand(d)


# --- errors before anything runs ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(modles=["x"]), "unknown key 'modles'"),
        (lambda d: d["graft_positions"].update(plan=["FE"]), "graft_positions: unknown key 'plan'"),
        (lambda d: d["datasets"]["fake4"].update(fact=3), "datasets.fake4: unknown key 'fact'"),
        (lambda d: d["datasets"]["fake4"].update(facts=3), "datasets.fake4: facts only go with kind custom"),
        (lambda d: d["slurm"].update(stages={"model": {"time": "1:00:00"}}), "slurm.stages: unknown key 'model'"),
        (lambda d: d["graft_positions"].update(plans=["FE", "FE+LTT"]), "unknown plan(s) 'FE+LTT'"),
        (lambda d: d["graft_components"].update(plans="everything"), "unknown plan(s) 'everything'"),
        (lambda d: d["graft_components"].update(plans=["QQ:o+ffn@all"]), "unknown plan(s) 'QQ:o+ffn@all'. Known plans"),
        (lambda d: d["graft_positions"].update(plans=["LT:o+ffn@all"]), "need models ['relation', 'task']"),
        (lambda d: d["graft_positions"].update(templates=["nope"]), "unknown template(s) ['nope']"),
        (lambda d: d["datasets"]["fake4"].update(kind="fake"), "unknown kind 'fake'"),
        (lambda d: d["datasets"]["fake4"].update(n_facts=10**7), "n_facts must be an integer in [2,"),
        (lambda d: d["train"].update(config="tinyy"), "unknown training profile 'tinyy'"),
        (lambda d: d.update(models=["tiny-lama"]), "unknown model 'tiny-lama'"),
        (
            lambda d: d["graft_positions"].update(split="relations"),
            "graft_positions.split must be all, task or relation",
        ),
        (
            lambda d: d["graft_positions"].update(generated="last"),
            "graft_positions.generated must be base or last_token",
        ),
        (lambda d: d["graft_components"].update(batch_size="x"), "graft_components.batch_size must be an integer >= 1"),
        (
            lambda d: d["graft_positions"].update(generate="yes"),
            "graft_positions.generate must be true, false or a list",
        ),
        (
            lambda d: d["graft_positions"].update(generate=["FE", "methods"]),
            "graft_positions.generate must be true, false or a list",
        ),
        (lambda d: d["train"].update(overrides={"epoch": 2}), "train.overrides: Unknown training setting(s) 'epoch'"),
    ],
)
def test_sweep_file_errors(tmp_path, change, message):
    "Each mistake is a clear error naming it."
    d = raw()
    change(d)
    with pytest.raises(SweepError) as e:
        load_sweep(d)
    assert message in str(e.value)


def test_training_profile_and_overrides_errors_are_told_apart(tmp_path):
    "A bad setting in the training profile file is named as train.config's, a bad override as train.overrides'."
    prof = tmp_path / "mine.yaml"
    prof.write_text((Path(sw.__file__).parents[1] / "configs" / "tiny.yaml").read_text() + "epochz: 2\n")
    d = raw()
    d["train"]["config"] = str(prof)
    with pytest.raises(SweepError, match=r"train.config: Unknown training setting\(s\) 'epochz'"):
        load_sweep(d)
    d = raw()
    d["train"]["overrides"] = {1: 2}
    with pytest.raises(SweepError, match="train.overrides: "):
        load_sweep(d)


def test_sweep_file_errors_cli(tmp_path):
    "From the CLI: exit 2, the problems listed together, nothing written."
    d = raw()
    d["graft_positions"]["plan"] = ["FE"]
    d["datasets"]["fake4"]["kind"] = "fake"
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(d))
    r = sweep_cli("run", "--sweep", f, "--runs", tmp_path / "runs")
    assert (
        r.returncode == 2
        and "2 problem(s)" in r.stderr
        and "unknown key 'plan'" in r.stderr
        and "unknown kind 'fake'" in r.stderr
    )
    assert not (tmp_path / "runs").exists()


def test_missing_trained_model(tmp_path):
    "A model/dataset pair that a grafting section needs but train.pairs does not fine-tune is an error."
    d = raw()
    d["models"] = ["tiny-llama", "tiny-gpt2"]
    d["train"]["pairs"] = [["tiny-llama", "fake4"]]
    with pytest.raises(SweepError, match="No trained model for model 'tiny-gpt2' on dataset 'fake4'"):
        sw.expand(d)
    for section in ("graft_positions", "graft_components", "graft_methods"):
        d[section]["pairs"] = [["tiny-llama", "fake4"]]
    assert {r.params["model"] for r in sw.expand(d) if r.stage == "models"} == {"tiny-llama"}
    d["graft_positions"]["pairs"] = [["tiny-llama", "fake9"]]
    with pytest.raises(SweepError, match="dataset 'fake9' is not in the sweep's datasets"):
        sw.expand(d)


def test_notebook_checks(tmp_path):
    "A notebook without a `parameters` cell, or missing a parameter the sweep passes, is an error before running."
    nbs, sweep = standin_setup(tmp_path)
    nb = json.loads((nbs / "train.ipynb").read_text())
    nb["cells"][1]["source"] = nb["cells"][1]["source"].replace('direction = "all"\n', "")
    (nbs / "train.ipynb").write_text(json.dumps(nb))
    r = sweep_cli("run", "--sweep", sweep, "--runs", tmp_path / "runs", "--notebooks", nbs)
    assert r.returncode == 2 and "passes ['direction'] but the parameters cell" in r.stderr
    nb["cells"][1]["source"] += '\ndirection = "all"   # all = both directions\n'  # papermill skips this line
    (nbs / "train.ipynb").write_text(json.dumps(nb))
    with pytest.raises(SweepError, match=r"papermill cannot read the parameter\(s\) \['direction'\]"):
        sw.make_graph(str(sweep), tmp_path / "r", nbs)
    nb["cells"][1]["metadata"] = {}
    (nbs / "train.ipynb").write_text(json.dumps(nb))
    with pytest.raises(SweepError, match="no cell tagged 'parameters'"):
        sw.make_graph(str(sweep), tmp_path / "r", nbs)
    (nbs / "figures.ipynb").unlink()
    with pytest.raises(SweepError, match="figures.ipynb does not exist"):
        sw.make_graph(str(sweep), tmp_path / "r", nbs)


def test_slurm_without_sbatch(tmp_path):
    "`--slurm` where no sbatch exists: a clear error, exit 2, nothing written or submitted."
    nbs, sweep = standin_setup(tmp_path)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    r = sweep_cli(
        "run", "--sweep", sweep, "--runs", tmp_path / "runs", "--notebooks", nbs, "--slurm", env={"PATH": str(bindir)}
    )
    assert r.returncode == 2 and "needs Slurm's `sbatch`, which is not on PATH" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def _fake_slurm(tmp_path, refuse: str) -> dict:
    """A PATH with an `sbatch` that accepts a job script (job ids 100, 101, ...) unless it contains `refuse`, then fails
    like Slurm does; and an `scancel` that records its arguments."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(f"""#!/bin/sh
script="$2"
if grep -q -- '{refuse}' "$script"; then
  echo "sbatch: error: invalid partition specified: nosuchpart" >&2
  echo "sbatch: error: Batch job submission failed: Invalid partition name specified" >&2
  exit 1
fi
n=$(cat "$0.n" 2>/dev/null || echo 0)
echo $((n + 1)) > "$0.n"
echo 10$n
""")
    (bindir / "scancel").write_text('#!/bin/sh\necho "$@" >> "$0.args"\n')
    for f in ("sbatch", "scancel"):
        (bindir / f).chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("where", ["cli", "one stage"])
def test_sbatch_refusal_is_one_error_line(tmp_path, where):
    """sbatch refusing a job array (`--partition nosuchpart`, or one stage's partition in the sweep file): one error
    line, exit 2, no traceback; arrays already submitted are cancelled; no sweep.json and no submission left."""
    if where == "cli":
        nbs, sweep = standin_setup(tmp_path)
        extra = ["--partition", "nosuchpart"]
    else:
        nbs, sweep = standin_setup(
            tmp_path, slurm=dict(STANDIN_SWEEP["slurm"], stages=dict(graft_positions=dict(partition="nosuchpart")))
        )
        extra = []
    env = _fake_slurm(tmp_path, "--partition=nosuchpart")
    rd = tmp_path / "runs"
    r = sweep_cli("run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "--slurm", *extra, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("dwg: error:")]  # beside the sweep's notices
    assert "Traceback" not in r.stderr and len(errors) == 1 and errors[0] == r.stderr.strip().splitlines()[-1], r.stderr
    assert "sbatch refused the" in r.stderr and "invalid partition specified: nosuchpart" in r.stderr, r.stderr
    assert not rd.exists(), list(rd.rglob("*"))
    cancelled = tmp_path / "fakebin" / "scancel.args"
    if where == "cli":
        assert not cancelled.exists()  # the first array was refused: nothing to cancel
    else:
        assert cancelled.read_text().split() == ["100", "101"]  # datasets and models were accepted


def test_status_shows_every_sweep_under_runs(tmp_path):
    "`status` without --runs/--profile: every runs directory under ./runs; with --runs only that one."
    nbs, sweep = standin_setup(tmp_path)
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump({**STANDIN_SWEEP, "name": "small", "graft_components": False, "figures": False}))
    for s, d in ((sweep, "runs/standin"), (small, "runs/other/small")):  # --slurm --dry-run: saves the graph only
        r = sweep_cli("run", "--sweep", s, "--runs", d, "--notebooks", nbs, "--slurm", "--dry-run", cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
    r = sweep_cli("status", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{tmp_path}/runs/other/small\n" in r.stdout and f"{tmp_path}/runs/standin\n" in r.stdout, r.stdout
    assert r.stdout.count("graft_positions") == 2 and r.stdout.count("graft_components") == 1
    st = json.loads(sweep_cli("status", "--json", cwd=tmp_path).stdout)
    assert sorted(st) == [str(tmp_path / "runs/other/small"), str(tmp_path / "runs/standin")]
    one = sweep_cli("status", "--runs", "runs/standin", cwd=tmp_path).stdout
    assert "small" not in one and "graft_components" in one
    empty = tmp_path / "empty"
    empty.mkdir()
    r = sweep_cli("status", cwd=empty)
    assert r.returncode == 2 and "No sweep under" in r.stderr and "Traceback" not in r.stderr


# --- local runs with stand-in notebooks ---------------------------------------------------------------------------
def test_regimes_run_locally_with_their_own_figures(tmp_path):
    """`train.regimes`: each regime trains its own models (one on d2 only, with two seeds), every grafting run stamps
    its regime, each regime gets its figures run and one `regimes` run reads every grafting run."""
    regimes = {"base": {}, "long": {"overrides": {"epochs": 2}, "datasets": ["d2"], "seeds": [0, 1]}}
    nbs, sweep = standin_setup(tmp_path, train={**STANDIN_SWEEP["train"], "regimes": regimes})
    rd = tmp_path / "runs"
    r = sweep_cli("run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "-j", "2", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    st = states(rd)
    assert {i["state"] for i in st.values()} == {"done"}
    graph = sw.graph_runs(sw.read_graph(rd))
    grafts = [g for g in graph if g.stage == "graft_positions"]
    assert sorted((g.params["train_regime"], g.params["train_seed"]) for g in grafts) == [
        ("base", 0),
        ("base", 0),
        ("long", 0),
        ("long", 1),
    ]
    assert sorted(g.label for g in graph if g.stage == "figures") == ["standin:base", "standin:long"]
    (regimes_run,) = [g for g in graph if g.stage == "regimes"]
    found = json.loads((rd / regimes_run.key / "tables.json").read_text())["results"]
    assert len(found) == len([g for g in graph if g.stage.startswith("graft_")])


@pytest.mark.parametrize(
    "regimes, message",
    [
        ({"x": {"overrides": {"learning_rat": 1e-4}}}, "train.regimes.x: Unknown training setting(s) 'learning_rat'"),
        ({"x": {"datasets": ["nope"]}}, "train.regimes.x.datasets must be a non-empty list of the sweep's datasets"),
        ({"x": {"seeds": []}}, "train.regimes.x.seeds must be a non-empty list"),
        ({"bad name": {}}, "a regime name must be letters, digits"),
    ],
)
def test_regime_errors(regimes, message):
    d = raw()
    d["train"]["regimes"] = regimes
    with pytest.raises(SweepError) as e:
        load_sweep(d)
    assert message in str(e.value), str(e.value)


def test_local_run_then_rerun_skips(tmp_path):
    """A local sweep finishes every run (executed notebooks kept), its log telling the running runs' progress; a rerun
    skips them all and rewrites nothing."""
    nbs, sweep = standin_setup(tmp_path)
    rd = tmp_path / "runs"
    r = sweep_cli(
        "run",
        "--sweep",
        sweep,
        "--runs",
        rd,
        "--notebooks",
        nbs,
        "-j",
        "2",
        "--log-every",
        "0",
        env={"DWG_STANDIN_SLEEP": "0.5"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(
        r"dwg: \d+/10 runs finished; running .*models:tiny-llama:d\d:sft \[train step [12]/3\]", r.stderr
    ), r.stderr
    assert "graft_positions" in r.stdout and "run time" in r.stdout  # the per-stage summary
    st = states(rd)
    assert len(st) == 10 and {i["state"] for i in st.values()} == {"done"}
    for key in st:
        stage, rid = key.split("/")
        assert (rd / stage / rid / "notebook.ipynb").is_file() and not (rd / stage / f"{rid}.tmp").exists()
    assert not list(rd.rglob(PROGRESS))  # progress files are for running runs only
    fig = json.loads(next((rd / "figures").glob("*/tables.json")).read_text())
    assert len(fig["results"]) == 3
    snap = marker_snapshot(rd)
    again = sweep_cli("run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "--no-progress")
    assert again.returncode == 0 and "dwg: standin (" in again.stderr and "10 runs, 10 already done" in again.stderr
    assert marker_snapshot(rd) == snap


def test_failed_run_is_reported_blocks_dependants_and_is_retried(tmp_path):
    """A raising run is reported failed with its notebook; its dependants are blocked, the rest finish; a rerun
    retries only the failed and blocked runs."""
    nbs, sweep = standin_setup(tmp_path, graft_components=False)
    rd = tmp_path / "runs"
    g = sw.make_graph(str(sweep), rd, nbs)
    sft2 = next(r for r in sw.graph_runs(g) if r.label == "tiny-llama:d2:sft")
    fail = {"DWG_STANDIN_FAIL": f"models/{sft2.id}/"}  # only the position run reading that model
    r = sweep_cli("run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "--no-progress", env=fail)
    assert r.returncode == 1
    st = states(rd)
    bad = run_key(rd, "graft_positions", "tiny-llama:d2")
    assert st[bad]["state"] == "failed" and "stand-in failure" in st[bad]["error"]
    nb = Path(st[bad]["notebook"])
    assert nb.is_file() and "stand-in failure" in nb.read_text()
    assert f"FAILED {bad}" in r.stdout and str(nb) in r.stdout
    assert re.search(
        rf"dwg: graft_positions tiny-llama:d2 \({bad.split('/')[1]}\) failed: RuntimeError: stand-in failure", r.stderr
    ), r.stderr
    assert st[run_key(rd, "figures", "standin")]["state"] == "pending"
    assert {k for k, i in st.items() if i["state"] == "done"} == set(st) - {bad, run_key(rd, "figures", "standin")}
    status = sweep_cli("status", "--runs", rd)
    assert "FAILED" in status.stdout and str(nb) in status.stdout
    snap = marker_snapshot(rd)
    again = sweep_cli("run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "--no-progress")
    assert again.returncode == 0, again.stdout + again.stderr
    assert {i["state"] for i in states(rd).values()} == {"done"}
    after = marker_snapshot(rd)
    assert {k: v for k, v in after.items() if k in snap} == snap and len(after) == len(snap) + 2


def test_corrupt_run_is_redone_with_its_dependants(tmp_path):
    """The smoke graph on stand-ins; one grafting run's results.jsonl is truncated afterwards: status says corrupt
    (naming the file), and a rerun redoes that run and the figures that read it, nothing else."""
    nbs = standin_notebooks(tmp_path / "nbs")
    rd = tmp_path / "runs"
    r = sweep_cli("run", "--profile", "smoke", "--runs", rd, "--notebooks", nbs, "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    bad = run_key(rd, "graft_positions", "tiny-llama:fake4")
    fig = run_key(rd, "figures", "smoke")
    results = rd / bad / "results.jsonl"
    results.write_text(results.read_text()[:50])
    st = states(rd)
    assert st[bad]["state"] == "corrupt" and str(results) in st[bad]["error"], st[bad]
    assert {k for k, i in st.items() if i["state"] == "done"} == set(st) - {bad}
    assert f"CORRUPT {bad}" in sweep_cli("status", "--runs", rd).stdout
    snap = marker_snapshot(rd)
    again = sweep_cli("run", "--profile", "smoke", "--runs", rd, "--notebooks", nbs, "--no-progress")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"dwg: {bad} (tiny-llama:fake4) is corrupt: redoing it" in again.stderr, again.stderr
    assert f"dwg: {fig} (smoke) is done, but it read a corrupt run: redoing it" in again.stderr, again.stderr
    assert {i["state"] for i in states(rd).values()} == {"done"}
    after = marker_snapshot(rd)
    redone = {k for k in snap if after.get(k) != snap[k]}
    assert redone == {str(rd / bad / "run.json"), str(rd / fig / "run.json")}, redone
    assert read_jsonl(results) and run_state(rd, dict(stage="graft_positions", id=bad.split("/")[1])) == "done"


def _wait_for(cond, timeout=120, every=0.05):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if v := cond():
            return v
        time.sleep(every)
    raise AssertionError("timed out")


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT-group", "SIGTERM"])
def test_interrupted_sweep_resumes(tmp_path, how):
    """Kill a local sweep mid-way (SIGKILL of the sweep alone / Ctrl-C to the whole process group) and rerun: nothing
    finished is redone or lost, nothing half-written counts as done, and the interrupted training resumes."""
    nbs, sweep = standin_setup(tmp_path, graft_components=False)
    rd = tmp_path / "runs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DWG_STANDIN_SLEEP": "1.0"}
    env.pop("IN_TEST", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dwg.pipeline.cli",
            "run",
            "--sweep",
            sweep,
            "--runs",
            rd,
            "--notebooks",
            nbs,
            "--no-progress",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        models = rd / "models"

        def mid_training():  # one training finished and the next one has a checkpoint but is not finished
            done = [p for p in models.glob("*/model/run.json")] if models.is_dir() else []
            part = [p for p in models.glob("*.tmp/model.tmp/checkpoint-0")] if models.is_dir() else []
            return done and part and (part[0].parent.parent / PROGRESS).exists() and part[0]

        ck0 = _wait_for(mid_training)
        st_mid = status(rd)  # the running training, with the last progress line its notebook wrote
        running = [i for i in st_mid["models"] if i["state"] == "running"]
        assert len(running) == 1 and running[0]["progress"] in ("train step 1/3", "train step 2/3"), running
        assert f"RUNNING {running[0]['key']} ({running[0]['label']}): train step" in format_status(st_mid)
    finally:
        if how == "SIGKILL":
            proc.kill()
        elif how == "SIGTERM":
            proc.terminate()
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0].decode()
    partial = ck0.parent.parent  # models/<id>.tmp
    # the children stop too: soon no run holds its lock
    _wait_for(lambda: all(i["state"] != "running" for i in states(rd).values()), timeout=30, every=0.5)
    time.sleep(1.5)  # let an orphaned kernel (if any) notice its parent died
    st = states(rd)
    key = f"models/{partial.name[:-4]}"
    assert st[key]["state"] == "interrupted", (st[key], out)
    assert not (rd / "models" / partial.name[:-4]).exists()
    for k, i in st.items():  # a final directory always holds a finished run
        stage, rid = k.split("/")
        if (rd / stage / rid).exists():
            assert i["state"] == "done"
    snap = marker_snapshot(rd)
    checkpointed = sorted(int(p.name.split("-")[1]) for p in (partial / "model.tmp").glob("checkpoint-*"))
    steps_before = (partial / "steps.log").read_text().split()
    r = sweep_cli("run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("taking it over" in r.stderr) == (how == "SIGKILL"), r.stderr  # only a killed sweep leaves its lock
    assert {i["state"] for i in states(rd).values()} == {"done"}
    after = marker_snapshot(rd)
    assert {k: v for k, v in after.items() if k in snap} == snap  # finished runs untouched
    steps = (rd / "models" / partial.name[:-4] / "steps.log").read_text().split()
    assert steps[: len(steps_before)] == steps_before and sorted(map(int, steps)) == [0, 1, 2]
    assert not set(map(int, steps[len(steps_before) :])) & set(checkpointed)  # resumed, not restarted
    assert (rd / "models" / partial.name[:-4] / "notebook.attempt-1.ipynb").is_file()


# --- the smoke profile with the real notebooks --------------------------------------------------------------------
def smoke_runs_dir(tmp_path_factory):
    "Where the local smoke run goes: $DWG_TEST_SMOKE_DIR (shared with tests/test_slurm.py in CI) or a temp dir."
    return Path(os.environ.get("DWG_TEST_SMOKE_DIR") or tmp_path_factory.mktemp("smoke") / "runs")


def test_smoke_profile_runs_locally(tmp_path_factory):
    """The smoke profile (tiny model, tiny dataset, all plans, figures) runs locally end to end (its time is printed,
    not asserted)."""
    rd = smoke_runs_dir(tmp_path_factory)
    shutil.rmtree(rd, ignore_errors=True)
    t0 = time.time()
    r = sweep_cli("run", "--profile", "smoke", "--runs", rd, "--no-progress")
    took = time.time() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    assert {i["state"] for i in states(rd).values()} == {"done"}
    table = results_table(rd)
    from dwg.science.scoring.plans import paper_plans, plan_groups

    forms = set(plan_groups()["forms"])  # the graft-form variants: the forms profile's, not the smoke run's
    assert {k[1] for k in table} == set(paper_plans()) - forms  # every other plan (the methods at one layer quarter)
    rows = [r for f in rd.glob("graft_positions/*/results.jsonl") for r in read_jsonl(f)]
    assert {r["plan"] for r in rows if r["direction"] == "B2A"} == {"PRE", "SFT"}  # reversal_plans
    print(f"smoke took {took:.0f}s")


def test_kernels_are_given_time_to_start(tmp_path, monkeypatch):
    "A run's notebook kernel may take KERNEL_START_TIMEOUT to start (papermill's 60 s failed a run on a busy machine)."
    import papermill as pm

    nbs, sweep = standin_setup(tmp_path)
    graph = sw.make_graph(str(sweep), tmp_path / "runs", nbs)
    seen = {}
    monkeypatch.setattr(pm, "execute_notebook", lambda *args, **kwargs: seen.update(kwargs))
    run = sw.graph_runs(graph)[0]
    assert execute._execute(graph, run, run_paths(tmp_path / "runs", run), {}, progress=False) is None
    assert seen["start_timeout"] == execute.KERNEL_START_TIMEOUT >= 300, seen


# --- free space, full disks, one sweep per runs directory ----------------------------------------------------------
def test_too_little_space_stops_before_the_first_run(tmp_path, monkeypatch, capsys):
    """The free-space call patched to 30 MB: the stand-in graph (tiny-llama fine-tunes, ~40 MB checkpoints) stops
    before its first run with exit 2, naming the sizes and the fixes, and writes nothing; --force goes on."""
    from dwg.pipeline import cli

    nbs, sweep = standin_setup(tmp_path)
    rd = tmp_path / "runs"
    monkeypatch.setattr(space, "free_space", lambda path: 30_000_000)
    args = ["run", "--sweep", str(sweep), "--runs", str(rd), "--notebooks", str(nbs), "--no-progress"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "Not enough free space: 10 run(s) to do need about" in err and "30.0 MB free in" in err, err
    assert "  models: " in err and "checkpoints of" in err and "--runs DIR" in err and "--force" in err, err
    assert not rd.exists()
    assert cli.main(args + ["--dry-run", "--force"]) == 0
    assert "(--force: going on)" in capsys.readouterr().err


def test_each_run_checks_the_space_in_its_job(tmp_path, monkeypatch, capsys):
    """`run-one` (what a Slurm job runs) checks its run's estimate against the free space before it starts: too little
    fails the run at once, its reason naming the sizes; status shows it."""
    nbs, sweep = standin_setup(tmp_path)
    rd = tmp_path / "runs"
    graph = sw.make_graph(str(sweep), rd, nbs)
    graph["space"] = space.estimate_runs(graph, sw.graph_runs(graph))
    path = sw.save_graph(graph)
    first = sw.graph_runs(graph)[0]
    monkeypatch.setattr(space, "free_space", lambda path: 1_000_000)
    assert execute.run_from_graph(path, first.key) == 1
    assert (
        f"dwg: {first.key}: failed: NoSpace: this run needs about 5.0 MB (datasets), 1.0 MB is free"
        in capsys.readouterr().err
    )
    item = next(i for i in status(rd)["datasets"] if i["key"] == first.key)
    assert item["state"] == "failed" and item["error"].startswith("NoSpace: this run needs about 5.0 MB"), item


def test_full_disk_reason_on_console_and_in_status(tmp_path):
    """On a 3 MB file system (a tmpfs in a private mount namespace) a stand-in fine-tune writing 1.5 MB checkpoints
    fails (the sweep is forced past the space check): the console line and `status` both give the reason, the run is
    FAILED (not INTERRUPTED), and nothing is published half-way."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no user and mount namespaces here (unshare -rm) to mount a small file system")
    one = dict(d1=STANDIN_SWEEP["datasets"]["d1"])
    nbs, sweep = standin_setup(tmp_path, datasets=one, graft_components=False)
    nb = json.loads((nbs / "train.ipynb").read_text())
    body = nb["cells"][3]["source"]
    nb["cells"][3]["source"] = body.replace("ck.write_text(str(step))", 'ck.write_text(str(step) + " " * 1_500_000)')
    assert nb["cells"][3]["source"] != body
    (nbs / "train.ipynb").write_text(json.dumps(nb))
    small = tmp_path / "small"
    small.mkdir()
    rd = small / "runs"
    py = f"{sys.executable} -m dwg.pipeline.cli"
    script = (
        f"mount -t tmpfs -o size=3m tmpfs {small} && {py} run --sweep {sweep} --runs {rd} --notebooks {nbs} "
        f"--no-progress --force 2>&1; echo exit $?; echo ====; {py} status --runs {rd}"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("IN_TEST", None)
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    run, status = r.stdout.split("====")
    assert "exit 1" in run, r.stdout + r.stderr
    reason = "OSError: [Errno 28] No space left on device"
    assert re.search(rf"dwg: models tiny-llama:d1:sft \(\w+\) failed: {re.escape(reason)}; see ", run), run
    assert re.search(rf"FAILED models/\w+ \(tiny-llama:d1:sft\): {re.escape(reason)}", status), status
    assert "INTERRUPTED" not in status and "run.json" not in status


def test_second_sweep_on_a_runs_directory(tmp_path):
    """A second sweep on a runs directory another sweep is running on exits 2 at once, naming it (host, pid, start
    time) and changing nothing; with --wait it waits for it, then finds every run done."""
    nbs, sweep = standin_setup(tmp_path, graft_components=False)
    rd = tmp_path / "runs"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DWG_STANDIN_SLEEP": "2.0"}
    env.pop("IN_TEST", None)
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dwg.pipeline.cli",
            "run",
            "--sweep",
            sweep,
            "--runs",
            rd,
            "--notebooks",
            nbs,
            "--no-progress",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lock = rd / ".sweep" / "sweep.lock"
        _wait_for(lambda: lock.is_file() and lock.read_text() and (rd / "sweep.json").is_file())
        before = {k: i["state"] for k, i in states(rd).items()}
        r = sweep_cli("run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "--no-progress")
        assert r.returncode == 2 and first.poll() is None, r.stdout + r.stderr  # refused while the first still ran
        host = os.uname().nodename
        assert f"Another sweep is running on {rd}: pid {first.pid} on {host}, started " in r.stderr, r.stderr
        assert r.stderr.count("Another sweep") == 1 and "--wait" in r.stderr and r.stdout == "", r.stdout + r.stderr
        assert not any(i["state"] == "failed" for i in states(rd).values())  # it started nothing, marked nothing
        assert set(before) == set(states(rd))
        assert first.poll() is None  # still running: the next sweep has to wait for it
        w = sweep_cli("run", "--sweep", sweep, "--runs", rd, "--notebooks", nbs, "--no-progress", "--wait")
        assert w.returncode == 0, w.stdout + w.stderr
        assert f"waiting for the sweep running on {rd} to finish: pid {first.pid} on {host}" in w.stderr, w.stderr
        n = len(before)
        assert f"{n} runs, {n} already done" in w.stderr, w.stderr  # it started once the first had finished
    finally:
        out = first.communicate(timeout=300)[0]
    assert first.returncode == 0, out
    assert {i["state"] for i in states(rd).values()} == {"done"}


def test_packaged_data_is_in_the_dataset_id(tmp_path, monkeypatch):
    "Editing a packaged article renews the articles dataset (and what reads it); the templated datasets keep their ids."
    from dwg.science.facts import data

    d = raw("breadth")
    before = {r.label: r.key for r in sw.expand(d)}
    assets = tmp_path / "assets"
    shutil.copytree(data.ASSETS, assets)
    monkeypatch.setattr(data, "ASSETS", assets)
    assert {r.label: r.key for r in sw.expand(d)} == before  # the same files, the same ids
    art = assets / "articles" / "a01_1.txt"
    art.write_text(art.read_text().replace("2014", "2015"))
    after = {r.label: r.key for r in sw.expand(d)}
    changed = {k for k in before if before[k] != after[k]}
    assert "articles" in changed and not any(k in changed for k in ("fake_fake", "fake_real", "real_real")), changed
    assert any(k.endswith(":articles:relation") for k in changed)
