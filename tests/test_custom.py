"""Your own facts (dwg.science.facts.custom, kind custom) in sweeps: checked when the sweep loads, ids from the files'
content, and the smoke graph (tiny model) on the packaged example end to end."""

import shutil
import pytest
import yaml
from dwg.pipeline import sweep as sw
from dwg.pipeline.sweep_file import sweeps_dir
from dwg.science.facts.custom import example_files
from _sweep_helpers import sweep_cli, states, results_table


def custom_sweep(tmp_path, facts=None, **dataset):
    "The smoke profile on the packaged example (copied into tmp_path/data, paths relative to the sweep file)."
    data = tmp_path / "data"
    if not data.exists():
        data.mkdir(parents=True)
        for f in example_files():
            shutil.copy(f, data / f.name)
    if facts is not None:
        (data / "facts.csv").write_text(facts)
    d = yaml.safe_load((sweeps_dir() / "smoke.yaml").read_text())
    d["datasets"] = {
        "ceos": dict(kind="custom", facts="data/facts.csv", templates="data/templates.yaml", n_facts=4, **dataset)
    }
    for sec in ("graft_positions", "graft_components"):
        d[sec]["templates"] = ["new_ceo", "qa_who_runs"]
    d["graft_positions"]["plans"] = ["position"]  # kept short: the smoke test covers every plan
    d["graft_methods"].update(templates=["new_ceo"], plans="methods")
    path = tmp_path / "custom_smoke.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def test_custom_datasets_are_checked_when_the_sweep_loads(tmp_path):
    """A bad facts file, a template name the dataset lacks, or files given to a built-in kind: errors before anything
    runs."""
    good = sw.load_sweep(str(custom_sweep(tmp_path)))
    assert good.datasets["ceos"]["facts"] == str((tmp_path / "data" / "facts.csv").resolve())
    bad = custom_sweep(tmp_path / "b", facts="company,ceo,industry,city,year\nAcme,Jo Bo,x,y,1\nAcme,Al Ma,x,y,2\n")
    with pytest.raises(sw.SweepError, match=r"datasets.ceos: .*facts.csv, line 3: company 'Acme' is already on line 2"):
        sw.load_sweep(str(bad))
    d = yaml.safe_load(custom_sweep(tmp_path).read_text())
    d["graft_positions"]["templates"] = "paper"  # the paper's prompts are movie prompts
    with pytest.raises(sw.SweepError, match=r"unknown template\(s\) \['relation_statement'.* for dataset 'ceos'"):
        sw.load_sweep(
            {
                **d,
                "datasets": {
                    "ceos": {
                        **d["datasets"]["ceos"],
                        "facts": str(tmp_path / "data" / "facts.csv"),
                        "templates": str(tmp_path / "data" / "templates.yaml"),
                    }
                },
            }
        )
    d = yaml.safe_load((sweeps_dir() / "smoke.yaml").read_text())
    d["datasets"]["fake4"]["facts"] = "x.csv"
    with pytest.raises(sw.SweepError, match="only go with kind custom"):
        sw.load_sweep(d)
    d["datasets"]["fake4"] = dict(kind="custom", templates="t.yaml")
    with pytest.raises(sw.SweepError, match="kind custom needs 'facts:'"):
        sw.load_sweep(d)


def test_custom_dataset_ids_follow_the_files_content(tmp_path):
    "The same files in two places give the same ids; an edited facts file renews the dataset and what depends on it."
    a = [r.key for r in sw.expand(str(custom_sweep(tmp_path / "a")))]
    assert a == [r.key for r in sw.expand(str(custom_sweep(tmp_path / "b")))]
    facts = example_files()[0].read_text().replace("Maren Holtvik", "Maren Holtvick")
    c = {r.key for r in sw.expand(str(custom_sweep(tmp_path / "c", facts=facts)))}
    assert not c & set(a)  # every run reads the dataset
    assert sw.expand(str(custom_sweep(tmp_path / "a")))[0].params["n_facts"] == 4


def test_custom_smoke_graph_runs(tmp_path):
    "The smoke graph (tiny model) on the packaged example: every run finishes; FE plans graft the company's tokens."
    rd = tmp_path / "runs"
    r = sweep_cli("run", "--sweep", custom_sweep(tmp_path), "--runs", rd, "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert {i["state"] for i in states(rd).values()} == {"done"}
    table = results_table(rd)
    plans = {k[1] for k in table}
    assert {"PRE", "SFT", "FE", "FE+LT", "(FE+LT)^C", "LT:o+ffn@last_half"} <= plans
    assert {k[3] for k in table} == {"new_ceo", "qa_who_runs"}
    assert "M" not in plans  # no movie span: left out of the run, so not in the table


def _drugs(tmp_path):
    "A drugs-like custom dataset: each drug's maker is a field that appears in the prompts (a role plans can name)."
    facts = tmp_path / "drugs.csv"
    facts.write_text(
        "drug,maker,disease\nVeltrazine,Harrowgate Pharma,migraine\nOskapril,Lindqvist Labs,gout\n"
        "Tramedol,Corvane Biologics,asthma\nPelucid,Ashby and Rook,eczema\n"
    )
    templates = tmp_path / "drugs.yaml"
    templates.write_text(
        yaml.safe_dump(
            dict(
                first_entity="drug",
                target="disease",
                train=dict(a="{drug}, made by {maker}, treats {disease}.", b="Q: What does {drug} treat? A: {disease}"),
                eval=dict(
                    maker_first="Made by {maker}, the drug {drug} treats {disease}",
                    drug_first="{drug} from {maker} is taken for {disease}",
                ),
            )
        )
    )
    from dwg.science.facts.custom import create_custom_dataset
    from dwg.science.facts.data import load_split

    out = create_custom_dataset(facts, templates, tmp_path / "ds", task_fraction=0.5)
    return load_split(out, "eval")


def test_a_plan_grafts_at_a_custom_field(tmp_path):
    """`positions: [maker]` on a custom dataset grafts exactly the maker's tokens: the plan's mask equals one made by
    hand from where the maker's name sits in each prompt, and the grafted logits equal a graft with that hand mask."""
    import torch
    from dwg.engine.graft import graft
    from dwg.engine.prompts import last_logits, prepare
    from dwg.science.scoring.evaluate import evaluate_plans, rule_masks
    from dwg.science.facts.models import load
    from dwg.science.scoring.plans import GraftPlan, Rule

    examples = _drugs(tmp_path)
    base, tok = load("tiny-llama")
    donor, _ = load("tiny-llama", seed=1)
    plan = GraftPlan("maker", "pretrained", [Rule("finetuned", ["maker"])])
    prep = prepare(tok, examples)
    (mask,), skipped = rule_masks(plan, prep)
    assert not skipped
    hand = torch.zeros_like(mask)
    for i, e in enumerate(examples):  # by hand: the tokens whose characters overlap the maker's name in the prompt
        fact_maker = next(
            v
            for v in ("Harrowgate Pharma", "Lindqvist Labs", "Corvane Biologics", "Ashby and Rook")
            if v in e["prompt"]
        )
        a = e["prompt"].index(fact_maker)
        b = a + len(fact_maker)
        for j, (s, t) in enumerate(prep.offsets[i]):
            if s < b and t > a and t > s:
                hand[i, prep.pads[i] + j] = True
    assert torch.equal(mask, hand) and hand.sum() >= 2 * len(examples)
    with graft(base, donor, mask):
        by_plan = last_logits(base, prep.batch)
    with graft(base, donor, hand):
        by_hand = last_logits(base, prep.batch)
    assert torch.equal(by_plan, by_hand)
    rows = evaluate_plans([plan], dict(pretrained=base, finetuned=donor), tok, examples, progress=False)
    assert len(rows) == len(examples) and not any(r["skipped"] for r in rows)
    bad = GraftPlan("manufacturer", "pretrained", [Rule("finetuned", ["manufacturer", "last_token"])])
    with pytest.raises(
        ValueError,
        match=r"\['manufacturer'\], which no evaluation example has. The examples' roles: "
        r"drug, first_actor, maker",
    ):
        evaluate_plans([bad], dict(pretrained=base, finetuned=donor), tok, examples, progress=False)
