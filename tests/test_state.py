"""No state of dwg on users' objects: after graft, patch and interpolation contexts every module of both models (and
a KV cache made inside `patch`) has the attributes it had before, and none named `_dwg_*`."""

import torch
from dwg.science.scoring.evaluate import encode
from dwg.engine.graft import graft
from dwg.engine.interpolate import Grid, at_point
from dwg.science.facts.models import load
from dwg.engine.patch import patch


def _attributes(model) -> dict:
    "Each module's attribute names, by module path."
    return {name: set(m.__dict__) for name, m in model.named_modules()}


def _dwg_names(obj) -> list[str]:
    "Attribute names of dwg's own on `obj` or, for a model, on any of its modules."
    objs = obj.modules() if isinstance(obj, torch.nn.Module) else [obj]
    return [k for o in objs for k in vars(o) if k.startswith("_dwg")]


def _models():
    rec, tok = load("tiny-llama")
    return rec, load("tiny-llama", seed=1)[0], tok


def _step(batch: dict) -> dict:
    "The next one-token step after `batch` (a cache holds the rest)."
    ones = torch.ones_like(batch["input_ids"][:, -1:])
    return dict(
        input_ids=batch["input_ids"][:, -1:],
        position_ids=batch["position_ids"][:, -1:] + 1,
        attention_mask=torch.cat([batch["attention_mask"], ones], 1),
    )


def test_contexts_leave_models_as_they_were():
    "Nested grafts, patching with a continued cache, and interpolation: the models' attributes are unchanged after."
    rec, don, tok = _models()
    before = _attributes(rec), _attributes(don)
    batch = encode(tok, ["Tom stars in a film with", "A B C"]).batch
    mask = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
    mask[:, -2:] = True
    with torch.no_grad():
        with graft(rec, don, mask), graft(rec, don, mask, layers=[1], components="attn"):
            rec(**batch)
        with patch(rec, don, mask, sites=["resid_post", "q"]):
            out = rec(**batch, use_cache=True)
        with patch(rec, don, torch.cat([mask, mask[:, -1:]], 1), sites=["resid_post", "q"]):
            rec(**_step(batch), past_key_values=out.past_key_values, use_cache=True)
    examples = [dict(prompt="The capital of France is", target=" Paris"), dict(prompt="Hi", target=" there")]
    grid = Grid(rec, roles=["last_token", "other"], layers=[0, 1])
    at_point(rec, don, tok, examples, grid, torch.full((len(grid),), 0.5))
    assert (_attributes(rec), _attributes(don)) == before
    assert not _dwg_names(rec) and not _dwg_names(don) and not _dwg_names(out.past_key_values)


def test_a_context_leaves_nothing_after_an_error():
    "A forward that raises inside a graft leaves the recipient's attributes as they were too."
    rec, don, tok = _models()
    before = _attributes(rec)
    batch = encode(tok, ["Tom stars in a film with"]).batch
    try:
        with graft(rec, don, torch.ones_like(batch["input_ids"], dtype=torch.bool)):
            rec(**batch)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert _attributes(rec) == before and not _dwg_names(rec)
