"""Necessity plans (the pretrained model grafted into the fine-tuned one at X) against the complement plans (the
fine-tuned model grafted into the pretrained one everywhere but X). Grafting every module (`:all`), each position runs
the same weights either way, so the two score every prompt alike. In the default form (the decoder layers alone) the
embeddings and the head stay the base model's, so the two differ: the claims file reads the necessity plans."""

import math

import pytest

from dwg import load
from dwg.science.facts.data import create_dataset, load_split
from dwg.science.scoring.evaluate import evaluate_plans
from dwg.science.scoring.plans import POSITION_SETS, GraftPlan, Rule

PAIRS = [
    ("pre->sft:FE:all", "not_FE:all"),
    ("pre->sft:LT:all", "not_LT:all"),
    ("pre->sft:FE+LT:all", "(FE+LT)^C:all"),
    ("pre->sft:(FE+LT)^C:all", "FE+LT:all"),
]


def reverse_all(name: str) -> GraftPlan:
    "`pre->sft:X:all`: the pretrained model's every module grafted into the fine-tuned one at X."
    x = name.removeprefix("pre->sft:").removesuffix(":all")
    return GraftPlan(name, "finetuned", [Rule("pretrained", POSITION_SETS[x][0], components="all")])


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    pre, tok = load("tiny-llama")
    sft, _ = load("tiny-llama", seed=1)
    ds = create_dataset(
        "fake_movies_fake_actors", n_facts=4, seed=0, out_dir=tmp_path_factory.mktemp("necessity") / "ds"
    )
    exs = load_split(ds, "eval")[:12]
    plans = [p for n, c in PAIRS for p in (reverse_all(n), c)] + ["PRE", "SFT", "pre->sft:FE", "not_FE"]
    out = evaluate_plans(plans, dict(pretrained=pre, finetuned=sft), tok, exs, batch_size=5, progress=False)
    by_plan = {}
    for r in out:
        by_plan.setdefault(r["plan"], []).append(r)
    return by_plan


@pytest.mark.parametrize("necessity, complement", PAIRS)
def test_necessity_plan_equals_its_complement(rows, necessity, complement):
    """Row by row: the same target rank, and log-probabilities equal to float precision."""
    a, b = rows[necessity], rows[complement]
    assert [r["prompt"] for r in a] == [r["prompt"] for r in b]
    scored = [(x, y) for x, y in zip(a, b) if not x["skipped"]]
    assert scored and all(not y["skipped"] for _, y in scored)
    for x, y in scored:
        assert x["rank"] == y["rank"], (x["prompt"], x["rank"], y["rank"])
        assert math.isclose(x["logprob"], y["logprob"], abs_tol=1e-4), (x["prompt"], x["logprob"], y["logprob"])


def test_the_pair_differs_from_the_references(rows):
    """The check can fail: the two models disagree, so a plan that grafted nothing would not pass as its complement."""
    pre = [r["logprob"] for r in rows["PRE"] if not r["skipped"]]
    sft = [r["logprob"] for r in rows["SFT"] if not r["skipped"]]
    assert max(abs(p - s) for p, s in zip(pre, sft)) > 1e-2


def test_the_default_form_is_no_complement(rows):
    """With the decoder layers alone, `pre->sft:FE` keeps the fine-tuned embeddings and head where `not_FE` keeps the
    pretrained ones: the two score the prompts differently."""
    a = [r["logprob"] for r in rows["pre->sft:FE"] if not r["skipped"]]
    b = [r["logprob"] for r in rows["not_FE"] if not r["skipped"]]
    assert max(abs(x - y) for x, y in zip(a, b)) > 1e-2
