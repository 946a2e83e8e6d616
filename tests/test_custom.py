"""Your own facts (dwg.custom, kind custom) in sweeps: checked when the sweep loads, ids from the files' content, and
the smoke graph (tiny model) on the packaged example end to end."""
import shutil
from pathlib import Path
import pytest, yaml
from dwg import sweep as sw
from dwg.custom import example_files
from _sweep_helpers import sweep_cli, states, results_table


def custom_sweep(tmp_path, facts=None, **dataset):
    "The smoke profile on the packaged example (copied into tmp_path/data, paths relative to the sweep file)."
    data = tmp_path / "data"
    if not data.exists():
        data.mkdir(parents=True)
        for f in example_files(): shutil.copy(f, data / f.name)
    if facts is not None: (data / "facts.csv").write_text(facts)
    d = yaml.safe_load((sw.sweeps_dir() / "smoke.yaml").read_text())
    d["datasets"] = {"ceos": dict(kind="custom", facts="data/facts.csv", templates="data/templates.yaml", n_facts=4,
                                  **dataset)}
    for sec in ("graft_positions", "graft_components"): d[sec]["templates"] = ["new_ceo", "qa_who_runs"]
    d["graft_positions"]["plans"] = ["position"]               # kept short: the smoke test covers every plan
    d["graft_methods"].update(templates=["new_ceo"], plans="methods")
    path = tmp_path / "custom_smoke.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def test_custom_datasets_are_checked_when_the_sweep_loads(tmp_path):
    "A bad facts file, a template name the dataset lacks, or files given to a built-in kind: errors before anything runs."
    good = sw.load_sweep(str(custom_sweep(tmp_path)))
    assert good["datasets"]["ceos"]["facts"] == str((tmp_path / "data" / "facts.csv").resolve())
    bad = custom_sweep(tmp_path / "b", facts="company,ceo,industry,city,year\nAcme,Jo Bo,x,y,1\nAcme,Al Ma,x,y,2\n")
    with pytest.raises(sw.SweepError, match=r"datasets.ceos: .*facts.csv, line 3: company 'Acme' is already on line 2"):
        sw.load_sweep(str(bad))
    d = yaml.safe_load(custom_sweep(tmp_path).read_text())
    d["graft_positions"]["templates"] = "paper"      # the paper's prompts are movie prompts
    with pytest.raises(sw.SweepError, match=r"unknown template\(s\) \['stars_alongside'.* for dataset 'ceos'"):
        sw.load_sweep({**d, "datasets": {"ceos": {**d["datasets"]["ceos"],
                                                  "facts": str(tmp_path / "data" / "facts.csv"),
                                                  "templates": str(tmp_path / "data" / "templates.yaml")}}})
    d = yaml.safe_load((sw.sweeps_dir() / "smoke.yaml").read_text())
    d["datasets"]["fake4"]["facts"] = "x.csv"
    with pytest.raises(sw.SweepError, match="only go with kind custom"): sw.load_sweep(d)
    d["datasets"]["fake4"] = dict(kind="custom", templates="t.yaml")
    with pytest.raises(sw.SweepError, match="kind custom needs 'facts:'"): sw.load_sweep(d)


def test_custom_dataset_ids_follow_the_files_content(tmp_path):
    "The same files in two places give the same ids; an edited facts file renews the dataset and what depends on it."
    a = [r.key for r in sw.expand(str(custom_sweep(tmp_path / "a")))]
    assert a == [r.key for r in sw.expand(str(custom_sweep(tmp_path / "b")))]
    facts = example_files()[0].read_text().replace("Maren Holtvik", "Maren Holtvick")
    c = {r.key for r in sw.expand(str(custom_sweep(tmp_path / "c", facts=facts)))}
    assert not c & set(a)                                     # every run reads the dataset
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
    assert "M" not in plans                                   # no movie span: skipped, so not in the table
