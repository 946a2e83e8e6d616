"""The benchmark runs end to end on a tiny model (its numbers are for the embedded model; no timing is asserted)."""

import json
import math
import subprocess
import sys

from dwg.dev.bench import main
from dwg.science.scoring.plans import plan_groups


def test_benchmark_runs_and_engine_matches_original(tmp_path):
    # in its own process, as the README runs it: peak memory (ru_maxrss) is per process, and a test that ran before in
    # this one (a SmolLM2 load) would leave a peak that every reading here falls under
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "dwg.dev.bench",
            "--model",
            "tiny-llama",
            "--batch",
            "8",
            "--n-original",
            "2",
            "--n-facts",
            "8",
            "--stage",
            "components,hybrid,patch-resid:LT@layer_1,patch-blocks:FE@layer_1",
            "--stage-facts",
            "2",
            "--stage-batch",
            "4",
            "--stage-generate",
            "hybrid",
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    res = json.loads(out.read_text())
    assert res["batch"] == 8
    assert res["donor"] == str(tmp_path / "donor")  # the stand-in donor went to --workdir
    assert "speedup_per_example" in run.stdout
    assert res["max_abs_dprob"] < 1e-5
    # the printed ratios are the ratios of the printed times (what the README quotes)
    assert math.isclose(res["speedup_per_example"], res["original_s_per_example"] / res["engine_s_per_example"])
    assert math.isclose(res["grafted_over_plain"], res["grafted_forward_s"] / res["plain_forward_s"])
    assert math.isclose(
        res["patched_over_donor_plus_plain"],
        res["patched_forward_s"] / (res["donor_forward_s"] + res["plain_forward_s_patch_round"]),
    )
    assert math.isclose(res["peak_rss_over_weights"], res["peak_rss_mb_engine"] / res["weights_mb"])
    assert res["added_rss_over_weights"] < res["peak_rss_over_weights"]
    assert 0 < res["grafted_fraction"] <= 1 and 0 <= res["padding_fraction"] < 1
    # the LoRA donor (a stand-in adapter in --workdir): its graft equals grafting peft's merged model, its ratios are
    # the ratios of its printed times, and its memory was read before the full donor was loaded
    assert res["lora"] == str(tmp_path / "adapter") and res["lora_max_abs_dprob_vs_merged"] < 1e-5
    assert math.isclose(res["lora_grafted_over_plain"], res["lora_grafted_forward_s"] / res["lora_plain_forward_s"])
    assert 0 < res["lora_added_rss_over_weights"] <= res["added_rss_over_weights"] and res["lora_adapter_mb"] > 0
    # the peaks only grow: plain forward, then the adapter's graft, then the full donor's
    assert 0 < res["plain_added_rss_over_weights"] <= res["lora_added_rss_over_weights"]
    assert res["lora_extra_rss_over_weights"] <= res["donor_extra_rss_over_weights"]
    # a full donor's weights show at the peak; the adapter's graft adds far less (so its reading came before the donor)
    assert res["donor_extra_rss_over_weights"] > 0.9 > res["lora_extra_rss_over_weights"]
    # the stage timing: both ways give the same numbers, the ratio is that of the printed times
    assert res["stage_size"].startswith("components,hybrid,patch-") and res["stage_max_abs_dprob"] < 1e-5
    assert math.isclose(res["stage_speedup"], res["stage_before_s"] / res["stage_now_s"])
    # decoding every row to the chunk's longest target gives the same rows (the hybrids decode whole names here)
    assert res["stage_own_length_same_rows"] and math.isclose(
        res["stage_own_length_speedup"], res["stage_every_row_s"] / res["stage_now_s"]
    )
    # scoring without the distractor ranks gives the same rows but for them; the chance cost is the printed ratio
    assert res["stage_no_chance_same_rows"] and math.isclose(
        res["stage_chance_cost"], res["stage_now_s"] / res["stage_no_chance_s"]
    )
    # the patching plans: recording the donor once a site set, as before, gives the same rows
    assert res["stage_donor_once_same_rows"] and math.isclose(
        res["stage_donor_once_speedup"], res["stage_donor_per_site_s"] / res["stage_now_s"]
    )
    # the stage's matrix-product work at this CPU's matmul rate, against its time: counted, and the printed ratio
    assert res["stage_tflop"] > 0 and res["stage_matmul_gflops"] > 0
    assert math.isclose(res["stage_at_matmul_rate_s"], res["stage_tflop"] * 1e3 / res["stage_matmul_gflops"])
    assert math.isclose(res["stage_share_of_matmul_rate"], res["stage_at_matmul_rate_s"] / res["stage_now_s"])
    n_plans = len(plan_groups()["position"])
    assert res["position_sweep_size"].startswith(f"{n_plans} plans x 8 facts")


def test_benchmark_without_lora(tmp_path):
    "--lora none skips the LoRA measurements."
    out = tmp_path / "bench.json"
    res = main(
        [
            "--model",
            "tiny-llama",
            "--batch",
            "4",
            "--n-original",
            "1",
            "--n-facts",
            "4",
            "--lora",
            "none",
            "--stage-facts",
            "0",
            "--workdir",
            str(tmp_path),
            "--json",
            str(out),
        ]
    )
    assert res["lora"] is None and not any(k.startswith(("lora_", "stage_")) for k in res)
    assert json.loads(out.read_text()) == res  # --json writes what main returns
