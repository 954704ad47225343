"""Load tokenizers and models from a local Hugging Face directory or a hub id."""

from __future__ import annotations

import glob
import os
import threading
from pathlib import Path

import torch
from jinja2 import TemplateError, TemplateSyntaxError
from safetensors.torch import load_file
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from olingo.dataset.chat_tokens import turn_stop_ids
from olingo.errors import ModelLoadError
from olingo.models.sources import resolve_model_path

LOAD_ERRORS = (OSError, ValueError, KeyError)  # what transformers raises for a path that does not load
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"unknown dtype '{name}'; choose one of {sorted(DTYPES)}")
    return DTYPES[name]


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (`name` or `org/name`)."""
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1 or os.sep != "/" and os.sep in path


def describe_path(path: str) -> str:
    """What is at `path`, for a message about why nothing loads from it."""
    target = Path(path).expanduser()
    if not target.exists():
        return "no such file or directory"
    if target.is_file():
        return f"a file of {target.stat().st_size} bytes, not a model directory"
    entries = sorted(entry.name for entry in target.iterdir())
    if not entries:
        return "an empty directory"
    shown = ", ".join(entries[:8]) + (f", ... ({len(entries)} entries)" if len(entries) > 8 else "")
    missing = "" if "config.json" in entries else "; no config.json, so not a Hugging Face model directory"
    return f"a directory holding {shown}{missing}"


def check_model_path(path: str, what: str = "model path") -> None:
    """Fail at once, naming the path, when a local `path` does not exist (a hub id is left to
    transformers: it may be in the local cache). `what` names it: a config key or a kind."""
    if _looks_local(path) and not Path(path).expanduser().exists():
        raise ModelLoadError(f"{what} '{path}' does not exist")


def explain_load_failure(path: str, err: Exception, what: str = "model") -> ModelLoadError:
    """The one-line error for a model or tokenizer that does not load: the path, what is
    there, and the library's own reason (its first line)."""
    reason = " ".join(str(err).split()) or type(err).__name__  # the library's words, on one line
    if len(reason) > 240:
        reason = reason[:240] + " ... (--debug shows all)"
    if Path(path).expanduser().exists():
        return ModelLoadError(f"could not load the {what} at '{path}' ({describe_path(path)}): {reason}")
    return ModelLoadError(f"could not load the {what} '{path}': no such local path, and as a hub id: {reason}")


# transformers' `from_pretrained` is not thread-safe: while it builds a model it swaps
# `PreTrainedModel.tie_weights` for a no-op on the class and puts back what it saved on the way
# out. Two threads loading at once can save each other's no-op and leave it there for good, and
# every later model in the process comes out with untied embeddings (a tied output head left on
# the meta device). olingo loads one model at a time per process; loading is disk-bound anyway.
ONE_MODEL_LOAD_AT_A_TIME = threading.Lock()


def load_tokenizer(path: str, padding_side: str | None = None, chat_template: str | None = None) -> PreTrainedTokenizerBase:
    """AutoTokenizer with a pad token guaranteed (eos is reused when the model has none), and
    `chat_template` (a template string or a file, `model.chat_template`) as its chat template
    when given (`set_chat_template`).

    A pad equal to eos is fine for the policy (every batch carries its attention mask); the
    reward-model recipe swaps it for a token no chat row holds (`use_scoring_pad_token`) so its
    export scores in transformers as in olingo. The chat template is checked where it is used
    (`olingo.dataset.chat_tokens.require_chat_template`), with a message saying what to set.
    """
    path = resolve_model_path(path)  # builtin: names, `~`, GGUF files: what a config accepts
    check_model_path(path, "tokenizer path")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except LOAD_ERRORS as err:
        raise explain_load_failure(path, err, "tokenizer") from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(
                f"the tokenizer at '{path}' has neither a pad nor an eos token: set pad_token or "
                "eos_token in its tokenizer_config.json, or set model.tokenizer to another tokenizer"
            )
        tokenizer.pad_token = tokenizer.eos_token
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    if chat_template is not None:
        set_chat_template(tokenizer, chat_template)
    return tokenizer


def stop_token_ids(tokenizer: PreTrainedTokenizerBase, model_dir: str, required: bool = True) -> list[int]:
    """The ids that end a response: the tokenizer's eos, the token its chat template ends an
    assistant turn with (`end_of_turn_token_ids`: Gemma's `<end_of_turn>`, Llama-3's
    `<|eot_id|>`, found by rendering a turn), then every other eos id the model's
    `generation_config.json` names (Qwen2.5's `<|endoftext|>` beside `<|im_end|>`). A model
    converted from GGUF or given a template by `model.chat_template` names only its eos there,
    so the template is what tells. Rollouts and their loss masks end at the same tokens, and
    `name_stop_tokens` writes them into exported models for `generate` and vLLM. `required`:
    finding none is an error (rollouts would never end); else it gives [] (SFT on plain text)."""
    ids = turn_stop_ids(tokenizer)
    try:
        named = GenerationConfig.from_pretrained(resolve_model_path(model_dir)).eos_token_id
    except (OSError, ValueError):  # no generation_config.json: the tokenizer's eos alone
        named = None
    for token in [named] if isinstance(named, int) else named or []:
        if token not in ids:
            ids.append(token)
    if not ids and required:
        raise ModelLoadError(
            f"neither the tokenizer nor {model_dir}/generation_config.json names an eos token, so no response "
            "would ever end: set eos_token in the tokenizer's tokenizer_config.json or eos_token_id in generation_config.json"
        )
    return ids


def name_stop_tokens(model: PreTrainedModel, stop_ids: list[int]) -> None:
    """Name `stop_ids` (`stop_token_ids`) as the eos ids of `model.generation_config`, which
    `save_pretrained` writes to generation_config.json: `generate` on an exported model then
    stops where olingo's rollouts stopped (rollouts pass their stop ids explicitly, so this
    changes no rollout)."""
    config = getattr(model, "generation_config", None)
    if config is not None and stop_ids:
        config.eos_token_id = list(stop_ids) if len(stop_ids) > 1 else stop_ids[0]


def set_chat_template(tokenizer: PreTrainedTokenizerBase, chat_template: str) -> None:
    """Give `tokenizer` the chat template `chat_template` (`model.chat_template`): a Jinja
    template string, or the path of a file holding one (e.g. a `chat_template.jinja`). It
    replaces the tokenizer's own, and `save_pretrained` writes it with every export."""
    if "{{" in chat_template or "{%" in chat_template:
        template, origin = chat_template, "model.chat_template"
    else:
        path = Path(chat_template).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"model.chat_template '{chat_template}' is neither a file nor a Jinja template (one holds '{{{{' or '{{%')")
        template, origin = path.read_text(), f"model.chat_template file '{chat_template}'"
    tokenizer.chat_template = template
    try:  # a template that does not parse fails here, in one line, not at the first data row
        tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    except TemplateSyntaxError as err:
        raise ModelLoadError(f"{origin} is not a valid Jinja template (line {err.lineno}): {err.message}") from None
    except (TemplateError, ValueError, TypeError, KeyError, IndexError):
        pass  # it parses but refuses this probe conversation: a data row it refuses is reported with its row


def load_causal_lm(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> PreTrainedModel:
    """Any `AutoModelForCausalLM` from a directory, hub id, GGUF file or `builtin:` name."""
    path = resolve_model_path(path)
    check_model_path(path)
    try:
        with ONE_MODEL_LOAD_AT_A_TIME:
            return AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code)
    except LOAD_ERRORS as err:
        raise explain_load_failure(path, err) from None


def load_backbone(path: str, dtype: str = "float32", trust_remote_code: bool = False) -> PreTrainedModel:
    """The transformer body without a head (`AutoModel`), e.g. for custom heads."""
    path = resolve_model_path(path)
    check_model_path(path)
    try:
        with ONE_MODEL_LOAD_AT_A_TIME:
            return AutoModel.from_pretrained(path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code)
    except LOAD_ERRORS as err:
        raise explain_load_failure(path, err) from None


def load_safetensors_into(model: torch.nn.Module, directory: str | Path) -> None:
    """Load every `*.safetensors` file of `directory` into `model` in place, strictly.

    Keys missing from the files are accepted only when they are tied to a loaded parameter
    (e.g. an output embedding sharing the input embedding's storage); anything else missing or
    unexpected is an error, so a checkpoint can never silently load nothing.
    """
    files = sorted(glob.glob(os.path.join(str(directory), "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(file))
    result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise KeyError(f"{directory}: keys not in the model: {result.unexpected_keys[:5]}")
    params = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    loaded_ptrs = {params[k].data_ptr() for k in state if k in params}
    untied = [k for k in result.missing_keys if k not in params or params[k].data_ptr() not in loaded_ptrs]
    if untied:
        raise KeyError(f"{directory}: model keys missing from the checkpoint: {untied[:5]}")
