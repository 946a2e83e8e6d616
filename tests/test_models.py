import socket
import pytest
import torch
from dwg.science.facts import embedded, models


def test_prepare_embedded_is_idempotent():
    "A second prepare finds the finished checkpoint and rewrites nothing."
    path = embedded.prepare_embedded()
    before = (path / "config.json").stat().st_mtime_ns
    assert embedded.prepare_embedded() == path
    assert (path / "config.json").stat().st_mtime_ns == before


def test_embedded_architecture():
    "The embedded model is the real SmolLM2-135M: 30 layers, GQA 9/3, tied embeddings, 134.5M parameters."
    model, tok = models.load("smollm2-135m")
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size) == ("llama", 30, 576)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (9, 3)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert abs(sum(p.numel() for p in model.parameters()) / 1e6 - 134.5) < 0.1
    assert tok.pad_token_id is not None and len(tok) == cfg.vocab_size


def test_local_checkpoint_roundtrip(tmp_path):
    "A saved model directory loads back with the same weights (how fine-tuned models are used)."
    model, tok = models.load("tiny-gpt2", seed=3)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    again, tok2 = models.load(tmp_path)
    for (n, p), (_, q) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(p, q), n
    assert tok2("hello")["input_ids"] == tok("hello")["input_ids"]


def test_sweep_training_run_directory_loads(tmp_path):
    "A sweep's training run directory (the checkpoint in its model/) loads; a directory without a model is named."
    model, tok = models.load("tiny-llama", seed=3)
    model.save_pretrained(tmp_path / "run" / "model")
    tok.save_pretrained(tmp_path / "run" / "model")
    again, _ = models.load(tmp_path / "run")
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no model"):
        models.load(tmp_path / "empty")


@pytest.mark.parametrize("name", list(models.TINY_MODELS))
def test_tiny_models_differ_by_seed_and_family(name):
    "Each tiny model is its own family and its weights depend on the seed."
    a, _ = models.load(name, seed=0)
    b, _ = models.load(name, seed=1)
    assert a.config.model_type == models.TINY_MODELS[name]["model_type"]
    pa, pb = next(a.parameters()), next(b.parameters())
    assert pa.shape == pb.shape and not torch.equal(pa, pb)


def test_hub_model_offline_fails_without_a_connection(monkeypatch):
    "With HF_HUB_OFFLINE=1 a hub model that is not cached is a clear error, and no connection is even attempted."

    def no_network(*args, **kwargs):
        raise AssertionError(f"a connection was attempted: {args}")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", no_network)
    with pytest.raises(RuntimeError, match="work offline"):
        models.load("pythia-2.8b")
    with pytest.raises(RuntimeError, match="no model hub is reachable"):
        models.load("someorg/some-model")


def test_unreachable_hub_is_probed_once_with_a_timeout(monkeypatch):
    "Without HF_HUB_OFFLINE an unreachable hub costs one short connection attempt, then the same clear error."
    calls = []

    def unreachable(address, timeout=None):
        calls.append((address, timeout))
        raise OSError("network is unreachable")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "create_connection", unreachable)
    with pytest.raises(RuntimeError, match="no model hub is reachable"):
        models.load("someorg/some-model")
    assert calls == [(("huggingface.co", 443), 3.0)]


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match="tiny-llama"):
        models.load("not-a-model")
