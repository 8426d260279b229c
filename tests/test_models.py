"""Model registry, loading errors, vocabulary checks, CLI errors."""
import pytest

from draftwise.build import VocabularyMismatch, check_vocabularies
from draftwise.cli import main
from draftwise.models import registry
from draftwise.models.load import load_tokenizer
from draftwise.models.registry import ModelNotFound, ensure_packaged, resolve


def test_packaged_model_is_verified():
    path = ensure_packaged("smollm2-135m")
    assert path.is_file() and registry.sha256_file(path) == registry.PACKAGED["smollm2-135m"].sha256


def test_resolution_errors(tmp_path):
    with pytest.raises(ModelNotFound, match="no-such-model"):
        resolve("no-such-model")
    with pytest.raises(ModelNotFound, match="missing.gguf"):
        resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFound, match="config.json"):
        resolve(str(tmp_path))
    with pytest.raises(ModelNotFound, match="unknown packaged model"):
        ensure_packaged("gpt-5")


def test_corrupt_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "model.gguf"
    f.write_bytes(b"not a model")
    with pytest.raises(ModelNotFound, match="model.gguf is corrupt"):
        registry._verify(f, "0" * 64)
    registry._verify(f, registry.sha256_file(f))  # the right digest passes


def test_vocabulary_check_compares_token_lists():
    smol = load_tokenizer(resolve("smollm2-135m"))
    qwen15 = load_tokenizer(resolve("qwen2.5-coder-1.5b"))
    qwen05 = load_tokenizer(resolve("qwen2.5-coder-0.5b"))
    check_vocabularies(qwen15, qwen05, "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")  # identical lists
    with pytest.raises(VocabularyMismatch, match="smollm2-135m.*qwen2.5-coder-1.5b"):
        check_vocabularies(qwen15, smol, "qwen2.5-coder-1.5b", "smollm2-135m")


def test_cli_reports_bad_input(capsys):
    assert main(["generate", "--target", "/nowhere/model.gguf", "--backend", "torch"]) == 2
    assert "/nowhere/model.gguf does not exist" in capsys.readouterr().err
    assert main(["generate", "--target", "smollm2-135m", "--backend", "torch", "--drafter", "ngram",
                 "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err
