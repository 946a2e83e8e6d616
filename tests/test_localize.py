"""dwg.science.scoring.localize in the sweep: the `localize` stage and profile (the core is tested in
nbs/03a_localize.ipynb)."""

import pytest
import yaml
from dwg.pipeline import sweep as sw
from dwg.pipeline.sweep_file import sweeps_dir


def test_localize_profile_graph():
    "The localize profile: dataset, the relation fine-tune (on every fact), a localize run reading it."
    g = sw.expand("localize")
    assert [r.stage for r in g] == ["datasets", "models", "localize"]
    model, loc = g[1], g[2]
    assert model.params["split"] == "all" and loc.inputs[-1] == model.key and loc.params["split"] == "relation"
    assert loc.params["finetuned"] == f"@{model.key}" and loc.params["pretrained"] == "smollm2-135m"
    assert loc.params["templates"] == [
        "relation_statement",
        "relation_question",
    ]  # the two slot templates: 4 prompts a fact


def test_localize_section_in_another_sweep():
    "A localize section next to the grafting sections shares their SFT model; figures read only the grafting runs."
    d = yaml.safe_load((sweeps_dir() / "smoke.yaml").read_text())
    d["localize"] = dict(split="relation", templates="all", max_fraction=0.5)
    g = sw.expand(d)
    loc = next(r for r in g if r.stage == "localize")
    assert (
        loc.inputs[-1] == next(r for r in g if r.stage == "graft_positions").inputs[-1]
        or next(r for r in g if r.stage == "graft_positions").params["split"] != "relation"
    )
    assert loc.key not in next(r for r in g if r.stage == "figures").inputs


def test_localize_section_errors():
    "Unknown keys and bad options are errors before anything runs."
    d = yaml.safe_load((sweeps_dir() / "localize.yaml").read_text())
    with pytest.raises(sw.SweepError, match="unknown key 'layerz'"):
        sw.load_sweep({**d, "localize": {**d["localize"], "layerz": 3}})
    with pytest.raises(sw.SweepError, match="localize.split"):
        sw.load_sweep({**d, "localize": {**d["localize"], "split": "both"}})
    with pytest.raises(sw.SweepError, match="localize.templates"):
        sw.load_sweep({**d, "localize": {**d["localize"], "templates": ["nope"]}})


def test_localize_notebook_takes_the_section():
    "The real experiment notebook has a parameter for every key of the section (papermill would ignore others)."
    runs = sw.expand("localize")
    sw.check_notebooks(runs, sw.default_notebooks_dir())


def test_localize_notebook_runs(tmp_path, monkeypatch):
    "The experiment notebook end to end on its tiny defaults (random stand-in donor): every output, a plan that loads."
    import json
    import papermill as pm

    monkeypatch.setenv("IN_TEST", "1")  # the kernel removes its demo dataset's temporary directory when it exits
    from dwg.science.scoring.plans import get_plan

    nb = sw.default_notebooks_dir() / "localize.ipynb"
    out = tmp_path / "run"
    pm.execute_notebook(
        str(nb),
        str(tmp_path / "out.ipynb"),
        cwd=str(nb.parent),
        kernel_name="python3",
        parameters=dict(out_dir=str(out), bench_repeat=1),
        progress_bar=False,
    )
    res = json.loads((out / "localize.json").read_text())
    assert set(res["cost"]["over_plain"]) == {"a0", "a1", "ig_step", "model_gradient", "weight_move"}
    assert set(res["cost"]["over_model_gradient"]) == {"a0", "a1", "ig_step"}
    s = res["search"]
    graded = {g["plan"]: g for g in s["graded"]}  # the plan file graded on its own by evaluate_plans
    assert abs(graded["localized"]["recovery"] - s["recovery"]) < 1e-3 and graded["SFT"]["recovery"] == 1.0
    assert 0 < s["size"] < s["fe_lt_cells"] and s["exact_evaluations"] <= s["limit"] == max(
        3, int(0.05 * s["grid_cells"])
    )
    assert get_plan(str(out / "localized.yaml")).rules
    assert (out / "localize_search.png").stat().st_size > 0
