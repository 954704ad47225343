"""The embedded task: small-number arithmetic, a character tokenizer and a tiny Llama.

Everything is built offline and saved as ordinary Hugging Face directories and JSONL
files (`prepare_assets`), so the demo loads them with the same code as real models.
"""

from olingo.tasks.arithmetic import ArithmeticTask, Problem, extract_answer, is_correct
from olingo.tasks.assets import TaskAssets, prepare_assets
from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair
from olingo.tasks.tokenizer import CHAT_TEMPLATE, STOP_TOKEN, build_char_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "STOP_TOKEN",
    "ArithmeticTask",
    "Problem",
    "TaskAssets",
    "build_char_tokenizer",
    "build_tiny_llama",
    "extract_answer",
    "is_correct",
    "prepare_assets",
    "save_pretrained_pair",
]
