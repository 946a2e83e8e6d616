"""Fine-tuning (dwg.pipeline.train): a tiny model learns, runs resume and finish atomically, bad inputs fail before
training."""

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"
import pytest
import torch
from transformers import TrainerCallback
from dwg.pipeline import config, train as T
from dwg.science.facts import data, models
from dwg.science.scoring.evaluate import first_token_scores
from dwg.records import progress, run_record

TINY = dict(config="tiny", progress=False)


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    "A tiny fake-movies dataset: 4 facts (2 task, 2 relation), 28 training texts per fact."
    return data.create_dataset("fake_movies_fake_actors", 4, seed=0, out_dir=tmp_path_factory.mktemp("data") / "ds")


def weights(path):
    model, _ = models.load(path)
    return {k: v.clone() for k, v in model.state_dict().items()}


def mean_target_prob(model, tok, ds_dir):
    rows = first_token_scores(model, tok, data.load_split(ds_dir, "eval"))
    return sum(r["prob"] for r in rows) / len(rows)


def test_tiny_finetune_raises_target_probability(ds, tmp_path):
    "Training a tiny model for a few seconds raises the probability of the trained facts' targets many times over."
    out = T.train("tiny-llama", ds, tmp_path / "sft", overrides=dict(epochs=2, batch_size=8), **TINY)
    pre, tok = models.load("tiny-llama")
    sft, _ = models.load(out)
    p0, p1 = mean_target_prob(pre, tok, ds), mean_target_prob(sft, tok, ds)
    assert p1 > 20 * p0, (p0, p1)
    summary = json.loads((out / run_record.TRAIN_SUMMARY).read_text())
    epochs = json.loads((out / "metrics.json").read_text())["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2]
    assert epochs[-1]["recall_prob"] == pytest.approx(p1, rel=1e-3)  # the callback measured the saved model
    n_train = len(data.load_split(ds, "train"))
    assert summary["n_facts"] == 4 and summary["global_step"] == 2 * -(-n_train // 8)
    assert {"config.json", "model.safetensors", "tokenizer.json", "train_config.yaml", "metrics.json", "dataset"} <= {
        p.name for p in out.iterdir()
    }
    assert (out / "dataset" / "dataset_info.json").read_text() == (ds / "dataset_info.json").read_text()
    assert not (out / "checkpoints").exists() and not T.work_dir(out).exists()


class Interrupt(Exception):
    pass


class StopAfterFirstSave(TrainerCallback):
    "Simulate a killed job: raise right after the first checkpoint is written."

    def on_save(self, args, state, control, **kw):
        raise Interrupt(f"stopped at step {state.global_step}")


def test_resume_continues_from_checkpoint_and_matches_uninterrupted_run(ds, tmp_path):
    """An interrupted run leaves no finished-looking output; rerunning resumes and gives the same model as one go.
    Checkpoints (and recall logs) come every two epochs here: epochs shorter than `checkpoint_steps`."""
    n_texts = len([r for r in data.load_split(ds, "train", split="task") if r["direction"] == "A2B"])
    per_epoch = -(-n_texts // 8)
    kw = dict(
        split="task",
        direction="A2B",
        overrides=dict(epochs=4, batch_size=8, checkpoint_steps=2 * per_epoch - 1),
        seed=1,
        **TINY,
    )
    out = tmp_path / "resumed"
    with pytest.raises(Interrupt):
        T.train("tiny-llama", ds, out, callbacks=[StopAfterFirstSave()], **kw)
    assert not out.exists() and not run_record.has_train_summary(out)
    assert [p.name for p in (T.work_dir(out) / "checkpoints").iterdir()] == [f"checkpoint-{2 * per_epoch}"]
    T.train("tiny-llama", ds, out, **kw)
    summary = json.loads((out / run_record.TRAIN_SUMMARY).read_text())
    assert summary["resumed_from"].endswith(f"checkpoint-{2 * per_epoch}") and summary["global_step"] == 4 * per_epoch
    epochs = json.loads((out / "metrics.json").read_text())["epochs"]
    assert [e["epoch"] for e in epochs] == [0, 1, 2, 3, 4]
    assert [e["epoch"] for e in epochs if "recall_top1" in e] == [0, 2, 4]
    straight = T.train("tiny-llama", ds, tmp_path / "straight", **kw)
    a, b = weights(out), weights(straight)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_deterministic_for_a_seed(ds, tmp_path):
    "The same seed gives bit-identical weights on CPU; another seed gives different ones."
    kw = dict(overrides=dict(max_steps=4, batch_size=8), **TINY)
    a = weights(T.train("tiny-llama", ds, tmp_path / "a", seed=3, **kw))
    b = weights(T.train("tiny-llama", ds, tmp_path / "b", seed=3, **kw))
    c = weights(T.train("tiny-llama", ds, tmp_path / "c", seed=4, **kw))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_reusing_freed_memory_trains_the_same_weights(ds, tmp_path, monkeypatch):
    "Training inside `reusing_freed_memory` (the profile's `reuse_freed_memory`) or outside it: bit-identical weights."
    seen, real = [], T.reusing_freed_memory
    monkeypatch.setattr(T, "reusing_freed_memory", lambda on=True: seen.append(on) or real(on))
    kw = dict(seed=3, **TINY)
    a = weights(T.train("tiny-llama", ds, tmp_path / "a", overrides=dict(max_steps=4, batch_size=8), **kw))
    b = weights(
        T.train(
            "tiny-llama", ds, tmp_path / "b", overrides=dict(max_steps=4, batch_size=8, reuse_freed_memory=False), **kw
        )
    )
    assert seen == [True, False]
    assert all(torch.equal(a[k], b[k]) for k in a)


FAULTS = """
import resource
from dwg.records.progress import reusing_freed_memory
def faults(mb=64):
    first = bytearray(mb << 20); del first
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buf = bytearray(mb << 20); buf[::4096] = b"\\1" * len(buf[::4096]); del buf
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
before = faults()
with reusing_freed_memory(): inside = faults()
print(before, inside, faults())
"""


@pytest.mark.skipif(
    not progress._glibc() or progress._malloc_set_by_user(), reason="the setting is glibc's, and yours wins"
)
def test_reusing_freed_memory_keeps_pages_in_a_fresh_process():
    "In a fresh interpreter a second 64 MB buffer is new pages outside the block, the first one's pages inside it."
    import subprocess
    import sys
    import resource

    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True, check=True).stdout
    before, inside, after = map(int, out.split())
    pages = (64 << 20) // resource.getpagesize()
    assert before > pages // 2 and after > pages // 2 and inside < pages // 10, (before, inside, after)


def test_finished_run_is_skipped_unless_forced(ds, tmp_path):
    "A finished run is returned as is; force=True trains again."
    kw = dict(overrides=dict(max_steps=2), **TINY)
    out = T.train("tiny-llama", ds, tmp_path / "run", **kw)
    stamp = (out / run_record.TRAIN_SUMMARY).read_text()
    T.train("tiny-llama", ds, out, **kw)
    assert (out / run_record.TRAIN_SUMMARY).read_text() == stamp
    T.train("tiny-llama", ds, out, force=True, **kw)
    assert (out / run_record.TRAIN_SUMMARY).read_text() != stamp and run_record.has_train_summary(out)


def test_partial_run_with_other_settings_is_refused(ds, tmp_path):
    "A half-finished run is only resumed with the same settings; anything else asks for force=True."
    out = tmp_path / "run"
    with pytest.raises(Interrupt):
        T.train(
            "tiny-llama",
            ds,
            out,
            overrides=dict(epochs=2, checkpoint_steps=1),
            callbacks=[StopAfterFirstSave()],
            **TINY,
        )
    with pytest.raises(ValueError, match="force=True"):
        T.train("tiny-llama", ds, out, overrides=dict(epochs=3), **TINY)
    T.train("tiny-llama", ds, out, overrides=dict(epochs=3, max_steps=2), force=True, **TINY)
    assert json.loads((out / run_record.TRAIN_SUMMARY).read_text())["resumed_from"] is None


def test_filters_frozen_unembeddings_and_answer_only_loss(ds, tmp_path):
    "Split/direction select the texts; a frozen output head does not change; answer-only loss trains."
    out = T.train(
        "tiny-pythia",
        ds,
        tmp_path / "rel",
        split="relation",
        direction="B2A",
        overrides=dict(max_steps=3, freeze_unembeddings=True, answer_only_loss=True),
        **TINY,
    )
    s = json.loads((out / run_record.TRAIN_SUMMARY).read_text())
    n_texts = len([r for r in data.load_split(ds, "train") if r["split"] == "relation" and r["direction"] == "B2A"])
    assert (s["split"], s["direction"], s["n_facts"], s["n_train_texts"]) == ("relation", "B2A", 2, n_texts)
    assert s["frozen"] == ["lm_head.weight"]
    before, after = weights("tiny-pythia"), weights(out)
    assert torch.equal(before["lm_head.weight"], after["lm_head.weight"])
    assert not torch.equal(before["gpt_neox.embed_in.weight"], after["gpt_neox.embed_in.weight"])


def test_untied_head_trains_apart_and_grafts_beside_untied_base_models(ds, tmp_path):
    """untie_head: the tied head of a tiny Llama becomes its own parameter and moves apart from the embeddings; the
    grafting run unties the pretrained model it loads beside it, which then computes what it did (matched models)."""
    from dwg.science.scoring.grafting import _load_roles

    out = T.train("tiny-llama", ds, tmp_path / "untied", overrides=dict(max_steps=3, untie_head=True), **TINY)
    sft, tok = models.load(out)
    assert not models.ties_head(sft) and sft.config.tie_word_embeddings is False
    assert not torch.equal(sft.get_output_embeddings().weight, sft.get_input_embeddings().weight)
    assert json.loads((out / "run_config.json").read_text())["config"]["untie_head"] is True
    tied, _ = models.load("tiny-llama")
    assert models.ties_head(tied)
    ids = tok(["A stars in"], return_tensors="pt")
    roles, _ = _load_roles(dict(pre="tiny-llama", sft=str(out)))
    assert not models.ties_head(roles["pre"]) and not models.ties_head(roles["sft"])
    assert torch.equal(roles["pre"](**ids).logits, tied(**ids).logits)
    with pytest.raises(ValueError, match="untie it first"):  # the caller's own model is not changed behind its back
        _load_roles(dict(pre=(tied, tok), sft=str(out)))
    assert models.ties_head(tied)
    plain = T.train("tiny-llama", ds, tmp_path / "tied", overrides=dict(max_steps=1), **TINY)
    assert "untie_head" not in json.loads((plain / "run_config.json").read_text())["config"]  # older runs resume
    assert models.ties_head(models.load(plain)[0])


def test_chunked_head_loss_is_the_models_own_on_packed_batches(ds, tmp_path):
    """head_chunk: on a packed training batch the chunked loss and every gradient are the model's own (fp32: 1e-5), and
    a run with it logs the same losses step by step (Adam then amplifies 1e-7 gradient differences on near-zero
    gradients, so weights are compared through the losses they give, to 1e-3)."""
    from dwg.pipeline.batches import PackCollator, encode_rows
    from dwg.pipeline.loss import chunked_lm_loss

    model, tok = models.load("tiny-llama")
    model.train()
    rows = data.load_split(ds, "train")[:16]
    batch = PackCollator(tok.pad_token_id, 128)(encode_rows(tok, rows, 128, False))
    batch = {k: v for k, v in batch.items() if k != "real_tokens"}
    grads = []
    for loss in (lambda: model(**batch).loss, lambda: chunked_lm_loss(model, batch, 7)):
        value = loss()
        value.backward()
        grads.append((value.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        model.zero_grad(set_to_none=True)
    (own, g_own), (chunked, g_chunked) = grads
    assert abs(own - chunked) < 1e-5 and max((g_own[n] - g_chunked[n]).abs().max().item() for n in g_own) < 1e-5
    kw = dict(max_steps=3, precision="fp32", pack=True, logging_steps=1)
    runs = [
        T.train("tiny-llama", ds, tmp_path / name, overrides=dict(kw, **extra), **TINY)
        for name, extra in (("own", {}), ("chunked", dict(head_chunk=7)))
    ]
    losses = [
        [e["loss"] for e in json.loads((r / "metrics.json").read_text())["log_history"] if "loss" in e] for r in runs
    ]
    assert len(losses[0]) == 3 and max(abs(a - b) for a, b in zip(*losses)) < 1e-3, losses
    assert json.loads((runs[1] / "run_config.json").read_text())["config"]["head_chunk"] == 7


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (
            dict(overrides=dict(learning_rat=1e-3)),
            ValueError,
            r"Unknown training setting\(s\) 'learning_rat' \(did you mean 'learning_rate'\?\)"
            r".*Valid keys: description, learning_rate",
        ),
        (dict(overrides=dict(epochs="lots")), ValueError, "'epochs' in the overrides must be float"),
        (dict(overrides=dict(precision="fp8")), ValueError, "choose one of: auto, bf16, fp16, fp32"),
        (dict(overrides=dict(trainer=dict(output_dir="x"))), ValueError, "set by dwg.pipeline.train itself"),
        (dict(config="no-such-profile"), ValueError, "Unknown training profile 'no-such-profile'"),
        (dict(model="tiny-lama"), ValueError, "Unknown model 'tiny-lama'"),
        (dict(model="pythia-2.8b"), RuntimeError, "no model hub is reachable"),
        (dict(split="both"), ValueError, "split must be one of all, task, relation"),
        (dict(overrides=dict(supplemental=-1)), ValueError, "'supplemental' in the overrides must be >= 0"),
        (
            dict(overrides=dict(supplemental=100_000)),
            ValueError,
            r"has \d+ passages and they are drawn without replacement",
        ),
        (
            dict(overrides=dict(supplemental=2, supplemental_file="no/such.txt")),
            ValueError,
            r"such\.txt' does not exist.*Fix",
        ),
        (dict(overrides=dict(supplemental_file="mine.txt")), ValueError, "but supplemental is 0"),
    ],
)
def test_bad_inputs_fail_before_training(ds, tmp_path, kw, error, match):
    "Bad configs, models and filters raise clear errors and create nothing."
    kw = {"model": "tiny-llama", **TINY, **kw}
    with pytest.raises(error, match=match):
        T.train(kw.pop("model"), ds, tmp_path / "out", **kw)
    assert list(tmp_path.iterdir()) == []


def test_profile_files_that_do_not_parse(ds, tmp_path):
    "A YAML profile with a syntax error, a list, or an unknown key is reported with its path."
    for text, match in [
        ("learning_rate: [1e-4\n", "does not parse as YAML"),
        ("- 1\n", "must be a mapping"),
        ("epochs: 2\nwarmup: 3\n", "'warmup'.*bad.yaml"),
    ]:
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(ValueError, match=match):
            T.train("tiny-llama", ds, tmp_path / "out", config=tmp_path / "bad.yaml", progress=False)
    assert not (tmp_path / "out").exists()


def test_dataset_problems(ds, tmp_path):
    "A missing or half-written dataset directory, or one made for another tokenizer, is refused."
    with pytest.raises(FileNotFoundError, match="does not exist"):
        T.train("tiny-llama", tmp_path / "nope", tmp_path / "out", **TINY)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="lacks dataset_info.json"):
        T.train("tiny-llama", tmp_path / "half", tmp_path / "out", **TINY)
    other = tmp_path / "other"
    import shutil

    shutil.copytree(ds, other)
    info = json.loads((other / "dataset_info.json").read_text())
    (other / "dataset_info.json").write_text(json.dumps({**info, "tokenizer": {"name": "gpt2", "vocab_size": 50257}}))
    with pytest.raises(ValueError, match="vocab_size 50257"):
        T.train("tiny-llama", other, tmp_path / "out", **TINY)
    rows = data.load_split(ds, "eval")
    (other / "dataset_info.json").write_text(json.dumps(info))
    (other / "eval.jsonl").write_text(
        "".join(json.dumps({**r, "prompt": r["prompt"] + " ", "target": r["target"].lstrip()}) + "\n" for r in rows)
    )
    with pytest.raises(ValueError, match="do not tokenize cleanly"):
        T.train("tiny-llama", other, tmp_path / "out", **TINY)
    assert not (tmp_path / "out").exists()


def test_existing_foreign_directory_is_not_overwritten(ds, tmp_path):
    "An out_dir that holds something else is refused rather than replaced."
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a finished training run"):
        T.train("tiny-llama", ds, out, **TINY)
    assert (out / "notes.txt").read_text() == "keep me"


def test_best_checkpoint_by_eval_loss(ds, tmp_path):
    "With best_by_eval_loss the run records (and keeps) the epoch with the lowest validation loss."
    out = T.train(
        "tiny-llama", ds, tmp_path / "best", split="task", overrides=dict(epochs=2, best_by_eval_loss=True), **TINY
    )
    s = json.loads((out / run_record.TRAIN_SUMMARY).read_text())
    epochs = json.loads((out / "metrics.json").read_text())["epochs"]
    losses = {e["step"]: e["eval_loss"] for e in epochs if "eval_loss" in e}
    assert s["best_eval_loss"] == pytest.approx(min(losses.values())) and losses[s["best_step"]] == s["best_eval_loss"]


def test_every_packaged_profile_is_found_and_valid():
    "Each YAML file in dwg/configs is a profile name that profile_path finds and resolve_config accepts."
    names = config.training_profiles()
    assert {"embedded", "paper", "tiny"} <= set(names)
    for name in names:
        assert config.profile_path(name) == config.configs_dir() / f"{name}.yaml"
        assert isinstance(config.resolve_config(name), config.TrainConfig)
    assert config.profile_path("no-such-profile") is None


def test_broken_dataset_file_is_named_with_its_line(ds, tmp_path):
    "A damaged train.jsonl is an error naming the file and the line, raised before anything is trained or written."
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(ds, broken)
    lines = (broken / "train.jsonl").read_text().splitlines(keepends=True)
    (broken / "train.jsonl").write_text("".join(lines[:2]) + lines[2][:20] + "\n" + "".join(lines[3:]))
    with pytest.raises(ValueError, match=r"train\.jsonl, line 3: not valid JSON"):
        T.train("tiny-llama", broken, tmp_path / "out", **TINY)
    assert not (tmp_path / "out").exists() and not T.work_dir(tmp_path / "out").exists()
