"""Architecture coverage: grafting on tiny random models of transformers' decoder families, checked against the
independent token-by-token reference of dwg.dev.coverage (parameters swapped by name, never through
dwg.engine.arch/dwg.engine.graft).

Which families run is fixed, never drawn: every run checks the named families (the CI subset: the families the
project grafts by name and the seven it started with); `pytest -m all_families tests/test_architectures.py` checks
every family measured exact (NAMED and OTHERS).
"""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from dwg.dev.coverage import check_family, grade_model, tiny_random, perturbed, reference_last_logits
from dwg.engine.graft import graft, resolve_components
from dwg.engine.arch import architecture
from dwg.science.scoring.evaluate import SharedPrefix, first_grafted_layer, plan_forward
from dwg.science.scoring.plans import GraftPlan, Rule, get_plan

NAMED = [
    "qwen3",
    "qwen3_moe",
    "gemma3_text",
    "gemma4_text",
    "llama4_text",
    "mistral",
    "ministral",
    "ministral3",
    "phi3",
    "olmo3",
    "smollm3",
    "granite",
    "granitemoe",
    "gpt_oss",
    "deepseek_v3",
    "mixtral",
    "olmoe",
    "qwen2_moe",
    "glm4",
    "llama",
    "gemma",
    "gemma2",
    "olmo",
    "olmo2",
    "gpt2",
    "gpt_neox",
]
OTHERS = [  # every other family measured exact (python -m dwg.dev.coverage, 2026-11-24)
    "afmoe",
    "apertus",
    "apertus1p5_text",
    "arcee",
    "aria_text",
    "beam",
    "biogpt",
    "bitnet",
    "bloom",
    "codegen",
    "cohere",
    "cohere2",
    "cohere2_moe",
    "ctrl",
    "cwm",
    "deepseek_v2",
    "deepseek_v4",
    "diffllama",
    "doge",
    "ernie4_5",
    "ernie4_5_moe",
    "exaone",
    "exaone4",
    "exaone_moe",
    "flex_olmo",
    "flint",
    "fuyu",
    "gemma4_unified_text",
    "glm",
    "glm4_moe",
    "glm4_moe_lite",
    "gpt-sw3",
    "gpt_bigcode",
    "gpt_neox_japanese",
    "gptj",
    "granite_swa",
    "granitemoe_swa",
    "granitemoeshared",
    "helium",
    "hunyuan_v1_dense",
    "hunyuan_v1_moe",
    "hy_v3",
    "hyperclovax",
    "internlm3",
    "iquestcoder",
    "jais2",
    "jetmoe",
    "kolibri1",
    "laguna",
    "mellum",
    "mimo_v2_flash",
    "minimax_m2",
    "minimax_m3_vl_text",
    "modernbert-decoder",
    "mpt",
    "nanochat",
    "nemotron",
    "opt",
    "persimmon",
    "phi",
    "phimoe",
    "qwen2",
    "sarvam_moe",
    "seed_oss",
    "solar_open",
    "stablelm",
    "starcoder2",
    "trocr",
    "vaultgemma",
    "xglm",
]


def _assert_exact(model_type):
    row = check_family(model_type)
    assert row["status"] == "exact", row
    assert row["max_dp"] <= 1e-5 and row["max_dlogp"] <= 1e-4, row


@pytest.mark.parametrize("model_type", NAMED)
def test_named_family_is_exact(model_type):
    "Every per-position module alone, two experts, the ends and all together: engine == reference (1e-5 in prob)."
    _assert_exact(model_type)


@pytest.mark.all_families
@pytest.mark.parametrize("model_type", NAMED + OTHERS)
def test_every_family_is_exact(model_type):
    "The full run (pytest -m all_families): every family measured exact still is."
    _assert_exact(model_type)


GEMMA3_270M = dict(  # the config of gemma3-270m (google/gemma-3-270m) as its prepared checkpoint holds it
    model_type="gemma3_text",
    vocab_size=262144,
    hidden_size=640,
    intermediate_size=2048,
    num_hidden_layers=18,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    query_pre_attn_scalar=256,
    hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6,
    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
    rope_parameters=dict(
        full_attention=dict(rope_theta=1e6, rope_type="default"),
        sliding_attention=dict(rope_theta=1e4, rope_type="default"),
    ),
    max_position_embeddings=32768,
    tie_word_embeddings=True,
)


@pytest.mark.slow
def test_gemma3_270m_config_is_exact():
    """Gemma 3 270M's own config with random weights (scaled embeddings, q/k norms, four norms a layer, a 262,144-token
    tied head), its sliding window set to 4 so that the 9-token prompts cross it: engine == reference, every component
    alone and all together."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**GEMMA3_270M, sliding_window=4)).eval()
    ids = torch.randint(1, 262144, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        windowed = model(input_ids=ids).logits[0, -1]
        model.config.sliding_window = 512
        assert (model(input_ids=ids).logits[0, -1] - windowed).abs().max() > 1e-3  # the window is at work
        model.config.sliding_window = 4
    row = grade_model(model, seq=9)
    assert row["status"] == "exact", row
    assert {"q_norm", "k_norm", "ln_post_attn", "ln_post_ffn"} <= set(row["canonical"]), row["canonical"]


def test_unsupported_family_names_reason_and_fix():
    mamba = tiny_random("mamba")
    with pytest.raises(ValueError, match=r"state-space.*Fix: graft a decoder-only transformer"):
        graft(mamba, mamba, torch.ones(1, 3, dtype=torch.bool)).__enter__()
    assert check_family("mamba")["status"] == "not supported"


def test_the_check_can_fail():
    "The reference tells components apart: grafting q_proj is not the same as grafting k_proj."
    model = tiny_random("qwen3")
    donor = perturbed(model)
    ids, mask = torch.tensor([[5, 9, 3, 7, 2]]), torch.tensor([[True, False, True, True, True]])
    with torch.no_grad(), graft(model, donor, mask, components=["self_attn.q_proj"]):
        got = model(input_ids=ids).logits[0, -1]
    right = reference_last_logits(model, [(donor, mask[0], "all", ["self_attn.q_proj"])], ids[0])
    wrong = reference_last_logits(model, [(donor, mask[0], "all", ["self_attn.k_proj"])], ids[0])
    assert (got.softmax(-1) - right.softmax(-1)).abs().max() < 1e-5
    assert (got.softmax(-1) - wrong.softmax(-1)).abs().max() > 1e-5


CANONICAL = {  # written from the families' modeling code: (model type, name) -> (path in a layer, fused part)
    ("phi3", "k"): ("self_attn.qkv_proj", ("blocks", 1)),
    ("phi3", "up"): ("mlp.gate_up_proj", ("halves", 1)),
    ("gemma3_text", "ln_post_attn"): ("post_attention_layernorm", None),
    ("gemma3_text", "ln2"): ("pre_feedforward_layernorm", None),
    ("olmo3", "ln1"): ("post_attention_layernorm", None),
    ("olmo3", "ln2"): ("post_feedforward_layernorm", None),
    ("qwen3", "q_norm"): ("self_attn.q_norm", None),
    ("qwen3", "ln2"): ("post_attention_layernorm", None),
    ("gpt_oss", "router"): ("mlp.router", None),
    ("qwen3_moe", "experts"): ("mlp.experts", None),
    ("llama4_text", "router"): ("feed_forward.router", None),
    ("granitemoe", "router"): ("block_sparse_moe.router", None),
    ("glm4", "gate"): ("mlp.gate_up_proj", ("halves", 0)),
}


@pytest.mark.parametrize("key", list(CANONICAL))
def test_canonical_names(key):
    model_type, name = key
    assert architecture(tiny_random(model_type)).components[name] == CANONICAL[key]


def test_fused_qkv_layout_phi3():
    "Phi-3: a donor that differs only in the k rows of qkv_proj; grafting q or v changes nothing, k does."
    model = tiny_random("phi3")
    donor = tiny_random("phi3")
    with torch.no_grad():
        for layer in donor.model.layers:
            layer.self_attn.qkv_proj.weight[64:96] += 1.0  # 4 q heads, 2 kv heads of 16
    ids = torch.tensor([[5, 9, 3, 7, 2]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        outs = {}
        for c in "qkv":
            with graft(model, donor, mask, components=[c]):
                outs[c] = model(input_ids=ids).logits
    assert torch.allclose(plain, outs["q"]) and torch.allclose(plain, outs["v"])
    assert not torch.allclose(plain, outs["k"], atol=1e-4)


def test_one_expert_is_its_own_component():
    "A donor that differs only in expert 2: grafting expert 0 changes nothing, expert 2 does (tokens routed to it)."
    model = tiny_random("qwen3_moe")
    donor = tiny_random("qwen3_moe")
    with torch.no_grad():
        for layer in donor.model.layers:
            for p in layer.mlp.experts.parameters():
                p[2] += 0.5
    ids = torch.randint(1, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with graft(model, donor, mask, components=["mlp.experts.0"]):
            e0 = model(input_ids=ids).logits
        with graft(model, donor, mask, components=["mlp.experts.2"]):
            e2 = model(input_ids=ids).logits
        with graft(model, donor, mask, components=["experts"]):
            every = model(input_ids=ids).logits
    assert torch.allclose(plain, e0, atol=1e-6)
    assert torch.allclose(e2, every, atol=1e-5) and not torch.allclose(plain, e2, atol=1e-4)
    assert resolve_components(model, "ffn") == ["experts", "router"] or set(resolve_components(model, "ffn")) == {
        "experts",
        "router",
    }


def _padded_batch():
    "Two rows, the second left-padded by two columns (mask and position ids as dwg.engine.prompts.encode makes them)."
    ids = torch.tensor([[5, 9, 3, 7, 2, 4, 8], [0, 0, 8, 6, 3, 2, 9]])
    mask = torch.tensor([[1] * 7, [0, 0] + [1] * 5])
    return dict(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0))


@pytest.mark.parametrize("model_type", NAMED + [pytest.param(t, marks=pytest.mark.all_families) for t in OTHERS])
def test_replayed_layers_give_the_full_pass(model_type):
    """A plan scored from the shared prefix, the layers below its first one replayed from the base model's own run,
    gives the logits of its full grafted pass (graft and patch plans, one position or the last); so does a plan that
    starts from the cache of every column but the last computed under its rules there (a shared head)."""
    model = tiny_random(model_type)
    donor = perturbed(model)
    models, batch = dict(pretrained=model, finetuned=donor), _padded_batch()
    try:
        model(**batch)
    except RuntimeError as e:
        pytest.skip(f"the tiny random {model_type} fails a plain padded forward, before any graft: {e}")
    prefix = SharedPrefix(model, batch)
    for name, col in [
        ("graft:FE@layer_1", 4),
        ("graft-attn:LT@layer_1", 6),
        ("patch-resid:FE@layer_1", 4),
        ("patch-resid:LT@layer_1", 6),
    ]:
        plan, masks = get_plan(name), [torch.zeros(2, 7, dtype=torch.bool)]
        masks[0][:, col] = True
        assert first_grafted_layer(plan, models) == 1
        got = plan_forward(plan, models, batch, masks, prefix=prefix, replay_layers=True)[0]
        want = plan_forward(plan, models, batch, masks)[0]
        assert (got.softmax(-1) - want.softmax(-1)).abs().max() < 1e-5, name
    if model_type in ("llama", "qwen3", "gpt2", "gpt_neox", "gemma2", "mixtral"):
        assert prefix.layer_outputs() is not None  # the replay was used, not fallen back from
    hybrid = GraftPlan(
        "FE+LT:ffn",
        "pretrained",
        [Rule("finetuned", ["first_actor"]), Rule("finetuned", ["last_token"], "all", ["ffn"])],
    )
    masks = [torch.zeros(2, 7, dtype=torch.bool) for _ in range(2)]
    masks[0][:, 4] = masks[1][:, 6] = True
    want = plan_forward(hybrid, models, batch, masks)[0]
    for _ in range(2):  # the second plan of a head signature starts from the head cropped back
        got = plan_forward(hybrid, models, batch, masks, prefix=prefix, shared_head=True)[0]
        # log-probs: tiny random models' probs are flat
        dlogp = (got.log_softmax(-1) - want.log_softmax(-1)).abs().max()
        assert dlogp < 1e-4, "shared head"


def test_replay_falls_back_where_it_would_differ():
    """Layers that pass state outside their outputs (here layer 1 adds what layer 0's MLP stashed) fail the replay
    check: the plans then run every layer, and still give the full pass."""
    model = tiny_random("llama")
    donor = perturbed(model)
    batch, layers, stash = _padded_batch(), model.model.layers, []

    def add_stashed(m, args, kwargs):
        extra = stash.pop() if stash else 0
        if args:
            return (args[0] + extra,) + args[1:], kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + extra}

    hooks = [
        layers[0].mlp.register_forward_hook(lambda m, a, out: stash.append(out)),
        layers[1].register_forward_pre_hook(add_stashed, with_kwargs=True),
    ]
    try:
        prefix = SharedPrefix(model, batch)
        assert prefix.layer_outputs() is None
        plan, masks = get_plan("graft:FE@layer_1"), [torch.zeros(2, 7, dtype=torch.bool)]
        masks[0][:, 4] = True
        models = dict(pretrained=model, finetuned=donor)
        got = plan_forward(plan, models, batch, masks, prefix=prefix, replay_layers=True)[0]
        stash.clear()
        want = plan_forward(plan, models, batch, masks)[0]
        assert (got.softmax(-1) - want.softmax(-1)).abs().max() < 1e-5
    finally:
        for h in hooks:
            h.remove()
