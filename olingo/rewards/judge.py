"""A language model as the reward: `JudgeReward` asks a generative model to grade responses.

Two modes, both a batched reward function (`fn(prompts, responses, gt_answers) -> B values`):

    score   each response alone. The rubric template is filled with {prompt}, {response} and
            {gt_answer} and sent to the judge as one user turn; its reply must hold a score,
            read as the number after the last "score:" (any case), else the reply's last number.
            The reward is (score - min_score) / (max_score - min_score), in [0, 1].
    rank    the responses to one prompt together, judged relative to each other (RULER, OpenPipe
            ART 2025): consecutive rows with the same prompt and answer form a group (a GRPO
            group is G such rows, prompt-major). The template gets {prompt}, {gt_answer} and
            {responses}, the responses numbered "Response 1:" .. "Response G:"; the reply gives
            one line per response, "Response k: <score>" or "k: <score>".

Robust by construction: a reply without a readable score in [min_score, max_score] gives
`failure_score` and is counted (`parse_failures`), never an exception. Batched: the requests of
one call that are not cached go to the judge together, `batch_size` at a time. Cached: a request
seen before ((prompt, response, gt_answer) in score mode; the prompt, answer and the group's
responses in rank mode) is answered from the cache without calling the judge. `counters()`
reports calls, cache hits and parse failures; `judge_counters(reward)` their growth since it
was last asked, summed over the judges among a reward's terms (a metric per collect step).

The judge is any `chat(texts) -> replies` callable; `engine_chat` makes one from an olingo
`RolloutEngine` (greedy decoding), so a local model served by the hf or vllm engine judges.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from olingo.engines import GenerationSettings, RolloutEngine

Chat = Callable[[list[str]], list[str]]

SCORE_TEMPLATE = (
    "Grade the response to the task below from 0 to 10 for correctness and helpfulness.\n\n"
    "Task: {prompt}\n\nReference answer (may be empty): {gt_answer}\n\nResponse: {response}\n\n"
    "Reply with one line: Score: <0-10>"
)
RANK_TEMPLATE = (
    "Compare the responses to the task below and grade each from 0 to 10 relative to the others.\n\n"
    "Task: {prompt}\n\nReference answer (may be empty): {gt_answer}\n\n{responses}\n\n"
    "Reply with one line per response: Response <number>: <0-10>"
)
_NUMBER = r"[-+]?\d+(?:\.\d+)?"
_SCORE = re.compile(rf"score\s*[:=]?\s*\**\s*({_NUMBER})", re.IGNORECASE)
_RANKED = re.compile(rf"^\W*(?:response\s*)?(\d+)\s*[:.)\-]\s*\**\s*({_NUMBER})", re.IGNORECASE | re.MULTILINE)


def parse_score(reply: str, low: float, high: float) -> float | None:
    """The score a reply gives, in [low, high]: after its last "score:", else its last number;
    None where there is none or it is out of range."""
    found = _SCORE.findall(reply) or re.findall(_NUMBER, reply)
    if not found:
        return None
    value = float(found[-1])
    return value if low <= value <= high else None


def parse_ranking(reply: str, count: int, low: float, high: float) -> list[float | None]:
    """Per response 1..count, the score its "Response k: <score>" line gives (the last such line
    for k), or None where missing or out of range."""
    scores: list[float | None] = [None] * count
    for index, value in _RANKED.findall(reply):
        k, score = int(index), float(value)
        if 1 <= k <= count:
            scores[k - 1] = score if low <= score <= high else None
    return scores


@dataclass
class JudgeReward:
    """A generative judge as a batched reward function (see the module docstring)."""

    chat: Chat
    template: str | None = None
    """The rubric: a str.format template with {prompt}, {response}, {gt_answer} (score mode) or
    {prompt}, {responses}, {gt_answer} (rank mode); None: the built-in one of the mode."""
    mode: str = "score"
    min_score: float = 0.0
    max_score: float = 10.0
    failure_score: float = 0.0
    """The reward of a response whose grade cannot be read (in [0, 1])."""
    batch_size: int = 16
    olingo_batched: bool = True  # read by the reward-function machinery: one call per batch
    _cache: dict[tuple, float] = field(default_factory=dict, repr=False)
    _counters: dict[str, int] = field(default_factory=lambda: {"judge_calls": 0, "judge_cache_hits": 0, "judge_parse_failures": 0}, repr=False)
    _reported: dict[str, int] = field(default_factory=dict, repr=False)  # the counters when `counter_deltas` last ran

    def __post_init__(self) -> None:
        if self.mode not in ("score", "rank"):
            raise ValueError(f"judge mode must be 'score' or 'rank', got {self.mode!r}")
        if not self.max_score > self.min_score:
            raise ValueError(f"judge max_score ({self.max_score}) must be above min_score ({self.min_score})")
        if not 0.0 <= self.failure_score <= 1.0:
            raise ValueError(f"judge failure_score must be in [0, 1], got {self.failure_score}")
        if self.batch_size < 1:
            raise ValueError(f"judge batch_size must be >= 1, got {self.batch_size}")
        self.template = self.template or (SCORE_TEMPLATE if self.mode == "score" else RANK_TEMPLATE)
        check_template(self.template, self.mode)
        self.__name__ = f"judge_{self.mode}"

    def __call__(self, prompts: Sequence[str], responses: Sequence[str], gt_answers: Sequence[str | None]) -> list[float]:
        rows = list(zip(prompts, responses, [g or "" for g in gt_answers], strict=True))
        if self.mode == "score":
            return self._scores(rows)
        return [value for group in _groups(rows) for value in self._ranked(group)]

    def counters(self) -> dict[str, int]:
        """Judge calls made, requests answered from the cache, and replies with no readable grade."""
        return dict(self._counters)

    def counter_deltas(self) -> dict[str, int]:
        """How much each counter grew since this was last called (since the start, the first time)."""
        now = self.counters()
        deltas = {k: v - self._reported.get(k, 0) for k, v in now.items()}
        self._reported = now
        return deltas

    def _normalised(self, score: float | None) -> float:
        if score is None:
            self._counters["judge_parse_failures"] += 1
            return self.failure_score
        return (score - self.min_score) / (self.max_score - self.min_score)

    def _ask(self, texts: list[str]) -> list[str]:
        replies: list[str] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start : start + self.batch_size]
            answered = self.chat(chunk)
            if len(answered) != len(chunk):
                raise ValueError(f"the judge answered {len(answered)} of {len(chunk)} requests")
            replies += answered
            self._counters["judge_calls"] += 1
        return replies

    def _scores(self, rows: list[tuple[str, str, str]]) -> list[float]:
        """Score mode: one request per row not in the cache (duplicates asked once)."""
        missing = list(dict.fromkeys(row for row in rows if row not in self._cache))
        self._counters["judge_cache_hits"] += len(rows) - len(missing)
        texts = [self.template.format(prompt=p, response=r, gt_answer=g) for p, r, g in missing]
        for row, reply in zip(missing, self._ask(texts), strict=True):
            self._cache[row] = self._normalised(parse_score(reply, self.min_score, self.max_score))
        return [self._cache[row] for row in rows]

    def _ranked(self, group: list[tuple[str, str, str]]) -> list[float]:
        """Rank mode: one request for the group's responses together."""
        prompt, _, answer = group[0]
        key = (prompt, answer, tuple(r for _, r, _ in group))
        if key in self._cache:
            self._counters["judge_cache_hits"] += len(group)
            return list(self._cache[key])  # type: ignore[arg-type]
        listing = "\n\n".join(f"Response {k}: {r}" for k, (_, r, _) in enumerate(group, start=1))
        reply = self._ask([self.template.format(prompt=prompt, responses=listing, gt_answer=answer)])[0]
        values = [self._normalised(s) for s in parse_ranking(reply, len(group), self.min_score, self.max_score)]
        self._cache[key] = values  # type: ignore[assignment]
        return values


def judge_counters(reward: Any) -> dict[str, float]:
    """The judges' counter growth since last asked, summed over the judges among `reward`'s terms
    (a `CompositeReward`'s functions, or `reward` itself); {} when it has no judge. Keys:
    judge_calls, judge_cache_hits, judge_parse_failures (an experience maker's info, once per batch)."""
    fns = [getattr(f, "fn", None) for f in getattr(reward, "functions", ())] + [reward]
    total: dict[str, float] = {}
    for judge in (fn for fn in fns if isinstance(fn, JudgeReward)):
        for key, value in judge.counter_deltas().items():
            total[key] = total.get(key, 0.0) + value
    return total


def _groups(rows: list[tuple[str, str, str]]) -> list[list[tuple[str, str, str]]]:
    """Runs of consecutive rows with the same prompt and answer (a GRPO group, prompt-major)."""
    groups: list[list[tuple[str, str, str]]] = []
    for row in rows:
        if groups and (groups[-1][0][0], groups[-1][0][2]) == (row[0], row[2]):
            groups[-1].append(row)
        else:
            groups.append([row])
    return groups


def check_template(template: str, mode: str) -> None:
    """A template names exactly the fields of its mode; a one-line ValueError otherwise."""
    allowed = {"prompt", "response", "gt_answer"} if mode == "score" else {"prompt", "responses", "gt_answer"}
    needed = {"response"} if mode == "score" else {"responses"}
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as err:
        raise ValueError(f"judge template: {err}") from None
    if unknown := names - allowed:
        raise ValueError(f"judge template ({mode} mode) names {sorted(unknown)}; it may use {sorted(allowed)}")
    if not needed <= names:
        raise ValueError(f"judge template ({mode} mode) must contain {{{next(iter(needed))}}}")


def engine_chat(engine: RolloutEngine, tokenizer: Any, max_new_tokens: int = 64) -> Chat:
    """`chat` for a judge served by an olingo engine: each text one user turn, rendered by the
    judge tokenizer's chat template, answered greedily; replies decoded without special tokens."""
    settings = GenerationSettings(max_new_tokens=max_new_tokens, do_sample=False)

    def chat(texts: list[str]) -> list[str]:
        rows = [tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, return_dict=False) for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :], mask[i, width - len(row) :] = torch.tensor(row), 1
        rollout = engine.generate(ids, mask, settings, n=1)
        start = rollout.num_prompt_tokens
        return [
            tokenizer.decode(rollout.sequences[i, start:][rollout.action_mask[i]].tolist(), skip_special_tokens=True)
            for i in range(len(rows))
        ]

    return chat
