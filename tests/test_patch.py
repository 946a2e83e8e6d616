"""dwg.engine.patch against nnsight (an activation-patching library nobody here wrote), on every tiny family and
SmolLM2."""

import random

import pytest
import torch
from nnsight import LanguageModel

from dwg.dev.coverage import REFERENCE_PARAMS
from dwg.science.facts.models import TINY_MODELS, load
from dwg.engine.patch import model_sites, patch

PROMPTS = ["Tom Hanks stars in a movie alongside", "Q: Who stars with Ann Lee? A:", "A B C D E F G H", "Hi there"]
# The oracle's own module paths (decoder layers, attention and MLP blocks), from the model classes' attribute names;
# projections come from dwg.dev.coverage.REFERENCE_PARAMS (parameter names), never from dwg.engine.graft's table.
BLOCKS = {
    "llama": ("model.layers", "self_attn", "mlp"),
    "gemma": ("model.layers", "self_attn", "mlp"),
    "olmo": ("model.layers", "self_attn", "mlp"),
    "gemma2": ("model.layers", "self_attn", "mlp"),
    "olmo2": ("model.layers", "self_attn", "mlp"),
    "gpt2": ("transformer.h", "attn", "mlp"),
    "gpt_neox": ("gpt_neox.layers", "attention", "mlp"),
}
# resid_mid, the residual between attention and MLP, in the oracle's own terms: (the module whose *input* it is, the
# module whose output the layer adds to its input to make it). Written as that output := donor's mid - layer input.
MID = {
    "llama": ("post_attention_layernorm", "self_attn"),
    "gemma": ("post_attention_layernorm", "self_attn"),
    "olmo": ("post_attention_layernorm", "self_attn"),
    "gemma2": ("pre_feedforward_layernorm", "post_attention_layernorm"),
    "olmo2": ("mlp", "post_attention_layernorm"),
    "gpt2": ("ln_2", "attn"),
}
# the order in which a layer's sites are computed (nnsight needs modules in execution order)
ORDER = ["resid_pre", "q", "k", "v", "o", "attn_out", "resid_mid", "gate", "up", "down", "mlp_out", "resid_post"]


def _envoy(root, path: str):
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def _oracle_site(model_type: str, site: str, layer: int, reading: bool) -> tuple[str, str, object]:
    "(module path, 'input' / 'output' / 'mid', fused part or None) of a site, from the oracle's own tables."
    layers, attn, mlp = BLOCKS[model_type]
    base = f"{layers}.{layer}"
    if site in ("resid_pre", "resid_post"):
        return base, "input" if site == "resid_pre" else "output", None
    if site in ("attn_out", "mlp_out"):
        return f"{base}.{attn if site == 'attn_out' else mlp}", "output", None
    if site == "resid_mid":
        return (
            (f"{base}.{MID[model_type][0]}", "input", None)
            if reading
            else (f"{base}.{MID[model_type][1]}", "mid", None)
        )
    spec = REFERENCE_PARAMS[model_type]["parts"][site]
    path, part = (spec, None) if isinstance(spec, str) else (spec[0], spec[1:])
    return f"{base}.{path}", "output", part


def _part_cols(n: int, part, heads: int) -> torch.Tensor:
    cols = torch.zeros(n, dtype=torch.bool)
    if part is None:
        return cols | True
    kind, i = part
    if kind == "thirds":
        cols[i * n // 3 : (i + 1) * n // 3] = True
    else:
        cols.view(heads, 3, -1)[:, i] = True
    return cols


def _main(x):
    return x[0] if isinstance(x, tuple) else x


def _groups(model_type, order, reading: bool) -> dict:
    "(path, where) -> [(site, layer, part)], in execution order: fused q/k/v share one module."
    groups = {}
    for s, i in order:
        path, where, part = _oracle_site(model_type, s, i, reading)
        groups.setdefault((path, where), []).append((s, i, part))
    return groups


def nnsight_patched_logits(rec, don, tok, batch, mask, layers, sites):
    "Logits of `rec` with `don`'s activations at sites x layers where `mask`, done with nnsight traces."
    mt = rec.config.model_type
    order = sorted(((s, i) for s in sites for i in layers), key=lambda k: (k[1], ORDER.index(k[0])))
    R, D = LanguageModel(rec, tokenizer=tok), LanguageModel(don, tokenizer=tok)
    inputs, saved, layer_in = dict(batch), {}, {}
    with torch.no_grad(), D.trace(inputs):
        for (path, where), keys in _groups(mt, order, reading=True).items():
            env = _envoy(D, path)
            value = (env.input if where == "input" else _main(env.output)).save()
            for s, i, _ in keys:
                saved[(s, i)] = value
    m = mask[..., None]
    layers_path = BLOCKS[mt][0]
    with torch.no_grad(), R.trace(inputs):
        for (path, where), keys in _groups(mt, order, reading=False).items():
            i = keys[0][1]
            if "resid_mid" in sites and i not in layer_in and where != "input":  # the layer's input, before its blocks
                layer_in[i] = _envoy(R, f"{layers_path}.{i}").input
            env = _envoy(R, path)
            current = env.input if where == "input" else env.output
            x = _main(current)
            new = x
            for s, _, part in keys:
                cols = _part_cols(x.shape[-1], part, rec.config.num_attention_heads)
                donor = saved[(s, i)] - layer_in[i] if where == "mid" else saved[(s, i)]
                new = torch.where(m & cols, donor, new)
            if where == "input":
                env.input = layer_in[i] = new
            else:
                env.output = (new, *current[1:]) if isinstance(current, tuple) else new
        logits = R.output.logits.save()
    return logits


def _case(rec, tok, rng):
    batch = dict(tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left"))
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)  # left padding: positions from 0
    g = torch.Generator().manual_seed(rng.randint(0, 10**6))
    mask = (torch.rand(batch["input_ids"].shape, generator=g) < 0.4) & batch["attention_mask"].bool()
    n = rec.config.num_hidden_layers
    layers = sorted(rng.sample(range(n), rng.randint(1, min(n, 3))))
    return batch, mask, layers


def _dwg_patched_logits(rec, don, batch, mask, layers, sites):
    with torch.no_grad(), patch(rec, don, mask, layers=layers, sites=sites):
        return rec(**batch).logits


def _assert_same(got, want):
    "Same next-token distributions (rows: real positions): 1e-5 in probability and 1e-4 in log-probability."
    dp = (got.softmax(-1) - want.softmax(-1)).abs().max()
    dlp = (got.log_softmax(-1) - want.log_softmax(-1)).abs().max()
    assert dp < 1e-5 and dlp < 1e-4, (float(dp), float(dlp))


@pytest.fixture(scope="module", params=list(TINY_MODELS))
def pair(request):
    rec, tok = load(request.param, seed=0)
    don, _ = load(request.param, seed=1)
    return rec, don, tok


def test_each_site_matches_nnsight(pair):
    "Every site of the family alone, random layers and masks: dwg.engine.patch == nnsight (1e-5 prob, 1e-4 log-prob)."
    rec, don, tok = pair
    rng = random.Random(0)
    for site in model_sites(rec):
        batch, mask, layers = _case(rec, tok, rng)
        got = _dwg_patched_logits(rec, don, batch, mask, layers, [site])
        want = nnsight_patched_logits(rec, don, tok, batch, mask, layers, [site])
        real = batch["attention_mask"].bool()
        _assert_same(got[real], want[real])


@pytest.mark.parametrize("seed", [1, 2])
def test_random_site_sets_match_nnsight(pair, seed):
    rec, don, tok = pair
    rng = random.Random(seed)
    sites = rng.sample(model_sites(rec), 3)
    batch, mask, layers = _case(rec, tok, rng)
    real = batch["attention_mask"].bool()
    want = nnsight_patched_logits(rec, don, tok, batch, mask, layers, sites)
    _assert_same(_dwg_patched_logits(rec, don, batch, mask, layers, sites)[real], want[real])


def test_oracle_can_fail():
    "The comparison sees a patch at the wrong layer."
    rec, tok = load("tiny-llama")
    don, _ = load("tiny-llama", seed=1)
    batch, mask, _ = _case(rec, tok, random.Random(3))
    mask[:, -1] = True
    got = _dwg_patched_logits(rec, don, batch, mask, [1], ["mlp_out"])
    want = nnsight_patched_logits(rec, don, tok, batch, mask, [2], ["mlp_out"])
    real = batch["attention_mask"].bool()
    with pytest.raises(AssertionError):
        _assert_same(got[real], want[real])


def test_embedded_model_matches_nnsight():
    "SmolLM2-135M against a perturbed copy of itself: residual, block and projection sites at once."
    rec, tok = load("smollm2-135m")
    don, _ = load("smollm2-135m")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in don.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02 * p.std().clamp(min=1e-3))
    batch, mask, _ = _case(rec, tok, random.Random(4))
    layers, sites = [3, 17, 28], ["resid_pre", "o", "resid_mid", "mlp_out", "down"]
    real = batch["attention_mask"].bool()
    want = nnsight_patched_logits(rec, don, tok, batch, mask, layers, sites)
    _assert_same(_dwg_patched_logits(rec, don, batch, mask, layers, sites)[real], want[real])


def test_patching_plans_run_through_evaluation(tmp_path):
    """A patching plan scored by dwg.science.scoring.evaluate (batched, padded, whole-name generation through the KV
    cache) equals patching each prompt alone and generating greedily by rerunning the whole sequence at every step."""
    from dwg.science.facts.data import create_dataset, load_split
    from dwg.science.scoring.evaluate import evaluate_plans, target_token_ids
    from dwg.science.scoring.plans import GraftPlan, Rule

    rec, tok = load("tiny-llama")
    don, _ = load("tiny-llama", seed=1)
    exs = load_split(create_dataset("fake_movies_fake_actors", n_facts=4, seed=0, out_dir=tmp_path / "ds"), "eval")[:6]
    plan = GraftPlan(
        "LT:patch",
        "pretrained",
        [Rule("finetuned", ["last_token"], "last_half", method="patch", sites=["resid_post", "attn_out"])],
    )
    rows = evaluate_plans(
        [plan, "PRE"],
        dict(pretrained=rec, finetuned=don),
        tok,
        exs,
        batch_size=4,
        progress=False,
        generate=True,
        generated="last_token",
    )
    for row, ex in zip([r for r in rows if r["plan"] == "LT:patch"], exs):
        seq = tok(ex["prompt"], return_tensors="pt")["input_ids"]
        first, n_new, out = seq.shape[1] - 1, len(target_token_ids(tok, ex["prompt"], ex["target"])), []
        with torch.no_grad():
            for t in range(n_new):
                mask = torch.zeros_like(seq, dtype=torch.bool)
                mask[:, first:] = True  # the last prompt token, then every generated one ("last_token")
                with patch(rec, don, mask, layers=[2, 3], sites=["resid_post", "attn_out"]):
                    logits = rec(input_ids=seq).logits[0, -1]
                if t == 0:
                    prob = logits.softmax(-1)[row["target_id"]].item()
                out.append(int(logits.argmax()))
                seq = torch.cat([seq, logits.argmax().view(1, 1)], 1)
        assert abs(row["prob"] - prob) < 1e-5
        assert row["generated"] == tok.decode(out)
