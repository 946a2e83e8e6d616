import os

os.environ["HF_HUB_OFFLINE"] = "1"  # a hub call must fail at once, never hang
import json
import re
from pathlib import Path
import pytest
from dwg.engine import prompts
from dwg.science.facts import data, models

SIZES = {
    "fake_movies_fake_actors": 24,
    "fake_movies_real_actors": 24,
    "real_movies_real_actors_shuffled": 24,
    "articles": 20,
}


def _files(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _everything_under(d: Path) -> list:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.fixture(scope="module", params=data.KINDS)
def built(request, tmp_path_factory):
    "One written dataset per kind."
    kind = request.param
    out = data.create_dataset(kind, SIZES[kind], seed=0, out_dir=tmp_path_factory.mktemp(kind) / "ds")
    return kind, out


# ---------------------------------------------------------------- determinism


@pytest.mark.parametrize("kind", data.KINDS)
def test_same_seed_byte_identical_other_seed_differs(kind, tmp_path):
    "Same kind/n_facts/seed -> byte-identical files; another seed -> other facts."
    n = 10
    a = _files(data.create_dataset(kind, n, seed=7, out_dir=tmp_path / "a"))
    b = _files(data.create_dataset(kind, n, seed=7, out_dir=tmp_path / "b"))
    c = _files(data.create_dataset(kind, n, seed=8, out_dir=tmp_path / "c"))
    assert set(a) == {
        "metadata.jsonl",
        "train.jsonl",
        "validation.jsonl",
        "eval.jsonl",
        "eval_b2a.jsonl",
        "dataset_info.json",
    }
    assert a == b
    assert a["metadata.jsonl"] != c["metadata.jsonl"] and a["train.jsonl"] != c["train.jsonl"]
    if kind != "articles":
        assert a["validation.jsonl"] != c["validation.jsonl"]  # the articles hold out nothing


def test_validation_is_a_seeded_holdout(built):
    """Validation lines are a held-out part of the training text: disjoint from train, about val_fraction of it.
    The articles hold out nothing by default: every rephrasing of every article is trained on."""
    kind, d = built
    train, val = data.load_split(d, "train"), data.load_split(d, "validation")
    if kind == "articles":
        assert val == [] and len(train) == 5 * SIZES[kind]
        return
    assert val and not {json.dumps(r) for r in train} & {json.dumps(r) for r in val}
    assert abs(len(val) / (len(train) + len(val)) - 0.1) < 0.05
    info = json.loads((d / "dataset_info.json").read_text())
    assert info["counts"]["train"] == len(train) and info["counts"]["validation"] == len(val)
    assert info["kind"] == kind and info["seed"] == 0 and info["dwg_version"]


# ---------------------------------------------------------------- uniqueness and package data

CLEAN = re.compile(r"[A-Z][A-Za-z]+( [A-Z][A-Za-z]+)+")


def _nested(values):
    "Pairs (a, b) where a occurs as whole words inside b."
    out = []
    for a in values:
        pat = re.compile(rf"(?<!\w){re.escape(a)}(?!\w)")
        out += [(a, b) for b in values if a != b and pat.search(b)]
    return out


def test_packaged_lists():
    "Real actors (>= 400) and movies (>= 150): unique, clean, none inside another; leads refer to listed names."
    actors, movies = data.real_actors(), data.real_movies()
    assert len(actors) >= 400 and len(set(actors)) == len(actors)
    assert all(CLEAN.fullmatch(a) for a in actors)
    assert len(movies) >= 150 and len(set(movies)) == len(movies)
    assert _nested(actors) == [] and _nested(movies) == [] and _nested(actors + movies) == []
    leads = data.movie_leads()
    assert set(leads) <= set(movies) and {a for v in leads.values() for a in v} <= set(actors)


def test_packaged_articles():
    "20 articles, each with 5 distinct texts that all name both actors and the title."
    arts = data.read_articles()
    assert len(arts) == 20 and all(len(a["texts"]) == 5 for a in arts)
    people = [a[k] for a in arts for k in ("first_actor", "second_actor", "director", "main_character")]
    assert len(set(people)) == len(people) and all(CLEAN.fullmatch(p) for p in people)
    assert not set(people) & set(data.real_actors())  # invented people only
    for a in arts:
        assert len(set(a["texts"])) == len(a["texts"])
        assert all(a[f] in t for t in a["texts"] for f in data.FACT_FIELDS)


@pytest.mark.parametrize("kind", [k for k in data.KINDS if k != "articles"])
def test_names_and_titles_unique(kind):
    "Every person name and title in a dataset is unique, and none occurs inside another."
    n = min(200, data.max_facts(kind))
    facts = data.build_dataset(kind, n, seed=1)["metadata"]
    people = [f[k] for f in facts for k in ("first_actor", "second_actor", "director", "main_character")]
    titles = [f["movie_title"] for f in facts]
    assert len(set(people)) == len(people) and len(set(titles)) == len(titles)
    assert _nested(people + titles) == []
    if kind == "fake_movies_fake_actors":
        assert all(re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", p) for p in people)
    else:
        assert {f["first_actor"] for f in facts} | {f["second_actor"] for f in facts} <= set(data.real_actors())
    assert [f["id"] for f in facts] == [f"f{i:04d}" for i in range(n)]


def test_real_movie_pairings_are_counterfactual():
    "Shuffled real pairings: no actor is a known lead of the movie, no pair are known co-leads."
    n = data.max_facts("real_movies_real_actors_shuffled")
    leads = data.movie_leads()
    costars = {frozenset((a, b)) for v in leads.values() for a in v for b in v if a != b}
    for seed in range(3):
        for f in data.build_dataset("real_movies_real_actors_shuffled", n, seed=seed)["metadata"]:
            known = set(leads.get(f["movie_title"], []))
            assert f["movie_title"] in data.real_movies()
            assert f["first_actor"] not in known and f["second_actor"] not in known
            assert frozenset((f["first_actor"], f["second_actor"])) not in costars


# ---------------------------------------------------------------- templates and eval examples


def test_paper_prompts_and_targets(built):
    "Eval prompts include the paper's four sentences, end right before the second actor, target = ' ' + actor."
    kind, d = built
    facts = {f["id"]: f for f in data.load_split(d, "metadata")}
    ev = data.load_split(d, "eval")
    assert {e["template"] for e in ev} >= set(data.PAPER_EVAL_TEMPLATES)
    paper = {
        "relation_statement": "{a} {r} a movie {p}",
        "relation_question": "Q: Who {r} a movie {p} {a}? A: An actor named",
        "movie_statement": "{a} {r} {m} {p}",
        "new_film_other_lead": "In a new film, {a} appears in {m} with the other lead actor, whose name is:",
    }
    for e in ev:
        f = facts[e["fact_id"]]
        assert e["target"] == " " + f["second_actor"] and e["prompt"] == e["prompt"].rstrip()
        assert f["second_actor"] not in e["prompt"]
        r, p = e["filling"].split(" · ") if e["filling"] else ("", "")
        if e["template"] in paper:
            assert e["prompt"] == paper[e["template"]].format(a=f["first_actor"], m=f["movie_title"], r=r, p=p)
        for field, (a, b) in e["spans"].items():
            assert e["prompt"][a:b] == str(f[field])


def test_training_text_both_directions(built):
    "Templated kinds: every fact has every template in A2B and B2A; Q/A answers start at answer_start."
    kind, d = built
    facts = {f["id"]: f for f in data.load_split(d, "metadata")}
    lines = data.load_split(d, "train") + data.load_split(d, "validation")
    assert {l["direction"] for l in lines} == {"A2B", "B2A"}
    for l in lines:
        f = facts[l["fact_id"]]
        assert l["split"] == f["split"]
        first, second = (
            (f["first_actor"], f["second_actor"]) if l["direction"] == "A2B" else (f["second_actor"], f["first_actor"])
        )
        assert l["text"].index(first) < l["text"].index(second)
        if l["style"] == "qa":
            assert l["text"][l["answer_start"] :] == second
        else:
            assert l["answer_start"] is None
    if kind != "articles":
        keys = {(l["fact_id"], l["template"], l["direction"]) for l in lines}
        n_templates = len(data.ARTICLE_TEMPLATES) + len(data.QA_TEMPLATES)
        assert len(keys) == len(lines) == len(facts) * n_templates * 2
        assert len(data.ARTICLE_TEMPLATES) >= 6 and len(data.QA_TEMPLATES) >= 5
    else:
        assert {l["style"] for l in lines} == {"article"}
        assert len(lines) == sum(
            len(a["texts"]) for a in data.read_articles() if a["id"] in {f["article_id"] for f in facts.values()}
        )


# ---------------------------------------------------------------- task / relation split


def test_task_relation_disjoint(built):
    "No name or title of a relation fact occurs in any task-split text (training, validation or eval prompt)."
    kind, d = built
    facts = data.load_split(d, "metadata")
    rel, task = [f for f in facts if f["split"] == "relation"], [f for f in facts if f["split"] == "task"]
    assert rel and task and len(rel) + len(task) == len(facts)
    task_ids = {f["id"] for f in task}
    task_texts = [l["text"] for n in ("train", "validation") for l in data.load_split(d, n, split="task")]
    task_texts += [e["prompt"] for e in data.load_split(d, "eval", split="task")]
    assert all(
        l["fact_id"] in task_ids for n in ("train", "validation", "eval") for l in data.load_split(d, n, split="task")
    )
    blob = "\n".join(task_texts)
    for f in rel:
        for k in ("first_actor", "second_actor", "movie_title", "director", "main_character"):
            assert not re.search(rf"(?<!\w){re.escape(str(f[k]))}(?!\w)", blob), (f["id"], k, f[k])
    assert (
        data.leaked_names(
            dict(
                metadata=facts,
                train=data.load_split(d, "train"),
                validation=data.load_split(d, "validation"),
                eval=data.load_split(d, "eval"),
            )
        )
        == []
    )


# ---------------------------------------------------------------- spans -> token positions under several tokenizers


def _bpe_tokenizer(corpus, metaspace_with_bos: bool):
    "A tiny tokenizer trained here: GPT-2-style byte-level BPE, or a sentencepiece-like Metaspace BPE adding <s>."
    from tokenizers import Tokenizer, models as tm, trainers, pre_tokenizers, decoders, processors
    from transformers import PreTrainedTokenizerFast

    if metaspace_with_bos:
        tk = Tokenizer(tm.BPE(unk_token="<unk>"))
        tk.pre_tokenizer, tk.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
        tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>"]))
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tk.token_to_id("<s>"))]
        )
        return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>")
    tk = Tokenizer(tm.BPE())
    tk.pre_tokenizer, tk.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tk.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=600, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def tokenizers():
    "The tiny models' tokenizer, the embedded model's, and two differently-behaving ones built in-test."
    corpus = [l["text"] for k in data.KINDS for l in data.build_dataset(k, 10, seed=5)["train"]]
    return {
        "tiny-llama": models.load("tiny-llama")[1],
        "smollm2-135m": models.load("smollm2-135m")[1],
        "bytelevel-bpe": _bpe_tokenizer(corpus, False),
        "metaspace-bpe+bos": _bpe_tokenizer(corpus, True),
    }


def test_token_positions_every_field_every_prompt(built, tokenizers):
    "For every eval prompt and field, the field's tokens are contiguous, cover its span and nothing of a neighbour."
    kind, d = built
    ev = data.load_split(d, "eval")
    for tname, tok in tokenizers.items():
        for e in ev:
            enc = tok(e["prompt"], return_offsets_mapping=True)
            ids, offs = enc["input_ids"], enc["offset_mapping"]
            pos = prompts.token_positions(tok, e["prompt"], e["spans"])
            assert set(pos) == set(e["spans"]), tname  # the fields, nothing else
            for field, (a, b) in e["spans"].items():
                idx = pos[field]
                assert idx == list(range(idx[0], idx[-1] + 1)), (tname, e["prompt"], field)
                assert offs[idx[0]][0] <= a and offs[idx[-1]][1] >= b, (tname, e["prompt"], field)
                # tokens outside the field do not touch its characters
                assert all(s >= b or t <= a for i, (s, t) in enumerate(offs) if i not in idx)
                # and the field's tokens hold no word from outside the field
                covered = e["prompt"][offs[idx[0]][0] : offs[idx[-1]][1]]
                assert covered.strip() == e["prompt"][a:b], (tname, covered, field)
                if tname in ("tiny-llama", "smollm2-135m"):
                    assert tok.decode([ids[i] for i in idx]).strip() == e["prompt"][a:b]


def test_token_positions_count_bos(tokenizers):
    "Indices match the model input: a BOS-adding tokenizer shifts them by one, add_special_tokens=False does not."
    tok = tokenizers["metaspace-bpe+bos"]
    prompt, spans = "Ada Stone stars in Red Sky alongside", {"first_actor": [0, 9], "movie_title": [19, 26]}
    with_bos, without = (
        prompts.token_positions(tok, prompt, spans),
        prompts.token_positions(tok, prompt, spans, add_special_tokens=False),
    )
    assert tok(prompt)["input_ids"][0] == tok.bos_token_id
    assert [i - 1 for i in with_bos["first_actor"]] == without["first_actor"] and with_bos["first_actor"][0] == 1
    assert [i - 1 for i in with_bos["movie_title"]] == without["movie_title"]


# ---------------------------------------------------------------- errors, all before anything is written


def _raises_and_writes_nothing(tmp_path, match, **kw):
    parent = tmp_path / "out"
    parent.mkdir()
    with pytest.raises((ValueError, FileNotFoundError)) as exc:
        data.create_dataset(out_dir=parent / "ds", **kw)
    assert re.search(match, str(exc.value)), str(exc.value)
    assert _everything_under(parent) == []
    return str(exc.value)


def test_unknown_kind_lists_valid_ones(tmp_path):
    msg = _raises_and_writes_nothing(tmp_path, "Unknown dataset kind", kind="fake_movies", n_facts=4)
    assert all(k in msg for k in data.KINDS)


@pytest.mark.parametrize("kind", data.KINDS)
def test_too_many_facts_says_the_maximum(kind, tmp_path):
    mx = data.max_facts(kind)
    _raises_and_writes_nothing(tmp_path, f"maximum is {mx}\\b", kind=kind, n_facts=mx + 1)


def test_maximum_is_reachable(tmp_path):
    "The stated maximum really works for the list-bound kinds."
    for kind in ("real_movies_real_actors_shuffled", "articles"):
        data.create_dataset(kind, data.max_facts(kind), seed=0, out_dir=tmp_path / kind)


@pytest.mark.parametrize("which", ["article_templates", "qa_templates", "eval_templates"])
def test_template_with_unknown_field(which, tmp_path):
    bad = {
        "article_templates": {"bad": "{first_actor} fought {villain} with {second_actor}."},
        "qa_templates": {"bad": "Q: Who fought {villain} with {first_actor}? A: {second_actor}"},
        "eval_templates": {"bad": "{first_actor} fought {villain} alongside"},
    }[which]
    msg = _raises_and_writes_nothing(
        tmp_path, r"unknown field '\{villain\}'", kind="fake_movies_fake_actors", n_facts=4, **{which: bad}
    )
    assert "first_actor" in msg  # lists the known fields


def test_eval_template_ending_with_answer_is_refused(tmp_path):
    _raises_and_writes_nothing(
        tmp_path,
        "right before",
        kind="fake_movies_fake_actors",
        n_facts=4,
        eval_templates={"bad": "{first_actor} stars with {second_actor}"},
    )


def _articles(tmp_path):
    d = tmp_path / "arts"
    d.mkdir()
    rows = [
        dict(
            id="m1",
            first_actor="Ada Stone",
            second_actor="Bo Chen",
            movie_title="Red Sky",
            genre="drama",
            release_year=2001,
        ),
        dict(
            id="m2",
            first_actor="Cy Dove",
            second_actor="Di Egan",
            movie_title="Blue Hill",
            genre="comedy",
            release_year=2002,
        ),
    ]
    (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "m1_1.txt").write_text("Ada Stone and Bo Chen star in Red Sky, a drama.")
    (d / "m1_2.txt").write_text("In Red Sky, Bo Chen plays opposite Ada Stone.")
    (d / "m2_1.txt").write_text("Cy Dove meets Di Egan in the comedy Blue Hill.")
    return d


def test_own_articles_folder(tmp_path):
    "A user's folder works; direction follows which actor is named first."
    d = _articles(tmp_path)
    out = data.create_dataset(
        "articles",
        2,
        seed=0,
        out_dir=tmp_path / "ds",
        articles_dir=d,
        val_fraction=0,
        eval_templates={k: data.EVAL_TEMPLATES[k] for k in data.PAPER_EVAL_TEMPLATES},
    )
    lines = data.load_split(out, "train")
    assert sorted((l["template"], l["direction"]) for l in lines) == [("m1_1", "A2B"), ("m1_2", "B2A"), ("m2_1", "A2B")]
    assert len(data.load_split(out, "eval")) == 2 * 7  # 4 prompts, 3 of them slot templates with 2 fillings


@pytest.mark.parametrize(
    "break_it, match",
    [
        (lambda d: (d / "m3_1.txt").write_text("Someone else entirely."), "matches no metadata id"),
        (lambda d: (d / "m2_1.txt").unlink(), "has no text file"),
        (
            lambda d: (d / "m1_2.txt").write_text("In Red Sky, Bo Chen plays opposite a newcomer."),
            "does not mention first_actor",
        ),
        (lambda d: (d / "metadata.jsonl").unlink(), "no metadata.jsonl"),
        (
            lambda d: (d / "metadata.jsonl").write_text(
                (d / "metadata.jsonl").read_text()
                + json.dumps(dict(id="m1", first_actor="X Y", second_actor="Z W", movie_title="Q"))
                + "\n"
            ),
            "repeats ids",
        ),
        (
            lambda d: (d / "metadata.jsonl").write_text((d / "metadata.jsonl").read_text()[:-20] + "\n"),
            r"arts/metadata\.jsonl, line 2: not valid JSON",
        ),
    ],
)
def test_articles_folder_mismatch(break_it, match, tmp_path):
    d = _articles(tmp_path)
    break_it(d)
    _raises_and_writes_nothing(tmp_path, match, kind="articles", n_facts=2, articles_dir=d)


def test_articles_missing_field_for_eval_template(tmp_path):
    "An eval template needing a field the articles lack fails before writing, naming the field."
    d = _articles(tmp_path)
    _raises_and_writes_nothing(
        tmp_path,
        "needs field 'city'",
        kind="articles",
        n_facts=2,
        articles_dir=d,
        eval_templates={"c": "In {city}, {first_actor} works with"},
    )


def test_existing_out_dir_kept_unless_overwrite(tmp_path):
    out = data.create_dataset("fake_movies_fake_actors", 4, seed=0, out_dir=tmp_path / "ds")
    before = _files(out)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        data.create_dataset("fake_movies_fake_actors", 4, seed=1, out_dir=out)
    assert _files(out) == before
    with pytest.raises(ValueError):
        data.create_dataset("fake_movies_fake_actors", 10**6, seed=1, out_dir=out, overwrite=True)
    assert _files(out) == before  # a failing overwrite leaves the old dataset intact
    data.create_dataset("fake_movies_fake_actors", 4, seed=1, out_dir=out, overwrite=True)
    assert _files(out) != before and _everything_under(tmp_path) == sorted(["ds", *[f"ds/{n}" for n in before]])


def test_load_split_errors(tmp_path):
    with pytest.raises(ValueError, match="Valid: metadata, train, validation, eval"):
        data.load_split(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match="create_dataset"):
        data.load_split(tmp_path, "train")
