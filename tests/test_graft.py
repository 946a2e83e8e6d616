"""The grafting engine against the original token-by-token algorithm (dwg.dev.coverage's reference), on every tiny
architecture."""

import random
from contextlib import ExitStack
import pytest
import torch
from dwg.science.facts.models import load, TINY_MODELS
from dwg.engine.graft import graft, graftable, resolve_components, check_compatible
from dwg.dev.coverage import reference_last_logits
from dwg.science.scoring.evaluate import encode, last_logits

PROMPTS = ["Tom Hanks stars in a movie alongside", "Q: Who stars with Ann Lee? A:", "A B C D E F G H I J", "Hi there"]


def _donor(name, seed):
    """A tiny model whose every weight differs from the recipient's: another seed, and its 1-D parameters (norm
    weights and biases, which random initialisation leaves equal across seeds) perturbed, so that grafting the wrong
    norm or bias shows."""
    don, _ = load(name, seed=seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in don.parameters():
            if p.dim() == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
    return don


@pytest.fixture(scope="module", params=list(TINY_MODELS))
def pair(request):
    rec, tok = load(request.param, seed=0)
    return rec, _donor(request.param, 1), tok


def _random_graft(rec, don, mask_shape, rng):
    "A random (donor, mask, layers, components) for the engine and the reference."
    have = list(graftable(rec))
    comps = rng.sample(have, rng.randint(1, len(have)))
    n = rec.config.num_hidden_layers
    layers = sorted(rng.sample(range(n), rng.randint(1, n)))
    mask = torch.rand(mask_shape, generator=torch.Generator().manual_seed(rng.randint(0, 10**6))) < 0.4
    return don, mask, layers, comps


def _assert_same(got_logits, want_logits, what=""):
    """Same next-token distribution: 1e-5 in probability (the contract) and 1e-4 in log-probability. Tiny random
    models spread probability almost uniformly over 49k tokens (~2e-5 each), where a probability tolerance alone
    would miss even a wrong weight; log-probabilities do not."""
    dp = (got_logits.softmax(-1) - want_logits.softmax(-1)).abs().max()
    dlp = (got_logits.log_softmax(-1) - want_logits.log_softmax(-1)).abs().max()
    assert dp < 1e-5 and dlp < 1e-4, (what, float(dp), float(dlp))


def _engine(rec, tok, grafts):
    "Batched, left-padded engine logits at the last position, with nested grafts (masks given per unpadded prompt)."
    enc = encode(tok, PROMPTS)
    ids = enc.batch["input_ids"]
    with torch.no_grad():
        with ExitStack() as stack:
            for don, masks, layers, comps in grafts:
                full = torch.zeros_like(ids, dtype=torch.bool)
                for i, (m, pad) in enumerate(zip(masks, enc.pads)):
                    full[i, pad:] = m
                stack.enter_context(graft(rec, don, full, layers=layers, components=comps))
            return last_logits(rec, enc.batch)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_matches_token_by_token_reference(pair, seed):
    "Random masks, layers and component sets, batched with padding: engine == per-token weight swapping (1e-5 in prob)."
    rec, don, tok = pair
    rng = random.Random(seed)
    lens = [len(tok(p)["input_ids"]) for p in PROMPTS]
    don_, _, layers, comps = _random_graft(rec, don, (1,), rng)
    masks = [torch.rand(n, generator=torch.Generator().manual_seed(seed * 10 + i)) < 0.4 for i, n in enumerate(lens)]
    got = _engine(rec, tok, [(don, masks, layers, comps)])
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor(tok(p)["input_ids"])
        _assert_same(got[i], reference_last_logits(rec, [(don, masks[i], layers, comps)], ids), (comps, layers))


def test_each_component_alone_matches_reference(pair):
    """Each graftable component on its own, all layers, at random positions: engine == reference. The reference finds
    the weights by parameter name (dwg.dev.coverage.REFERENCE_PARAMS), not through dwg.engine.arch (the engine's own
    discovery), so a wrong table entry (e.g. two norms swapped) fails here."""
    rec, don, tok = pair
    lens = [len(tok(p)["input_ids"]) for p in PROMPTS]
    masks = [torch.rand(n, generator=torch.Generator().manual_seed(i)) < 0.5 for i, n in enumerate(lens)]
    for m in masks:
        m[-1] = True  # the last position grafted too, so ln_final and lm_head count
    for comp in graftable(rec):
        got = _engine(rec, tok, [(don, masks, "all", [comp])])
        for i, p in enumerate(PROMPTS[:1]):
            ids = torch.tensor(tok(p)["input_ids"])
            _assert_same(got[i], reference_last_logits(rec, [(don, masks[i], "all", [comp])], ids), comp)


def test_nested_grafts_innermost_wins(pair):
    "Two donors on overlapping masks: the inner context wins where they overlap, as in the reference applied in order."
    rec, don, tok = pair
    don2 = _donor([k for k, v in TINY_MODELS.items() if v["model_type"] == rec.config.model_type][0], 2)
    lens = [len(tok(p)["input_ids"]) for p in PROMPTS]
    m1 = [torch.arange(n) % 2 == 0 for n in lens]
    m2 = [torch.arange(n) % 3 == 0 for n in lens]  # overlaps m1 at multiples of 6
    grafts = [(don, m1, list(range(4)), ["all"]), (don2, m2, [1, 3], ["attn", "ffn"])]
    got = _engine(rec, tok, grafts)
    for i, p in enumerate(PROMPTS):
        ids = torch.tensor(tok(p)["input_ids"])
        _assert_same(got[i], reference_last_logits(rec, [(d, m[i], l, c) for d, m, l, c in grafts], ids))


def test_graft_all_everywhere_is_donor_and_nothing_is_recipient(pair):
    rec, don, tok = pair
    enc = encode(tok, PROMPTS)
    ids = enc.batch["input_ids"]
    with torch.no_grad():
        plain, donor = last_logits(rec, enc.batch), last_logits(don, enc.batch)
        with graft(rec, don, torch.ones_like(ids, dtype=torch.bool)):
            everywhere = last_logits(rec, enc.batch)
        with graft(rec, don, torch.zeros_like(ids, dtype=torch.bool)):
            nowhere = last_logits(rec, enc.batch)
    assert (everywhere - donor).abs().max() < 1e-4
    assert torch.equal(nowhere, plain)
    assert (plain - donor).abs().max() > 1e-3  # the test can fail: the models do differ


def test_recipient_never_modified_and_hooks_removed(pair):
    rec, don, tok = pair
    before = {k: v.clone() for k, v in rec.state_dict().items()}
    enc = encode(tok, PROMPTS)
    with pytest.raises(RuntimeError):
        with graft(rec, don, torch.ones_like(enc.batch["input_ids"], dtype=torch.bool)):
            last_logits(rec, enc.batch)
            raise RuntimeError("boom")
    assert all(torch.equal(v, rec.state_dict()[k]) for k, v in before.items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in rec.modules())


def test_table_covers_every_parameter(pair):
    "Every parameter of the model belongs to some graftable component, so 'all' really is everything."
    rec, _, _ = pair
    covered = set()
    from dwg.engine.graft import _targets

    for r, *_ in _targets(rec, rec, "all", "all"):
        covered |= {id(p) for p in r.parameters(recurse=False)}
    missing = [n for n, p in rec.named_parameters() if id(p) not in covered]
    assert not missing, missing


def test_tied_embeddings_graft_separately():
    "With tied weights, grafting embed leaves lm_head alone and vice versa (checked against the untied reference)."
    rec, tok = load("tiny-llama")
    don, _ = load("tiny-llama", seed=1)
    assert rec.get_input_embeddings().weight is rec.get_output_embeddings().weight
    ids = torch.tensor(tok(PROMPTS[0])["input_ids"])
    mask = torch.ones(1, len(ids), dtype=torch.bool)
    for comp in ["embed", "lm_head"]:
        with graft(rec, don, mask, components=[comp]), torch.no_grad():
            got = rec(input_ids=ids[None]).logits[0, -1]
        _assert_same(got, reference_last_logits(rec, [(don, mask[0], "all", [comp])], ids), comp)
    with graft(rec, don, mask, components=["embed"]), torch.no_grad():
        only_embed = rec(input_ids=ids[None]).logits[0, -1]
    with graft(rec, don, mask, components=["embed", "lm_head"]), torch.no_grad():
        both = rec(input_ids=ids[None]).logits[0, -1]
    assert (only_embed - both).abs().max() > 1e-3


def test_neox_fused_qkv_layout_is_per_head():
    "GPT-NeoX: perturb only k and v (per-head layout) in a donor; grafting q alone must then change nothing."
    rec, tok = load("tiny-pythia")
    don, _ = load("tiny-pythia")
    h = rec.config.num_attention_heads
    with torch.no_grad():
        for layer in don.gpt_neox.layers:
            w = layer.attention.query_key_value.weight.view(h, 3, -1, layer.attention.query_key_value.in_features)
            w[:, 1:] += torch.randn_like(w[:, 1:])
    ids = torch.tensor([tok(PROMPTS[0])["input_ids"]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        plain = rec(input_ids=ids).logits
        with graft(rec, don, mask, components=["q"]):
            q_only = rec(input_ids=ids).logits
        with graft(rec, don, mask, components=["k"]):
            k_only = rec(input_ids=ids).logits
    assert torch.allclose(plain, q_only, atol=1e-6) and not torch.allclose(plain, k_only, atol=1e-3)


def test_gpt2_fused_qkv_columns():
    "GPT-2: perturb only the v columns of c_attn; grafting q or k changes nothing, v does."
    rec, tok = load("tiny-gpt2")
    don, _ = load("tiny-gpt2")
    d = rec.config.n_embd
    with torch.no_grad():
        for block in don.transformer.h:
            block.attn.c_attn.weight[:, 2 * d :] += torch.randn_like(block.attn.c_attn.weight[:, 2 * d :])
    ids = torch.tensor([tok(PROMPTS[0])["input_ids"]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        plain = rec(input_ids=ids).logits
        outs = {}
        for c in ["q", "k", "v"]:
            with graft(rec, don, mask, components=[c]):
                outs[c] = rec(input_ids=ids).logits
    assert torch.allclose(plain, outs["q"]) and torch.allclose(plain, outs["k"])
    assert (plain - outs["v"]).abs().max() > 1e-3


def test_errors_name_the_problem():
    rec, tok = load("tiny-llama")
    gpt2, _ = load("tiny-gpt2")
    with pytest.raises(ValueError, match="same architecture"):
        check_compatible(rec, gpt2)
    import transformers

    cfg = rec.config.to_dict()
    cfg["intermediate_size"] = 96
    other = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight"):
        check_compatible(rec, other)
    with pytest.raises(ValueError, match="out of range"):
        graft(rec, rec, torch.ones(1, 3), layers=[7]).__enter__()
    with pytest.raises(ValueError, match="does not exist in gpt2"):
        resolve_components(gpt2, ["gate"])
    with pytest.raises(ValueError, match=r"\(batch, seq\)"):
        graft(rec, rec, torch.ones(3)).__enter__()
