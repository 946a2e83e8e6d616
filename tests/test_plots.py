import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from unittest.mock import patch
from dwg.science.pictures import charts, recovery_charts
from dwg.science.scoring import recovery
from dwg.science.scoring.tables import accuracy_table, paper_tables, plan_label, report_tables
from dwg.pipeline import sweep_file as sweep
from dwg.dev import testing
from dwg.science.scoring import plans
from dwg.science.scoring.plans import FAMILIES, QUARTERS, PaperPlan, Rule

NB = Path(__file__).resolve().parents[1] / "dwg" / "experiments" / "figures.ipynb"


@pytest.fixture(scope="module")
def results():
    "A synthetic results table with rows for every figure, two prompts, 12 facts."
    return testing.synthetic_paper_results(n_facts=12, seed=0)


def _layers(spec):
    return spec["spec"]["layer"] if "spec" in spec else spec["layer"]


def _mark(layer):
    return layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]


def test_accuracy_table_bootstrap(results):
    "Intervals contain the accuracy, are deterministic per seed, and narrow with more facts."
    acc = accuracy_table(results, k=5, n_boot=200)
    assert ((acc.lo <= acc.accuracy + 1e-12) & (acc.accuracy <= acc.hi + 1e-12)).all()
    pd.testing.assert_frame_equal(acc, accuracy_table(results, k=5, n_boot=200))
    assert not np.allclose(acc.lo, accuracy_table(results, k=5, n_boot=200, seed=7).lo)

    def width(n):
        a = accuracy_table(testing.synthetic_results(["FE"], n_facts=n, seed=1), by=["plan"], n_boot=400)
        r = a[a.metric == "top-1"].iloc[0]
        return r.hi - r.lo

    assert width(200) < width(20) / 2


def test_tables_need_no_altair():
    "`dwg.accuracy_table` and `dwg.recovery_table` run on the core install: neither imports altair (the plots extra)."
    import subprocess
    import sys

    script = """
import sys, dwg, pandas as pd
rows = pd.DataFrame(dict(plan=["PRE", "SFT"] * 2, fact_id=["a", "a", "b", "b"], rank=[3, 0, 9, 0],
                         logprob=[-5.0, -1.0, -6.0, -2.0], model="m", dataset="d", template="t"))
acc = dwg.accuracy_table(rows, n_boot=10)
assert list(acc[acc.metric == "top-1"].accuracy) == [0.0, 1.0], acc
assert list(dwg.recovery_table(rows, n_boot=10).recovery) == [0.0, 1.0]
assert "altair" not in sys.modules, "altair was imported"
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    probe = "import sys, dwg; dwg.paper_figures; print('altair' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "True"


def test_accuracy_table_pools_facts_not_rows():
    "Pooling prompts averages each fact first: a fact with more rows does not weigh more."
    df = pd.DataFrame(
        dict(
            plan="X", fact_id=["a", "a", "a", "b"], template=["t1", "t2", "t3", "t1"], rank=[0, 0, 0, 9], skipped=False
        )
    )
    acc = accuracy_table(df, k=5, by=["plan"], n_boot=50)
    assert acc.set_index("metric").loc["top-1", "accuracy"] == 0.5  # (1 + 0) / 2 facts, not 3/4 rows
    assert acc.n_facts.iloc[0] == 2 and acc.n.iloc[0] == 4


def test_accuracy_table_groups_match_a_direct_computation(results):
    "Top-1 of every group (four key columns, one of them missing in some rows) is the mean over facts of rank == 0."
    df = results.copy()
    df.loc[df.index[::7], "template"] = None  # a missing key is a group of its own
    by = ["model", "dataset", "plan", "template"]
    acc = accuracy_table(df, k=5, by=by, n_boot=10)
    got = acc[acc.metric == "top-1"].set_index(by).accuracy
    ok = df[~df.skipped.fillna(False).astype(bool)].assign(top1=lambda d: (d["rank"] == 0).astype(float))
    want = ok.groupby(by + ["fact_id"], dropna=False).top1.mean().groupby(level=by, dropna=False).mean()
    assert len(got) == len(want) > 10 and df.template.isna().any()
    pd.testing.assert_series_equal(got.sort_index(), want.reindex(got.index).sort_index(), check_names=False)


def test_position_chart_spec(results):
    "Figure 1: ordered bars (plan x metric), error bars, PRE/SFT rules, a panel per prompt."
    d = charts.position_chart(results, k=5, n_boot=50).to_dict()
    assert d["facet"]["field"] == "template"
    layers = _layers(d)
    assert [_mark(l) for l in layers] == ["bar", "rule", "rule"]
    enc = layers[0]["encoding"]
    assert enc["x"]["sort"] == ["PRE", "SFT", "FE", "LT", "FE+LT", "(FE+LT)ᶜ", "not FE", "not LT"]
    assert (enc["xOffset"]["field"], enc["color"]["field"]) == ("metric", "metric")
    assert enc["color"]["scale"]["domain"] == ["top-1", "top-5"]
    assert (layers[1]["encoding"]["y"]["field"], layers[1]["encoding"]["y2"]["field"]) == ("lo", "hi")
    assert layers[2]["encoding"]["strokeDash"]["sort"] == ["PRE", "SFT"]


def test_other_chart_specs(results):
    "Figures 2-5: the right plans, marks, encodings and facets."
    d2 = charts.movie_chart(results, templates="pool", n_boot=50).to_dict()
    assert "facet" not in d2 and _layers(d2)[0]["encoding"]["x"]["sort"] == [
        "FE",
        "LT",
        "FE+LT",
        "M",
        "FE+M",
        "M+LT",
        "FE+M+LT",
    ]
    d3 = charts.component_chart(results, n_boot=50).to_dict()
    assert d3["facet"]["row"]["field"] == "panel" and d3["facet"]["column"]["field"] == "variant"
    assert _layers(d3)[0]["encoding"]["xOffset"]["field"] == "layers"
    assert _layers(d3)[2]["encoding"]["strokeDash"]["sort"] == ["TASK", "RELATION", "FE+LT (layers)"]
    d4 = charts.depth_heatmap(results, n_boot=50).to_dict()
    assert [_mark(l) for l in _layers(d4)] == ["rect", "text"]
    assert d4["facet"]["column"]["field"] == "position"
    assert _layers(d4)[0]["encoding"]["y"]["sort"] == ["1st quarter", "2nd quarter", "3rd quarter", "4th quarter"]
    d5 = charts.generation_chart(results, n_boot=50).to_dict()
    assert _layers(d5)[0]["encoding"]["color"]["scale"]["domain"] == ["top-1", "exact match"]
    sel = charts.position_chart(results, templates="select", n_boot=20).to_dict()
    assert sel["params"][0]["bind"]["input"] == "select"


def test_save_chart_offline(results, tmp_path):
    "PNG, SVG and self-contained HTML are written (no CDN script), with no temporary files left."
    paths = charts.save_chart(charts.depth_heatmap(results, n_boot=20), tmp_path / "depth")
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert "<svg" in paths["svg"].read_text()[:500]
    html = paths["html"].read_text()
    assert "vegaEmbed" in html and not re.search(r'<script[^>]+src="https?://', html)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["depth.html", "depth.png", "depth.svg"]
    assert paths["png"].stat().st_size < 300_000


def _write_run(d: Path, rows: pd.DataFrame, finished=True):
    d.mkdir(parents=True)
    (d / "results.jsonl").write_text(rows.to_json(orient="records", lines=True))
    if finished:
        (d / "run.json").write_text(json.dumps({"config": {}}))


def test_figures_notebook(tmp_path, results):
    "The figures notebook reads finished runs only, saves every figure and writes tables that match accuracy_table."
    import papermill as pm

    runs, out = tmp_path / "runs", tmp_path / "figs"
    pos = results[results.experiment == "positions"]
    _write_run(runs / "results" / "pos1", pos)
    _write_run(runs / "results" / "comp1", results[results.experiment == "components"])
    _write_run(runs / "results" / "half", pos.assign(rank=0), finished=False)  # no run.json: must be ignored
    pm.execute_notebook(
        str(NB),
        str(tmp_path / "out.ipynb"),
        cwd=str(NB.parent),
        kernel_name="python3",
        parameters=dict(runs_dir=str(runs), out_dir=str(out), k=5, n_boot=200),
        progress_bar=False,
    )
    names = [
        "positions",
        "positions_all_prompts",
        "movie_spans",
        "components",
        "depth",
        "generation",
        "methods",
        "positions_recovery",
        "movie_spans_recovery",
        "components_recovery",
        "depth_recovery",
        "methods_recovery",
        "methods_pairs",
    ]
    assert {p.name for p in out.iterdir()} == {f"{n}.{f}" for n in names for f in ("png", "svg", "html")} | {
        "accuracy.csv",
        "positions.csv",
        "components.csv",
        "methods.csv",
        "recovery.csv",
        "claims.csv",
        "chance.csv",
        "shapley.csv",  # the results have TASK, RELATION and the LT plans with and without the head
        "tables.md",
        "report.html",
        "run.json",
    }
    for n in names:  # every PNG is a picture of a chart: a real size, and far more than a blank canvas compresses to
        png = (out / f"{n}.png").read_bytes()
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert png[:4] == b"\x89PNG" and width >= 300 and height >= 150 and len(png) > 15_000, (
            n,
            width,
            height,
            len(png),
        )
    record = json.loads((out / "run.json").read_text())
    assert record["synthetic_data"] is False and len(record["runs"]) == 2
    # the report: one page, the claims file's hash recorded, every figure embedded, nothing fetched from the network
    html = (out / "report.html").read_text()
    assert len(record["claims_sha256"]) == 64 and record["claims_sha256"] in html
    assert html.count("data:image/") >= len(names) and 'src="http' not in html
    assert "SYNTHETIC" not in (out / "positions.svg").read_text()
    # The table behind figure 1 is accuracy_table's, prompts pooled, from the finished runs only:
    want = accuracy_table(pos, k=5, by=["model", "dataset", "plan"], n_boot=200)
    got = pd.read_csv(out / "positions.csv").set_index("plan")
    for plan in ["SFT", "(FE+LT)^C"]:
        acc = want[(want.plan == plan) & (want.metric == "top-1")].iloc[0]
        assert got.loc[plan, "top-1"] == f"{acc.accuracy:.2f} [{acc.lo:.2f}, {acc.hi:.2f}]"
    md = (out / "tables.md").read_text()
    assert "Figure 1" in md and "Figure 3" in md and "| LT:o+ffn@last_half |" in md
    long = pd.read_csv(out / "accuracy.csv")
    assert set(long.template) == {"relation_statement", "costar", "all prompts"}
    # recovery.csv: the position run against PRE/SFT, the component run against TASK/RELATION, checked by hand
    rec = pd.read_csv(out / "recovery.csv").set_index("plan")
    for run, checked, (base, full) in [
        (pos, ["graft:LT@fourth_quarter", "patch-resid:FE@first_quarter"], ("PRE", "SFT")),
        (results[results.experiment == "components"], ["LT:o+ffn@all"], ("TASK", "RELATION")),
    ]:
        ok = run[~run.skipped.astype(bool)]
        lp = ok.groupby(["plan", "fact_id"]).logprob.mean().unstack("plan")
        for plan in checked:
            v = lp[[plan, base, full]].dropna().mean()
            assert abs(rec.loc[plan, "recovery"] - (v[plan] - v[base]) / (v[full] - v[base])) < 1e-9
            assert rec.loc[plan, "lo"] <= rec.loc[plan, "recovery"] <= rec.loc[plan, "hi"]
            assert (rec.loc[plan, "base"], rec.loc[plan, "full"]) == (base, full)
    assert got.loc["SFT", "recovery"] == "1.00 [1.00, 1.00]" and "mean prob" in got  # beside accuracy in the tables
    assert "Grafting vs activation patching" in md and "| graft | LT |" in md


def test_figures_notebook_no_results(tmp_path):
    "With no finished results it fails clearly when synthetic='never' (the demo mode is run by nbdev_test)."
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="No finished results"):
        pm.execute_notebook(
            str(NB),
            str(tmp_path / "out.ipynb"),
            cwd=str(NB.parent),
            kernel_name="python3",
            parameters=dict(runs_dir=str(tmp_path), out_dir=str(tmp_path / "f"), synthetic="never"),
            progress_bar=False,
        )


def _movie_depth_family():
    "A new plan family: the fine-tuned FFNs at the movie title, one layer quarter at a time."
    return [
        PaperPlan(
            f"M:ffn@{q}",
            "pretrained",
            [Rule("finetuned", ["movie_title"], q, ["ffn"])],
            figures=("depth",),
            position="M",
            component_set="ffn",
            layer_group=q,
        )
        for q in QUARTERS
    ]


def test_a_new_plan_family_is_one_edit():
    """Adding a family to dwg.science.scoring.plans.FAMILIES (the one edit) makes it a sweep group, its plans runnable
    by the position stage, and a column of the depth figure; nothing in dwg.pipeline.sweep or
    dwg.science.pictures.charts changes."""
    with patch.dict(FAMILIES, movie_depth=_movie_depth_family):
        names = [f"M:ffn@{q}" for q in QUARTERS]
        assert plans.plan_groups()["movie_depth"] == names
        assert sweep.stage_plans(["movie_depth"], "graft_positions", "test") == names
        df = testing.synthetic_results(names + plans.figure_order("depth") + ["PRE", "SFT"], n_facts=6)
        d = charts.depth_heatmap(df, n_boot=20).to_dict()
        assert d["facet"]["column"]["sort"] == ["graft at FE", "graft at LT", "graft at M"]
        drawn = pd.DataFrame(list(d["datasets"].values())[0])
        assert set(drawn[drawn.position == "graft at M"].plan) == set(names)
    assert "movie_depth" not in plans.plan_groups()


# ---- What a reader sees: every figure the sweeps draw, read back from Vega's rendered scene (tests/_figure_layout.py)
from _figure_layout import scene, misplaced
from dwg.science.pictures import localize_plots

METHOD_PLANS = [p for p in plans.figure_order("methods") if p not in ("PRE", "SFT")]


@pytest.fixture(scope="module")
def sweep_runs(results):
    "Results as an embedded sweep writes them: a position run, a methods run (with its own PRE/SFT), a component run."
    pos = results[results.experiment == "positions"]
    return pd.concat(
        [
            pos[pos.plan.isin(METHOD_PLANS + ["PRE", "SFT"])].assign(run_id="graft_methods/m1", exact_match=None),
            pos[~pos.plan.isin(METHOD_PLANS)].assign(run_id="graft_positions/p1"),
            results[results.experiment == "components"].assign(run_id="graft_components/c1"),
        ],
        ignore_index=True,
    )


def _sweep_figures(df) -> dict:
    "Every figure the figures notebook draws from `df` (accuracy, recovery and, with several settings, the overview)."
    tables = paper_tables(df, n_boot=30)
    figs = charts.paper_figures(df, n_boot=30, tables=tables, verbose=False)
    figs.update(recovery_charts.recovery_figures(recovery.recovery_table(df, n_boot=30), ""))
    if tables["pooled"][["model", "dataset"]].drop_duplicates().shape[0] > 1:
        figs["overview"] = charts.overview_chart(tables["pooled"])
    return figs


# figure -> the category axes along which its marks must sit inside their band, and the marks checked
READS = {
    "positions": [("x", "rect"), ("x", "rule")],
    "positions_all_prompts": [("x", "rect"), ("x", "rule")],
    "movie_spans": [("x", "rect"), ("x", "rule")],
    "generation": [("x", "rect"), ("x", "rule")],
    "components": [("x", "rect"), ("x", "rule")],
    "depth": [("x", "rect"), ("y", "rect")],
    "methods": [("x", "symbol")],
    "positions_recovery": [("y", "rect")],
    "movie_spans_recovery": [("y", "rect")],
    "components_recovery": [("y", "rect")],
    "depth_recovery": [("x", "rect"), ("y", "rect")],
    "methods_recovery": [("x", "symbol")],
    "methods_pairs": [("y", "symbol")],
    "overview": [("x", "rect"), ("y", "rect")],
}


def _check_reads(name, chart):
    "Every checked mark inside its category band in every panel that has that axis; returns the panels."
    panels, _ = scene(chart)
    assert panels, f"{name}: nothing drawn"
    for axis, kind in READS[name]:
        layer = "layer_1" if kind == "rule" else None  # rules: the error bars (layer 2 holds the reference lines)
        checked = [p for p in panels if (p.x_labels if axis == "x" else p.y_labels) and p.items(kind, layer)]
        assert checked, f"{name}: no panel with {kind} marks on a labelled {axis} axis"
        for p in checked:
            assert misplaced(p, kind, axis, layer) == [], f"{name}: {kind} marks outside their {axis} band"
    return panels


def test_position_figures_draw_the_position_run_only(sweep_runs):
    """Figures 1 and 5 draw one block (the position run): a methods run holding only the PRE/SFT references is not a
    position figure; bars and error bars sit in their plan's band; plans in order; both reference rules drawn."""
    figs = _sweep_figures(sweep_runs)
    order = [plan_label(p) for p in plans.figure_order("positions")]
    for name, metrics in [("positions", 2), ("positions_all_prompts", 2), ("generation", 2)]:
        spec = figs[name].to_dict()
        assert "vconcat" not in spec and "graft_methods" not in json.dumps(spec), f"{name}: the methods run is drawn"
        panels = _check_reads(name, figs[name])
        assert len(panels) == (1 if name == "positions_all_prompts" else 2)  # one panel per prompt, or pooled
        for p in panels:
            assert [t for t, _ in p.x_labels] == order
            assert len(p.items("rect", "layer_0")) == len(order) * metrics
            assert len(p.items("rule", "layer_2")) == 2 * metrics  # PRE and SFT, one rule per metric


def test_movie_figures_need_a_movie_plan(results):
    """A run without the movie plans (a custom dataset has no movie span) gets no movie-span figure, accuracy or
    recovery: FE, LT and FE+LT alone make figure 1, not figure 2 (they did, titled 'with the movie span')."""
    pos = results[results.experiment == "positions"]
    no_movie = pos[~pos.plan.isin(["M", "FE+M", "M+LT", "FE+M+LT"])]
    assert set(no_movie.plan) >= {"FE", "LT", "FE+LT"}
    with pytest.raises(ValueError, match="movie-span"):
        charts.movie_chart(no_movie, templates="pool", n_boot=20)
    with pytest.raises(ValueError, match="movie_spans"):
        recovery_charts.recovery_bars(recovery.recovery_table(no_movie, n_boot=20), "movie_spans")
    assert "movie_spans" not in charts.paper_figures(no_movie, n_boot=20, verbose=False)
    assert "movie_spans" in charts.paper_figures(pos, n_boot=20, verbose=False)


def _templates_drawn(chart) -> set:
    "The prompt templates in the data of a chart's spec."
    return {row["template"] for rows in chart.to_dict()["datasets"].values() for row in rows if "template" in row}


def test_movie_figure_has_no_panel_for_a_prompt_without_the_movie(results):
    """A prompt without the movie title (the paper's slot templates) has no M plans: the movie-span figure gives it no
    panel, instead of a panel of FE / LT / FE+LT whose missing M bars read as zero."""
    pos = results[results.experiment == "positions"]
    movie = ["M", "FE+M", "M+LT", "FE+M+LT"]
    no_m = pos[~((pos.template == "relation_statement") & pos.plan.isin(movie))]
    assert _templates_drawn(charts.movie_chart(pos, n_boot=20)) == {"relation_statement", "costar"}
    assert _templates_drawn(charts.movie_chart(no_m, n_boot=20)) == {"costar"}
    assert _templates_drawn(charts.position_chart(no_m, n_boot=20)) == {"relation_statement", "costar"}


def test_each_run_lays_out_its_own_categories(results):
    """Two position runs with different plan sets (the smaller one first): one block each, each block's bars inside
    its own categories (a grouping offset shared across blocks spreads the bigger block's bars over several plans)."""
    pos = results[results.experiment == "positions"]
    few = ["PRE", "SFT", "FE", "LT"]
    df = pd.concat(
        [pos[pos.plan.isin(few)].assign(dataset="setting-a"), pos.assign(dataset="setting-b")], ignore_index=True
    )
    for templates in ["facet", "pool"]:
        chart = charts.position_chart(df, templates=templates, n_boot=30)
        assert len(chart.to_dict()["vconcat"]) == 2
        panels = _check_reads("positions", chart)
        labels = {tuple(t for t, _ in p.x_labels) for p in panels}
        assert labels == {tuple(few), tuple(plan_label(p) for p in plans.figure_order("positions"))}


def test_every_sweep_figure_reads(sweep_runs):
    "Every figure of the figures notebook: marks inside their category bands, with a second setting for the overview."
    second = sweep_runs.assign(dataset="other-facts", run_id=sweep_runs.run_id + "b")
    figs = _sweep_figures(pd.concat([sweep_runs, second], ignore_index=True))
    assert set(READS) <= set(figs) | {"positions"}
    for name, chart in figs.items():
        _check_reads(name, chart)


def test_localisation_heatmaps_read():
    """The localisation heatmaps: one rect per cell inside its layer and role bands; a huge cell is clipped, not the
    scale."""
    rng = np.random.default_rng(0)
    rows = [
        dict(cell=f"{r}@{l}:{c}", role=r, layer=l, component=c, ig=float(rng.normal(0, 0.01)))
        for c in ["q", "down"]
        for r in ["first_actor", "last_token", "other"]
        for l in range(6)
    ]
    rows.append(dict(cell="last_token@global:lm_head", role="last_token", layer="global", component="lm_head", ig=5.0))
    t = pd.DataFrame(rows)
    panels, titles = scene(localize_plots.cell_heatmaps(t, ["ig"]))
    assert len(panels) == 3 and sum(len(p.items("rect", "layer_0")) for p in panels) == len(t)
    for p in panels:
        assert misplaced(p, "rect", "x", "layer_0") == [] and misplaced(p, "rect", "y", "layer_0") == []
    outlined = [it for p in panels for it in p.items("rect", "layer_1")]
    assert len(outlined) == 1 and any("outlined: 1 cell" in s for s in titles)


def test_report_tables_hold_the_runs_of_their_own_plans(sweep_runs):
    "The tables behind figures 1 and 3 hold the runs that have their own plans: the methods run's PRE/SFT are not one."
    rep = report_tables(sweep_runs, n_boot=30)
    assert "run_id" not in rep["positions"] and "run_id" not in rep["components"]  # one run each: no run column
    assert list(rep["positions"].plan) == plans.figure_order("positions")
