"""The benchmark runs end to end on a tiny model (its numbers are for the embedded model; no timing is asserted)."""
from dwg.bench import run_benchmark


def test_benchmark_runs_and_engine_matches_original(tmp_path):
    res = run_benchmark("tiny-llama", batch=8, n_original=2, n_facts=8, workdir=str(tmp_path))
    assert res["max_abs_dprob"] < 1e-5
    for key in ["grafted_over_plain", "grafted_over_plain_unpadded", "speedup_per_example", "speedup_if_grafting_were_free", "original_deepcopy_s", "original_tokens_per_example", "peak_rss_over_weights", "position_sweep_s"]:
        assert res[key] > 0
