"""The Python examples of README.md and docs/*.md run as written (with local paths substituted),
and the README and docs link only to files that exist.

Each example is found by what it calls (`trainer = GRPOTrainer(config`, ...), wherever it lives:
the README's quick start holds the native GRPO and DPO trainers and the demo, the compatibility
page the ColossalChat-style GRPO and DPO, the per-stage pages of docs/ the rest. A
marker must match exactly one block, so an example copied into a second page is caught (one
copy is tested, the other would drift). The shell examples are run by tests/test_cli_examples.py.
"""

import re
from pathlib import Path

import pytest

from tests.conftest import read_jsonl

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
# What every relative link must resolve to; external links and in-page anchors are not files.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = ("http://", "https://", "mailto:", "#")


def python_blocks() -> list[tuple[str, str]]:
    """(page, code) for every ```python block of the README and docs/."""
    return [
        (str(page.relative_to(REPO)), block)
        for page in PAGES
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    ]


def example(marker: str) -> tuple[str, str]:
    """The one runnable example (it names `path/to/...` placeholders) that contains `marker`."""
    found = [(page, code) for page, code in python_blocks() if marker in code and "path/to/" in code]
    assert len(found) == 1, f"{marker!r}: expected one example in README.md and docs/, found {[p for p, _ in found]}"
    return found[0]


NATIVE_GRPO, NATIVE_DPO = "reward_funcs=[correct]", "trainer = DPOTrainer(config"  # olingo.GRPOTrainer, ...
COMPAT_GRPO, COMPAT_DPO = "trainer = GRPOTrainer(\n    actor_booster=", "trainer = DPOTrainer(\n    actor="  # olingo.trainer's


@pytest.mark.parametrize(
    "marker, page",
    [
        (NATIVE_GRPO, "README.md"),
        (NATIVE_DPO, "README.md"),
        (COMPAT_GRPO, "docs/coming-from-colossalchat.md"),
        (COMPAT_DPO, "docs/coming-from-colossalchat.md"),
        ("trainer = SFTTrainer(", "docs/sft.md"),
        ("trainer = RewardModelTrainer(", "docs/reward-models.md"),
        ("trainer = PPOTrainer(", "docs/ppo.md"),
        ("DetachedPPOTrainer.options(", "docs/ray.md"),
        ("with VLLMEngine(", "docs/engines.md"),
    ],
)
def test_each_example_is_shown_once_where_its_topic_is(marker, page):
    assert example(marker)[0] == page


def test_the_demo_page_shows_the_demo_from_python():
    blocks = [code for page, code in python_blocks() if page == "docs/demo.md" and "run_dpo_demo(" in code]
    assert len(blocks) == 1 and 'run_dpo_demo("runs/demo")' in blocks[0]


def test_relative_links_of_readme_and_docs_point_to_existing_files():
    """Every relative Markdown link (pages, folders, code) resolves from the page that holds it.
    Heading anchors are checked by tests/test_no_dangling_references.py."""
    missing = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not a link
        for target in LINK.findall(text):
            if not target.startswith(EXTERNAL) and not (page.parent / target.split("#", 1)[0]).exists():
                missing.append(f"{page.relative_to(REPO)}: {target}")
    assert not missing, "links to files that do not exist:\n" + "\n".join(missing)


def test_the_readme_links_every_docs_page_and_stays_a_front_page():
    """Every page of docs/ is reachable from the README, and the README stays short: the manual
    lives in docs/ (about 10-12 KB is the aim; 13 KB leaves room for a line or two)."""
    linked = {(README.parent / target.split("#", 1)[0]).resolve() for target in LINK.findall(README.read_text())}
    orphans = [page.name for page in PAGES[1:] if page.resolve() not in linked]
    assert not orphans, f"docs pages the README does not link: {orphans}"
    assert len(README.read_bytes()) <= 13_000


@pytest.mark.slow
def test_reward_model_example_runs(tmp_path, small_pref_file, monkeypatch):
    from olingo.recipes.common import resolve_path

    page, code = example("trainer = RewardModelTrainer(")
    code = (
        code.replace("path/to/model", resolve_path("builtin:tiny-llama"))
        .replace("pref_train.jsonl", str(small_pref_file))
        .replace("pref_eval.jsonl", str(small_pref_file))
        .replace("./runs/rm", str(tmp_path / "rm"))
    )
    monkeypatch.chdir(tmp_path)
    exec(compile(code, page, "exec"), {})
    assert (tmp_path / "rm" / "checkpoints" / "final" / "model" / "model.safetensors").exists()
    assert (tmp_path / "rm" / "eval" / "epoch_2.json").exists()


@pytest.mark.slow
def test_sft_example_runs(tmp_path, assets, monkeypatch):
    from olingo.recipes.common import resolve_path

    page, code = example("trainer = SFTTrainer(")
    code = (
        code.replace("path/to/model", resolve_path("builtin:tiny-llama"))
        .replace("chats.jsonl", str(assets.sft_eval))
        .replace("./runs/sft", str(tmp_path / "sft"))
    )
    monkeypatch.chdir(tmp_path)
    exec(compile(code, page, "exec"), {})
    assert (tmp_path / "sft" / "checkpoints" / "final" / "model" / "model.safetensors").exists()
    # 67 rows = 9 batches of 8 = one group of 8 and a short group of 1 (which still steps), x 2 epochs
    assert len((tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()) == 4


@pytest.mark.slow
def test_ppo_example_runs(tmp_path, assets, monkeypatch):
    from olingo.models import RewardModel

    rm_dir = tmp_path / "rm"
    RewardModel.from_pretrained(str(assets.model_dir), pad_token_id=0).save_pretrained(rm_dir)
    page, code = example("trainer = PPOTrainer(")
    code = (
        code.replace("path/to/sft", str(assets.model_dir))
        .replace("path/to/rm", str(rm_dir))
        .replace("prompts.jsonl", str(assets.prompts_eval))
        .replace("./runs/ppo", str(tmp_path / "ppo"))
        .replace("max_new_tokens=64", "max_new_tokens=4")
        .replace("num_episodes=10", "num_episodes=2")
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, page, "exec"), namespace)
    assert (tmp_path / "ppo" / "checkpoints" / "final" / "actor" / "model.safetensors").exists()
    # 2 episodes x one optimizer step: 2 collect steps x 16 prompts = 2 minibatches of 16 = 1 accumulation group
    assert namespace["trainer"].state.step == 2


@pytest.mark.slow
def test_grpo_example_runs(tmp_path, assets, monkeypatch):
    page, code = example(COMPAT_GRPO)
    code = (
        code.replace("path/to/sft", str(assets.model_dir))
        .replace("prompts.jsonl", str(assets.prompts_eval))
        .replace("./runs/grpo", str(tmp_path / "grpo"))
        .replace("max_new_tokens=64", "max_new_tokens=4")
        .replace("num_episodes=10", "num_episodes=2")
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, page, "exec"), namespace)
    assert (tmp_path / "grpo" / "checkpoints" / "final" / "actor" / "model.safetensors").exists()
    assert not (tmp_path / "grpo" / "checkpoints" / "final" / "critic").exists()
    # 2 episodes x 8 prompts x 8 responses = 64 rollouts per episode, minibatches of 32: 2 steps each
    assert namespace["trainer"].state.step == 4


@pytest.mark.slow
def test_dpo_example_runs(tmp_path, assets, small_pref_file, monkeypatch):
    page, code = example(COMPAT_DPO)
    code = (
        code.replace("path/to/sft", str(assets.model_dir))
        .replace("pairs.jsonl", str(small_pref_file))
        .replace("./runs/dpo", str(tmp_path / "dpo"))
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, page, "exec"), namespace)
    assert (tmp_path / "dpo" / "checkpoints" / "final" / "model" / "model.safetensors").exists()
    assert len(list((tmp_path / "dpo" / "cache").glob("reference_logps-*.pt"))) == 1
    assert namespace["trainer"].state.step == 2  # 64 pairs, batch 8, accumulation 4
    assert namespace["trainer"].reference.released


@pytest.mark.slow
def test_native_grpo_quick_start_runs(tmp_path, assets, monkeypatch):
    """The README's GRPO quick start on the tiny model, two episodes instead of ten."""
    page, code = example(NATIVE_GRPO)
    code = code.replace("path/to/sft", str(assets.model_dir)).replace('"episodes": 10', '"episodes": 2')
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, page, "exec"), namespace)
    run_dir = tmp_path / "runs" / "grpo-quickstart"
    assert (run_dir / "checkpoints" / "final" / "actor" / "model.safetensors").exists()
    # 2 episodes x 8 prompts x 8 responses = 64 rollouts per episode, minibatches of 16: 4 steps each
    assert namespace["result"]["steps"] == 8 and "eval/reward" in namespace["result"]["eval"]
    assert len((tmp_path / "runs" / "grpo-quickstart.data" / "train.jsonl").read_text().splitlines()) == 100


@pytest.mark.slow
def test_native_dpo_quick_start_runs(tmp_path, assets, small_pref_file, monkeypatch):
    page, code = example(NATIVE_DPO)
    code = code.replace("path/to/sft", str(assets.model_dir)).replace("pairs.jsonl", str(small_pref_file))
    monkeypatch.chdir(tmp_path)
    exec(compile(code, page, "exec"), {})
    run_dir = tmp_path / "runs" / "dpo-quickstart"
    assert (run_dir / "checkpoints" / "final" / "model" / "model.safetensors").exists()
    # 64 pairs, batch 8, accumulation 4: 2 optimizer steps
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["split"] == "train"] == [1, 2]


@pytest.mark.slow
def test_vllm_engine_example_runs(assets, capsys):
    page, code = example("with VLLMEngine(")
    exec(compile(code.replace("path/to/model", str(assets.model_dir)), page, "exec"), {})
    assert "torch.Size([8," in capsys.readouterr().out  # 2 prompts x 4 samples


@pytest.mark.slow
def test_demo_example_runs(tmp_path, monkeypatch, capsys):
    """docs/demo.md's call from Python, shortened to one epoch per stage (the full demo is
    tests/test_ppo.py's and tests/test_dpo_cli.py's)."""
    [code] = [code for page, code in python_blocks() if page == "docs/demo.md" and "run_dpo_demo(" in code]
    short = 'sft_overrides=["train.epochs=1", "logging.progress=false"], dpo_overrides=["train.epochs=1", "logging.progress=false"]'
    code = code.replace('run_dpo_demo("runs/demo")', f'run_dpo_demo("runs/demo", {short})')
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/demo.md", "exec"), namespace)
    assert "pairs with implicit reward chosen > rejected" in capsys.readouterr().out
    assert len(namespace["result"].sampled) == 2 and len(namespace["result"].greedy) == 2
    assert (tmp_path / "runs" / "demo" / "demo-dpo" / "checkpoints" / "final" / "model" / "model.safetensors").exists()


@pytest.mark.slow
def test_agent_quick_start_runs(tmp_path, assets, monkeypatch, capsys):
    """The README's agent quick start on the tiny model: two episodes of multi-turn GRPO, rewarded
    by the environment alone, with its episode metrics in the run's metrics."""
    import json

    from olingo.rollout.environment import ENVIRONMENTS

    page, code = example("register_environment(\"second-try\")")
    assert page == "README.md"
    rows = [{"prompt": f"{a}+{b}=", "gt_answer": str(a + b)} for a in range(10) for b in range(10)]
    code = code.replace("path/to/sft", str(assets.model_dir)).replace('"episodes": 10', '"episodes": 2')
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"rows": rows}
    try:
        exec(compile(code, page, "exec"), namespace)
    finally:
        ENVIRONMENTS.pop("second-try", None)  # registered in this process only
    lines = [json.loads(line) for line in (tmp_path / "runs" / "agent-quickstart" / "metrics.jsonl").read_text().splitlines()]
    turns = [row["rollout/turns_per_episode"] for row in lines if "rollout/turns_per_episode" in row]
    assert turns and all(1.0 <= t <= 2.0 for t in turns)
    assert "eval/reward" in capsys.readouterr().out  # the printed held-out metrics
