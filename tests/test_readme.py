"""The README's Python example runs as written (with local paths substituted)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_readme_reward_model_example_runs(tmp_path, small_pref_file, monkeypatch):
    from olingo.recipes.common import resolve_path

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "RewardModelTrainer(" in b)
    example = (
        example.replace("path/to/model", resolve_path("builtin:tiny-llama"))
        .replace("pref_train.jsonl", str(small_pref_file))
        .replace("pref_eval.jsonl", str(small_pref_file))
        .replace("./runs/rm", str(tmp_path / "rm"))
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert (tmp_path / "rm" / "checkpoints" / "final" / "model" / "model.safetensors").exists()
    assert (tmp_path / "rm" / "eval" / "epoch_2.json").exists()


@pytest.mark.slow
def test_readme_sft_example_runs(tmp_path, assets, monkeypatch):
    from olingo.recipes.common import resolve_path

    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "SFTTrainer(" in b)
    example = (
        example.replace("path/to/model", resolve_path("builtin:tiny-llama"))
        .replace("chats.jsonl", str(assets.sft_eval))
        .replace("./runs/sft", str(tmp_path / "sft"))
    )
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {})
    assert (tmp_path / "sft" / "checkpoints" / "final" / "model" / "model.safetensors").exists()
    # 67 rows = 9 batches of 8 = one group of 8 and a short group of 1 (which still steps), x 2 epochs
    assert len((tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()) == 4


@pytest.mark.slow
def test_readme_ppo_example_runs(tmp_path, assets, monkeypatch):
    from olingo.models import RewardModel

    rm_dir = tmp_path / "rm"
    RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=0).save_pretrained(rm_dir)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "PPOTrainer(" in b)
    example = (
        example.replace("path/to/sft", str(assets.model_dir))
        .replace("path/to/rm", str(rm_dir))
        .replace("prompts.jsonl", str(assets.prompts_eval))
        .replace("./runs/ppo", str(tmp_path / "ppo"))
        .replace("max_new_tokens=64", "max_new_tokens=4")
        .replace("num_episodes=10", "num_episodes=2")
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert (tmp_path / "ppo" / "checkpoints" / "final" / "actor" / "model.safetensors").exists()
    # 2 episodes x one optimizer step: 2 collect steps x 16 prompts = 2 minibatches of 16 = 1 accumulation group
    assert namespace["trainer"].state.step == 2


@pytest.mark.slow
def test_readme_grpo_example_runs(tmp_path, assets, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "GRPOTrainer(" in b)
    example = (
        example.replace("path/to/sft", str(assets.model_dir))
        .replace("prompts.jsonl", str(assets.prompts_eval))
        .replace("./runs/grpo", str(tmp_path / "grpo"))
        .replace("max_new_tokens=64", "max_new_tokens=4")
        .replace("num_episodes=10", "num_episodes=2")
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert (tmp_path / "grpo" / "checkpoints" / "final" / "actor" / "model.safetensors").exists()
    assert not (tmp_path / "grpo" / "checkpoints" / "final" / "critic").exists()
    # 2 episodes x 8 prompts x 8 responses = 64 rollouts per episode, minibatches of 32: 2 steps each
    assert namespace["trainer"].state.step == 4


@pytest.mark.slow
def test_readme_dpo_example_runs(tmp_path, assets, small_pref_file, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "DPOTrainer(" in b)
    example = (
        example.replace("path/to/sft", str(assets.model_dir))
        .replace("pairs.jsonl", str(small_pref_file))
        .replace("./runs/dpo", str(tmp_path / "dpo"))
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert (tmp_path / "dpo" / "checkpoints" / "final" / "model" / "model.safetensors").exists()
    assert len(list((tmp_path / "dpo" / "cache").glob("reference_logps-*.pt"))) == 1
    assert namespace["trainer"].state.step == 2  # 64 pairs, batch 8, accumulation 4
    assert namespace["trainer"].reference.released


@pytest.mark.slow
def test_readme_vllm_engine_example_runs(assets, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    example = next(b for b in blocks if "VLLMEngine(" in b).replace("path/to/model", str(assets.model_dir))
    exec(compile(example, "README.md", "exec"), {})
    assert "torch.Size([8," in capsys.readouterr().out  # 2 prompts x 4 samples
