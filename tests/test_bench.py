"""The benchmark runs end to end on a tiny model (its numbers are for the embedded model; no timing is asserted)."""
import json

from dwg.bench import main


def test_benchmark_runs_and_engine_matches_original(tmp_path, capsys):
    out = tmp_path / "bench.json"
    res = main(["--model", "tiny-llama", "--batch", "8", "--n-original", "2", "--n-facts", "8",
                "--workdir", str(tmp_path), "--json", str(out)])
    assert res["batch"] == 8 and json.loads(out.read_text()) == res
    assert res["donor"] == str(tmp_path / "donor")          # the stand-in donor went to --workdir
    assert "speedup_per_example" in capsys.readouterr().out
    assert res["max_abs_dprob"] < 1e-5
    for key in ["grafted_over_plain", "grafted_over_plain_unpadded", "speedup_per_example", "speedup_if_grafting_were_free", "original_deepcopy_s", "original_tokens_per_example", "peak_rss_over_weights", "position_sweep_s"]:
        assert res[key] > 0
