"""Readable messages for strict configs: unknown keys get a did-you-mean.

`did_you_mean` compares one word with its siblings (difflib). `unknown_key_hint` works on the
whole config tree: a typo of a sibling (`train.lerning_rate` -> `lr`), a known synonym from
other libraries (`gradient_accumulation_steps` -> `accumulation_steps`), or a key put in the
wrong section (`lr` at the top level -> `train.lr`; `train.kl_coef` in PPO -> `experience.kl_coef`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Optional

# A config's key tree: name -> its sub-tree for a section, None for a value.
KeyTree = dict[str, Optional["KeyTree"]]

# Names other trainers (transformers, TRL, OpenRLHF, nanoGPT) use for olingo's keys. A synonym
# only ever suggests a key that exists where it is looked for, so one table serves every stage
# (`beta` -> `kl_coef` fires in PPO, where RM's `train.beta` is no help).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "learning_rate": ("lr",),
    "lr_rate": ("lr",),
    "num_epochs": ("epochs",),
    "n_epochs": ("epochs",),
    "num_train_epochs": ("epochs",),
    "num_episodes": ("episodes",),
    "ppo_epochs": ("update_steps",),
    "num_iterations": ("update_steps",),  # TRL/DAPO's mu
    "mu": ("update_steps",),
    "num_generation": ("num_generations",),  # GRPOTrainer's keyword
    "group_size": ("num_generations",),
    "n_samples_per_prompt": ("num_generations",),  # OpenRLHF
    "epsilon": ("eps_low",),
    "epsilon_high": ("eps_high",),  # TRL
    "clip_ratio_high": ("eps_high",),  # verl
    "loss_type": ("aggregation",),  # TRL
    "loss_agg_mode": ("aggregation",),  # verl
    "advantage_estimator": ("advantage",),
    "batchsize": ("batch_size", "train_batch_size"),
    "per_device_train_batch_size": ("batch_size", "train_batch_size"),
    "micro_batch_size": ("batch_size", "train_batch_size"),
    "per_device_eval_batch_size": ("eval_batch_size",),
    "grad_accum": ("accumulation_steps",),
    "gradient_accumulation_steps": ("accumulation_steps",),
    "max_seq_len": ("max_length",),
    "max_seq_length": ("max_length",),
    "max_prompt_len": ("max_prompt_length",),
    "truncation_mode": ("overlong",),  # TRL's DPO/SFT
    "truncation": ("overlong",),
    "truncate": ("overlong",),
    "filter_overlong_prompts": ("overlong",),  # verl
    "beta": ("kl_coef",),
    "kl_beta": ("kl_coef",),
    "init_kl_coef": ("kl_coef",),
    "cliprange": ("eps_clip",),
    "cliprange_value": ("value_clip",),
    "response_length": ("max_new_tokens",),
    "grad_clip": ("max_grad_norm",),
    "warmup_steps": ("warmup_ratio",),
    "save_steps": ("save_interval",),
    "eval_steps": ("eval_interval",),
    "lora_r": ("r",),
    "lora_alpha": ("alpha",),
    "model_name_or_path": ("path", "actor"),
    "train": ("prompts",),
    "eval": ("eval_prompts",),
}
SIBLING_CUTOFF = 0.6  # difflib's default: catches typos of a key of the same section
MOVED_CUTOFF = 0.8  # stricter for keys of other sections: there are many more of them


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def similarity(word: str, name: str) -> float:
    """How well `word` names the key `name`: 1 for the key or a synonym, else the best difflib
    ratio against the key and against the synonyms that stand for it."""
    if word == name or name in SYNONYMS.get(word, ()):
        return 1.0
    spellings = [name, *(syn for syn, targets in SYNONYMS.items() if name in targets)]
    return max(difflib.SequenceMatcher(None, word, s).ratio() for s in spellings)


def key_paths(tree: KeyTree, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key of `tree` (sections and values) as a path from the root."""
    for name, sub in tree.items():
        yield (*prefix, name)
        if sub is not None:
            yield from key_paths(sub, (*prefix, name))


def _exists(tree: KeyTree, path: Iterable[str]) -> bool:
    node: KeyTree | None = tree
    for key in path:
        if node is None or key not in node:
            return False
        node = node[key]
    return True


@dataclass(frozen=True)
class KeyHint:
    """Where an unknown key probably belongs: `paths` from `at` (a sibling) or from the root."""

    paths: tuple[tuple[str, ...], ...]
    score: float
    from_root: bool


def sibling_hint(rest: tuple[str, ...], section: KeyTree) -> KeyHint | None:
    """The key of `section` that `rest[0]` misspells, with the rest of the path kept when it
    exists there (`trian.lr` -> `train.lr`)."""
    scored = [(similarity(rest[0], name), name) for name in section]
    score, name = max(scored, default=(0.0, ""))
    if score < SIBLING_CUTOFF:
        return None
    path = (name, *rest[1:]) if _exists(section, (name, *rest[1:])) else (name,)
    return KeyHint((path,), score, from_root=False)


def moved_hint(at: tuple[str, ...], rest: tuple[str, ...], root: KeyTree) -> KeyHint | None:
    """The keys elsewhere in the config named like the last part of the unknown path
    (`lr` -> `actor_optim.lr`, `critic_optim.lr`)."""
    unknown = (*at, *rest)
    scored = [(similarity(rest[-1], path[-1]), path) for path in key_paths(root) if path != unknown]
    best = max((score for score, _ in scored), default=0.0)
    if best < MOVED_CUTOFF:
        return None
    return KeyHint(tuple(path for score, path in scored if score == best)[:3], best, from_root=True)


def unknown_key_hint(at: tuple[str, ...], rest: tuple[str, ...], root: KeyTree) -> KeyHint | None:
    """The best guess for the unknown key `rest` found in section `at` of a config with key
    tree `root`: a sibling's typo or synonym, or the same name in another section when that
    matches better (a tie goes to the sibling)."""
    section: KeyTree = root
    for key in at:
        section = section.get(key) or {}
    near, far = sibling_hint(rest, section), moved_hint(at, rest, root)
    if near is not None and (far is None or near.score >= far.score):
        return near
    return far


def quote_paths(paths: Iterable[tuple[str, ...]]) -> str:
    """"'a.b'", "'a.b' or 'c.d'", "'a', 'b' or 'c'"."""
    quoted = [f"'{'.'.join(p)}'" for p in paths]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
