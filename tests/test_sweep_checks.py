"""A sweep's mistakes found when it loads, before any training (dwg.pipeline.sweep_checks): plan files and their
position roles against the roles each dataset's prompts will have, and every value a run's notebook would refuse
later."""

import json
import logging
from pathlib import Path
import pytest
import yaml
from dwg.pipeline import sweep as sw
from dwg.pipeline.sweep_file import SweepError
from dwg.pipeline.sweep_checks import load_sweep
from dwg.science.scoring import plans as plans_mod
from dwg.science.facts.custom import example_files
from _sweep_helpers import sweep_cli

SWEEP = dict(
    name="checks",
    models=["tiny-llama"],
    datasets=dict(fake4=dict(kind="fake_movies_fake_actors", n_facts=4, seed=0)),
    train=dict(config="tiny"),
    graft_positions=dict(plans=["PRE", "SFT"]),
    figures=dict(k=5),
)
FAKE_ROLES = "first_actor, genre, movie_title, release_year"


def write_plan(path: Path, positions, name: str = "mine") -> Path:
    "A plan file grafting the fine-tuned model into the pretrained one at `positions`."
    plans_mod.save_plan(plans_mod.GraftPlan(name, "pretrained", [plans_mod.Rule("finetuned", positions)]), path)
    return path


def sweep_file(tmp_path: Path, **sections) -> Path:
    "SWEEP with `sections` replacing its own, written as a YAML file in `tmp_path`."
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, **sections}, sort_keys=False))
    return path


def problems_of(sweep) -> str:
    "The problems `load_sweep` reports for `sweep` (it must report some)."
    with pytest.raises(SweepError) as e:
        load_sweep(sweep)
    return str(e.value)


def test_dry_run_refuses_a_plan_file_with_an_unknown_role(tmp_path):
    "`run --dry-run` of a sweep whose plan file names a misspelt role fails, naming it and the roles there are."
    write_plan(tmp_path / "typo.yaml", ["first_actr"], "typo")
    path = sweep_file(tmp_path, graft_positions=dict(plans=["PRE", "SFT", "typo.yaml"]))
    r = sweep_cli("run", "--sweep", path, "--dry-run", "--runs", tmp_path / "runs")
    assert r.returncode != 0
    assert "plan 'typo' grafts at position role(s) ['first_actr']" in r.stderr, r.stderr
    assert f"dataset 'fake4' do not have (its roles: {FAKE_ROLES};" in r.stderr
    write_plan(tmp_path / "typo.yaml", ["first_actor"], "typo")  # the typo fixed: the dry run passes
    r = sweep_cli("run", "--sweep", path, "--dry-run", "--runs", tmp_path / "runs")
    assert r.returncode == 0, r.stderr


def test_plan_file_content_goes_to_the_run(tmp_path):
    "A plan file is read relative to the sweep file; its plan is in the run's parameters, so editing it renews the run."
    write_plan(tmp_path / "plans" / "mine.yaml", ["first_actor", "last_token"])
    path = sweep_file(tmp_path, graft_positions=dict(plans=["PRE", "SFT", "plans/mine.yaml"]))
    graft = lambda: next(r for r in sw.expand(str(path)) if r.stage == "graft_positions")
    before = graft()
    mine = plans_mod.plan_data(plans_mod.load_plan_file(tmp_path / "plans" / "mine.yaml"))
    assert before.params["plans"] == ["PRE", "SFT", mine]
    assert json.loads(json.dumps(before.params)) == before.params  # papermill passes it as it is
    write_plan(tmp_path / "plans" / "mine.yaml", ["first_actor"])
    assert graft().id != before.id


def test_reversal_plans_name_a_plan_files_plan(tmp_path):
    "reversal_plans names a plan file's plan by its name; generate takes no plan file (the run could not resolve it)."
    write_plan(tmp_path / "mine.yaml", ["first_actor"])
    sections = dict(plans=["PRE", "SFT", str(tmp_path / "mine.yaml")], reversal_plans=["PRE", "mine"])
    assert load_sweep(dict(SWEEP, graft_positions=sections)).sections["graft_positions"]["reversal_plans"] == [
        "PRE",
        "mine",
    ]
    sections["generate"] = [str(tmp_path / "mine.yaml")]
    assert "graft_positions.generate must be" in problems_of(dict(SWEEP, graft_positions=sections))


@pytest.mark.parametrize(
    "entry, message",
    [
        ("missing.yaml", "graft_positions.plans: Plan file '"),
        ("bad_keys.yaml", "graft_positions.plans: Unknown plan key(s) ['bases']"),
        ("same_name.yaml", "graft_positions.plans: plan name(s) ['FE'] appear more than once"),
        ("task.yaml", "graft_positions.plans: plan(s) 'mine' need models ['finetuned', 'task']"),
    ],
)
def test_plan_file_errors(tmp_path, entry, message):
    "A plan file that is missing, malformed, named like another plan, or needing other models: an error at load."
    (tmp_path / "bad_keys.yaml").write_text("name: x\nbases: pretrained\nrules: []\n")
    write_plan(tmp_path / "same_name.yaml", ["first_actor"], "FE")
    plans_mod.save_plan(plans_mod.GraftPlan("mine", "task", [plans_mod.Rule("finetuned")]), tmp_path / "task.yaml")
    path = sweep_file(tmp_path, graft_positions=dict(plans=["PRE", "SFT", "FE", entry]))
    assert message in problems_of(str(path))


def test_plans_named_alone_must_run_on_each_dataset(tmp_path, caplog):
    "On custom facts (no movie title) the movie plans of a group are left out, and said so; named alone, an error."
    facts, templates = example_files()
    ceos = dict(ceos=dict(kind="custom", facts=str(facts), templates=str(templates)))
    with caplog.at_level(logging.INFO, logger="dwg.pipeline.sweep_checks"):
        load_sweep(dict(SWEEP, datasets=ceos, graft_positions=dict(plans="position")))
    assert "dataset 'ceos' has no position role(s) ['movie_title']; its runs leave out 4 plan(s)" in caplog.text
    msg = problems_of(dict(SWEEP, datasets=ceos, graft_positions=dict(plans=["PRE", "FE+M"])))
    assert "plan 'FE+M' grafts at position role(s) ['movie_title']" in msg
    assert "its roles: company, first_actor, industry, year;" in msg


def test_a_group_none_of_whose_plans_can_run_is_an_error(monkeypatch):
    "A dataset on which no plan of the section can run is an error, not an empty run."
    facts, templates = example_files()
    ceos = dict(ceos=dict(kind="custom", facts=str(facts), templates=str(templates)))
    movies = lambda: [p for p in plans_mod.position_plans() if p.position and "M" in p.position]
    monkeypatch.setitem(plans_mod.FAMILIES, "movies", movies)  # a group of the movie plans only
    msg = problems_of(dict(SWEEP, datasets=ceos, graft_positions=dict(plans="movies")))
    assert "graft_positions.plans: no plan can run on dataset 'ceos'" in msg


@pytest.mark.parametrize(
    "section, change, message",
    [
        ("train", dict(seed="1"), "train.seed must be an integer >= 0, got '1'"),
        ("train", dict(seed=-1), "train.seed must be an integer >= 0"),
        (
            "train",
            dict(seed=0, seeds=[0, 1]),
            "train: seed (0) and seeds ([0, 1]) are both given; seed: N is short for",
        ),
        ("train", dict(seeds=[0, 0]), "train.seeds must be a non-empty list of distinct integers >= 0"),
        (
            "train",
            dict(seeds=2),
            "train.seeds must be a non-empty list of distinct integers >= 0, e.g. [0, 1, 2], got 2",
        ),
        ("figures", dict(k="5"), "figures.k must be an integer >= 1"),
        ("figures", dict(k=0), "figures.k must be an integer >= 1"),
        ("figures", dict(per_dataset="yes"), "figures.per_dataset must be true or false"),
        ("localize", dict(roles=["first_actr", "last_token"]), "localize.roles: ['first_actr'] occur in no prompt"),
        ("localize", dict(roles=["movie_title"]), "localize.roles: ['movie_title'] occur in no prompt of dataset"),
        ("localize", dict(roles=["other", "other"]), "localize.roles: Position roles repeat"),
        ("localize", dict(components=[]), "localize.components must be a list of at least one component"),
        ("localize", dict(validate_components="attn"), "localize.validate_components must be a list of component"),
        ("localize", dict(steps=0), "localize.steps must be an integer >= 1"),
        ("localize", dict(bench_repeat=-1), "localize.bench_repeat must be an integer >= 0"),
        ("localize", dict(target=1.5), "localize.target must be a number in (0, 1]"),
        ("localize", dict(max_fraction=0), "localize.max_fraction must be a number in (0, 1]"),
        ("localize", dict(templates=["relation_statementt"]), "localize.templates: unknown template(s)"),
    ],
)
def test_values_a_notebook_would_refuse(section, change, message):
    "Each value that a run's notebook would refuse after the fine-tunes is an error when the sweep loads."
    base = dict(templates=["relation_statement"], roles=["first_actor", "last_token", "other"])
    sweep = dict(SWEEP, localize=base) if section == "localize" else dict(SWEEP)
    sweep[section] = {**sweep.get(section, {}), **change}
    assert message in problems_of(sweep)


def test_localize_roles_follow_the_chosen_templates():
    "A role is fine where the chosen prompts carry it: movie_title with a template that names the movie."
    loc = dict(templates=["movie_statement"], roles=["first_actor", "movie_title", "last_token", "other"])
    assert load_sweep(dict(SWEEP, localize=loc)).sections["localize"]["roles"] == loc["roles"]


def test_dataset_seed_is_checked():
    "A dataset's seed is an integer >= 0."
    sweep = dict(SWEEP, datasets=dict(fake4=dict(kind="fake_movies_fake_actors", n_facts=4, seed=1.5)))
    assert "datasets.fake4: seed must be an integer >= 0, got 1.5" in problems_of(sweep)


def test_experiment_notebooks_do_not_call_back_into_the_sweep():
    "The experiment notebooks get their plans resolved: none imports dwg.pipeline.sweep."
    for nb in sorted(sw.default_notebooks_dir().glob("*.ipynb")):
        code = "".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
        assert "dwg.pipeline.sweep" not in code, nb.name
