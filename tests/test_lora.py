"""LoRA donors (dwg.engine.lora) against peft's merged model, on every tiny family and on SmolLM2-135M; models.load of
an adapter."""

import copy
import random
import pytest
import torch
from peft import LoraConfig, get_peft_model
from dwg.science.facts.models import load, TINY_MODELS
from dwg.science.facts.embedded import EMBEDDED
from dwg.engine.graft import graft, graftable
from dwg.science.scoring.evaluate import encode, last_logits
from dwg.engine.lora import as_donor, read_adapter

PROMPTS = ["Tom Hanks stars in a movie alongside", "Q: Who stars with Ann Lee? A:", "A B C D E F G H I J", "Hi there"]
# every attention and MLP projection of each family (GPT-2's Conv1D needs fan_in_fan_out)
TARGETS = {
    "gpt2": dict(target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True),
    "gpt_neox": dict(target_modules=["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]),
}
LLAMA_LIKE = dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])


def _peft(rec, seed=0, gain=20.0, **kw):
    """A PeftModel on a copy of `rec` with random, non-zero deltas (B times `gain`), and peft's merged model of another
    copy."""
    spec = dict(r=4, lora_alpha=8, **TARGETS.get(rec.config.model_type, LLAMA_LIKE)) | kw
    torch.manual_seed(seed)
    pm = get_peft_model(copy.deepcopy(rec), LoraConfig(init_lora_weights=False, **spec)).eval()
    with torch.no_grad():  # peft's random init leaves B small: make every delta clearly visible
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.mul_(gain)
    return pm, copy.deepcopy(pm).merge_and_unload().eval()


def _logits(rec, tok, donor, masks, layers="all", components="all"):
    "Left-padded batch logits at the last position with `donor` grafted at `masks` (one per unpadded prompt)."
    enc = encode(tok, PROMPTS)
    full = torch.zeros_like(enc.batch["input_ids"], dtype=torch.bool)
    for i, (m, pad) in enumerate(zip(masks, enc.pads)):
        full[i, pad:] = m
    with torch.no_grad(), graft(rec, donor, full, layers=layers, components=components):
        return last_logits(rec, enc.batch)


def _assert_same(got, want, what=""):
    "1e-5 in probability (the contract) and 1e-4 in log-probability (tiny models spread probability thin)."
    dp = (got.softmax(-1) - want.softmax(-1)).abs().max()
    dlp = (got.log_softmax(-1) - want.log_softmax(-1)).abs().max()
    assert dp < 1e-5 and dlp < 1e-4, (what, float(dp), float(dlp))


def _masks(tok, seed, p=0.5):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(len(tok(x)["input_ids"]), generator=g) < p for x in PROMPTS]


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_adapter_graft_equals_merged_graft(name, tmp_path):
    "PeftModel, adapter directory: grafting either == grafting peft's merged model, random masks/layers/components."
    rec, tok = load(name)
    pm, merged = _peft(rec)
    pm.save_pretrained(tmp_path)
    rng, have = random.Random(0), list(graftable(rec))
    for seed in range(3):
        comps = "all" if seed == 0 else rng.sample(have, rng.randint(1, len(have)))
        layers = "all" if seed == 0 else sorted(rng.sample(range(4), rng.randint(1, 4)))
        masks = _masks(tok, seed)
        want = _logits(rec, tok, merged, masks, layers, comps)
        if seed == 0:  # the test can fail: the deltas change the output
            plain = _logits(rec, tok, rec, [torch.zeros_like(m) for m in masks])
            assert (want.log_softmax(-1) - plain.log_softmax(-1)).abs().max() > 1e-2
        for donor in (pm, str(tmp_path)):
            _assert_same(
                _logits(rec, tok, donor, masks, layers, comps), want, (name, type(donor).__name__, comps, layers)
            )


def test_embedded_model_adapter_equals_merged():
    "SmolLM2-135M, LoRA on attention and MLP: adapter graft == merged graft at random positions (FE+LT-like masks)."
    rec, tok = load(EMBEDDED)
    pm, merged = _peft(
        rec, r=8, gain=1.0
    )  # with 20x deltas even peft's own merged and unmerged forwards differ by 4e-5
    masks = _masks(tok, 7, p=0.3)
    want = _logits(rec, tok, merged, masks)
    plain = _logits(rec, tok, rec, [torch.zeros_like(m) for m in masks])
    assert (want.softmax(-1) - plain.softmax(-1)).abs().max() > 1e-3
    _assert_same(_logits(rec, tok, pm, masks), want)
    _assert_same(
        _logits(rec, tok, pm, masks, "last_half", ["o", "down"]),
        _logits(rec, tok, merged, masks, "last_half", ["o", "down"]),
    )


def test_models_load_merges_an_adapter(tmp_path):
    "load(adapter dir) -> the base named in its config with the adapter merged (== peft's merge), named by its path."
    rec, tok = load("tiny-llama")
    pm, merged = _peft(rec)
    pm.save_pretrained(tmp_path / "model")  # a sweep's training run keeps its model in model/
    import json

    assert (
        json.loads((tmp_path / "model" / "adapter_config.json").read_text())["base_model_name_or_path"] == "tiny-llama"
    )
    got, tok2 = load(tmp_path)
    ids = tok(PROMPTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        _assert_same(got(ids).logits, merged(ids).logits)
    assert got.name_or_path == str(tmp_path / "model") and tok2.pad_token is not None


def test_adapter_without_base_name_is_refused(tmp_path):
    "An adapter whose config names no base model: load says what to set."
    rec, _ = load("tiny-llama")
    rec.name_or_path = ""  # as a model built from a config, not loaded by name
    pm, _ = _peft(rec)
    pm.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="names no base model"):
        load(tmp_path)


def test_view_reads_once_and_shares_weights(tmp_path):
    "The adapter directory is read once (cached); the view's modules share the recipient's base weights."
    rec, tok = load("tiny-llama")
    pm, _ = _peft(rec)
    pm.save_pretrained(tmp_path)
    assert read_adapter(tmp_path) is read_adapter(str(tmp_path))
    view = as_donor(rec, tmp_path)
    q = view.get_submodule("model.layers.1.self_attn.q_proj")
    assert q.base.weight.data_ptr() == rec.model.layers[1].self_attn.q_proj.weight.data_ptr()
    assert as_donor(rec, view) is view and as_donor(load("tiny-llama")[0], view) is not view


def test_patch_refuses_an_adapter_with_the_fix(tmp_path):
    "Activation patching needs the donor's forward: an adapter is refused, naming the merged model as the fix."
    from dwg.engine.patch import patch

    rec, _ = load("tiny-llama")
    pm, _ = _peft(rec)
    pm.save_pretrained(tmp_path)
    for donor in (pm, str(tmp_path)):
        with pytest.raises(ValueError, match=r"dwg.science.facts.models.load\(adapter_dir\)"):
            patch(rec, donor, torch.ones(1, 3, dtype=torch.bool)).__enter__()


def test_run_grafting_keeps_a_donor_adapter_light(tmp_path):
    """run_grafting with a LoRA adapter directory as the fine-tuned model: the position plans graft it as an adapter
    (no merged model loaded) and score as grafting peft's merged model does; a reverse plan (the adapter as the base)
    merges."""
    from unittest.mock import patch as mock
    from dwg.science.scoring import grafting as run
    from dwg.science.facts.data import create_dataset
    from dwg.science.scoring.plans import get_plan

    rec, tok = load("tiny-llama")
    pm, merged = _peft(rec)
    pm.peft_config["default"].base_model_name_or_path = "tiny-llama"
    pm.save_pretrained(tmp_path / "adapter")
    merged.save_pretrained(tmp_path / "merged")
    tok.save_pretrained(tmp_path / "merged")
    ds = create_dataset("fake_movies_fake_actors", n_facts=4, seed=0, out_dir=tmp_path / "ds")
    plans = ["PRE", "SFT", "FE+LT", "LT"]
    models = dict(pretrained="tiny-llama", finetuned=str(tmp_path / "adapter"))
    assert run.adapter_roles(models, [get_plan(p) for p in plans]) == {"finetuned": "pretrained"}
    assert run.adapter_roles(models, [get_plan(p) for p in plans], alone=False) == {}  # SFT runs the adapter alone
    assert run.adapter_roles(models, [get_plan(p) for p in ["FE+LT", "pre->sft:LT"]]) == {}  # a base with rules
    loads = []
    real = run.load
    with mock.object(run, "load", side_effect=lambda k: loads.append(k) or real(k)):
        got = run.run_grafting(models, ds, plans, "positions", generate=True, generated="last_token")
    assert loads == ["tiny-llama"]  # the adapter was never merged into a second model
    want = run.run_grafting(
        dict(pretrained="tiny-llama", finetuned=str(tmp_path / "merged")),
        ds,
        plans,
        "positions",
        generate=True,
        generated="last_token",
    )
    # a random tiny model spreads probability almost evenly over 49k tokens: ranks move among near-ties (seen 12 on one
    # CPU, <= 10 on another); the probabilities below are the tight check, 50 ranks = 0.1% of the vocabulary
    assert (got["plan"] == want["plan"]).all() and (got["rank"] - want["rank"]).abs().max() <= 50
    assert (got["prob"] - want["prob"]).abs().max() < 1e-5 and (got["logprob"] - want["logprob"]).abs().max() < 1e-4
    assert (got["generated"] == want["generated"]).all()


def test_sweep_takes_a_lora_profile_and_its_run_id_follows_the_adapter_settings():
    "The lora sweep trains with the lora profile; its model run id differs from the full fine-tune's and moves with r."
    from dwg.pipeline.sweep import expand, load_sweep
    from dwg.pipeline.sweep_file import sweep_variant

    models = lambda s: {r.label: r.id for r in expand(s) if r.stage == "models"}
    data = lambda s: [r.id for r in expand(s) if r.stage == "datasets"]
    lora, full = models("lora"), models("embedded")
    key = "smollm2-135m:fake30:relation"
    assert lora[key] != full[key] and data("lora") == data("embedded")  # the dataset is shared with runs/embedded
    r8 = {"lora": {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}}
    assert models(sweep_variant("lora", "train.overrides", r8))[key] != lora[key]
    with pytest.raises(ValueError, match="r must be >= 1"):
        load_sweep(sweep_variant("lora", "train.overrides", {"lora": {"r": 0}}))


def test_localisation_from_a_lora_donor(tmp_path):
    "Attribution with an adapter as donor equals attribution with peft's merged model: values and gradients at 0, at 1,"
    " halfway and with one cell grafted; a cell the adapter leaves alone scores 0."
    from dwg.science.facts.data import create_dataset, load_split
    from dwg.engine.interpolate import Grid, at_point
    from dwg.science.scoring.localize import Exact
    from dwg.dev.localize_bench import benchmark

    exs = load_split(create_dataset("fake_movies_fake_actors", n_facts=4, seed=0, out_dir=tmp_path / "ds"), "eval")[:8]
    for name in ("tiny-llama", "tiny-gpt2"):  # GPT-2: Conv1D, the delta transposed to its layout
        rec, tok = load(name)
        pm, merged = _peft(rec, gain=5.0)
        g = Grid(rec, roles=("first_actor", "last_token", "other"))
        one = torch.zeros(len(g))
        one[g.index[g.cell("first_actor@1:ffn")]] = 1
        for values in (torch.zeros(len(g)), torch.ones(len(g)), torch.full((len(g),), 0.5), one):
            lp_a, gr_a = at_point(rec, pm, tok, exs, g, values)
            if bool((values == 1).all()):
                lp_full = lp_a
            lp_m, gr_m = at_point(rec, merged, tok, exs, g, values)
            # rounding differs (W + BA merged once, the delta kept apart): 1e-4 of the largest gradient (seen 1.2e-5)
            assert torch.allclose(lp_a, lp_m, atol=1e-5) and (gr_a - gr_m).abs().max() <= 1e-4 * gr_m.abs().max()
        assert (
            gr_m.abs().max() > 1e-2
            and (lp_a - at_point(rec, pm, tok, exs, g, torch.zeros(len(g)))[0]).abs().max() > 1e-3
        )
        assert gr_a[:, g.index[g.cell("last_token@global:lm_head")]].abs().max() == 0  # the head is not adapted
        # exact grafting and the cost benchmark take the adapter too (exact: the same as the merged model)
        ex_a, ex_m = Exact(rec, pm, tok, exs, g, batch_size=4), Exact(rec, merged, tok, exs, g, batch_size=4)
        assert torch.allclose(ex_a(["first_actor@1:attn"]), ex_m(["first_actor@1:attn"]), atol=1e-5)
        assert torch.allclose(ex_a(g.cells), lp_full, atol=1e-5)
        assert benchmark(rec, pm, tok, exs[:4], g, steps=1, repeat=1)["over_plain"]["a0"] > 0
        # a grid of modules the adapter leaves alone: a clear error, before any forward pass
        alone = Grid(rec, components=["norms", "globals"])
        with pytest.raises(ValueError, match="changes no module of the grid"):
            at_point(rec, pm, tok, exs, alone, torch.zeros(len(alone)))
