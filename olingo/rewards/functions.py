"""Reward functions: their two forms, row fields, validated values, the start-up probe and the
weighted sum of several (`CompositeReward`).

Two forms of reward function, both accepted:
    batched     fn(prompts, responses, gt_answers, **row_fields) -> B numbers (list, tuple,
                1-D tensor or array); each row field is a list of B values
    single-row  fn(prompt, response, gt_answer, **row_fields) -> one number; called once per
                row, each row field is that row's value
The rule that tells them apart, first match wins:
    1. an explicit attribute `fn.olingo_batched` (True or False); `@batched` sets it to True;
    2. the first parameter is named `prompts`: batched;
    3. anything else is single-row (also callables whose signature cannot be read).
`**kwargs` says nothing about the form: either form may take it.

Row fields are the fields of the prompt rows besides prompt/messages/gt_answer (see
`olingo.dataset.prompts`), e.g. `{"prompt": ..., "gt_answer": ..., "tests": [...]}` gives a
field `tests`. A function receives the fields it names as parameters after its first three, or
all of them when it takes `**kwargs`; others are not passed, so three-argument functions keep
working. A field named like one of its first three parameters is never passed (it would clash).
A row that lacks a field other rows have gives None for it. Treat the values as read-only.

`response` is the decoded response without special tokens (the stop token is not part of it);
whether it stopped at all is the experience maker's business (truncation penalty). Numbers are
anything `float()` takes except strings (bools count as 0/1). A function that raises, returns
NaN or inf, the wrong number of values or something that is not a number is a `RewardError`
naming the function and the row: never a silent zero.

One calling convention for every user function: a reward term in training, the same term on
held-out prompts, and evaluation's accuracy function (`loop.accuracy_function`) are all called
through `RewardFunction.values`, row fields included. The recipes `probe` each one at start-up,
before any model loads, on the first valid prompt row (see `olingo.recipes.rewards`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from olingo.rewards.registry import BATCHED_ATTR, RewardError, one_line, resolve_reward

RewardFn = Callable[[str, str, "str | None"], float]
BatchedRewardFn = Callable[..., Sequence[float]]


# ---- one function, its form and its validated values -----------------------------------------
@dataclass(frozen=True)
class RewardFunction:
    """A resolved reward function and how to call it.

    name: the spec it came from (or the callable's name); fn: the callable; batched: its form;
    fields: the row fields it takes by name (None: all, it has **kwargs); required: those of
    them without a default; positional: its first three parameters' names (never row fields).
    """

    name: str
    fn: Callable[..., Any]
    batched: bool
    fields: frozenset[str] | None
    required: frozenset[str]
    positional: frozenset[str]

    def values(
        self, prompts: Sequence[str], responses: Sequence[str], gt_answers: Sequence[str | None],
        row_fields: Mapping[str, Sequence[Any]] | None = None,
    ) -> torch.Tensor:
        """(B,) float64 validated values, unweighted; RewardError names the function and row."""
        fields = self._select(row_fields or {})
        if not prompts:
            return torch.zeros(0, dtype=torch.float64)
        if self.batched:
            return self._batched_values(prompts, responses, gt_answers, fields)
        values = []
        for i, (p, r, g) in enumerate(zip(prompts, responses, gt_answers, strict=True)):
            try:
                value = self.fn(p, r, g, **{k: v[i] for k, v in fields.items()})
            except Exception as err:
                raise RewardError(f"reward function '{self.name}' raised on row {i} (prompt {_shorten(p)}): {one_line(err)}") from err
            values.append(self._number(value, i, p))
        return torch.tensor(values, dtype=torch.float64)

    def _batched_values(
        self, prompts: Sequence[str], responses: Sequence[str], gt_answers: Sequence[str | None], fields: dict[str, Sequence[Any]]
    ) -> torch.Tensor:
        try:
            result = self.fn(list(prompts), list(responses), list(gt_answers), **{k: list(v) for k, v in fields.items()})
        except Exception as err:
            where = f"a batch of {len(prompts)} rows (first prompt {_shorten(prompts[0])})"  # the row is unknown
            raise RewardError(f"reward function '{self.name}' raised on {where}: {one_line(err)}") from err
        if getattr(result, "ndim", None) == 1 and hasattr(result, "tolist"):  # a tensor or an array
            result = result.tolist()
        if not isinstance(result, list | tuple):
            raise RewardError(f"reward function '{self.name}' returned {_describe(result)} for {len(prompts)} rows, "
                              f"expected a list of {len(prompts)} numbers, one per row (it is called batched)")
        if len(result) != len(prompts):
            raise RewardError(f"reward function '{self.name}' returned {len(result)} values for {len(prompts)} rows; "
                              "a batched reward function returns one number per row")
        return torch.tensor([self._number(v, i, prompts[i]) for i, v in enumerate(result)], dtype=torch.float64)

    def _number(self, value: Any, row: int, prompt: str) -> float:
        number = _as_float(value)
        if number is None:
            hint = "; a batched function names its first parameter 'prompts' or is marked @batched" if isinstance(value, list | tuple) else ""
            raise RewardError(f"reward function '{self.name}' returned {_describe(value)} for row {row} (prompt {_shorten(prompt)}), expected a number{hint}")
        if not math.isfinite(number):
            raise RewardError(f"reward function '{self.name}' returned {number} for row {row} (prompt {_shorten(prompt)}); rewards must be finite")
        return number

    def check_call(self, field_names: Sequence[str]) -> None:
        """RewardError unless `values` can call the function on rows with these extra fields:
        a row field it requires that the rows lack, or a parameter olingo never passes (a
        required positional-only one after the first three). Reads the signature only."""
        fields = self._select(dict.fromkeys(field_names, ()))
        try:
            signature = inspect.signature(self.fn)
        except (TypeError, ValueError):  # no readable signature: only a call can tell
            return
        try:
            signature.bind(*([[]] * 3 if self.batched else [""] * 3), **dict.fromkeys(fields))
        except TypeError as err:
            form = "(prompts, responses, gt_answers" if self.batched else "(prompt, response, gt_answer"
            given = f", {', '.join(f'{k}=...' for k in fields)})" if fields else ")"
            raise RewardError(f"reward function '{self.name}' cannot be called as olingo calls it, {form}{given} ({self._form()}): {err}") from err

    def _form(self) -> str:
        """How its form was decided, for messages."""
        if getattr(self.fn, BATCHED_ATTR, None) is not None:
            return f"batched={self.batched} from its {BATCHED_ATTR} attribute"
        if self.batched:
            return "batched: its first parameter is 'prompts'"
        return "single-row: its first parameter is not named 'prompts' and it is not marked @batched"

    def _select(self, row_fields: Mapping[str, Sequence[Any]]) -> dict[str, Sequence[Any]]:
        missing = self.required - row_fields.keys()
        if missing:
            have = ", ".join(sorted(row_fields)) or "none"
            raise RewardError(f"reward function '{self.name}' needs the row field(s) {', '.join(sorted(missing))}, "
                              f"which the prompt rows lack (their extra fields: {have})")
        return {k: v for k, v in row_fields.items() if k not in self.positional and (self.fields is None or k in self.fields)}


def reward_function(spec: str | Callable[..., Any] | RewardFunction, name: str | None = None) -> RewardFunction:
    """Resolve `spec` (a name, an import path or a callable) and read its form from its signature;
    a `RewardFunction` is returned as it is (renamed when `name` is given). Every caller of a user
    function (reward terms, evaluation's accuracy function) goes through the `values` of what this
    returns, so training and evaluation call it the same way."""
    if isinstance(spec, RewardFunction):
        return spec if name is None or name == spec.name else replace(spec, name=name)
    fn = resolve_reward(spec) if isinstance(spec, str) else spec
    if not callable(fn):
        raise RewardError(f"a reward function must be callable or a name, got {type(fn).__name__}")
    name = name or _default_name(spec)
    explicit = getattr(fn, BATCHED_ATTR, None)
    if explicit is not None and not isinstance(explicit, bool):
        raise RewardError(f"reward function '{name}': {BATCHED_ATTR} must be True or False, got {explicit!r}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # some builtins: no signature, so no row fields either
        return RewardFunction(name, fn, bool(explicit), frozenset(), frozenset(), frozenset())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) < 3 and not any(p.kind == p.VAR_POSITIONAL for p in params):
        raise RewardError(
            f"reward function '{name}' takes ({', '.join(p.name for p in params)}); a reward function takes "
            "(prompt, response, gt_answer) or, batched, (prompts, responses, gt_answers), then row fields"
        )
    first = positional[:3]
    named = [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p not in first]
    is_batched = explicit if explicit is not None else bool(positional) and positional[0].name == "prompts"
    return RewardFunction(
        name,
        fn,
        is_batched,
        None if any(p.kind == p.VAR_KEYWORD for p in params) else frozenset(p.name for p in named),
        frozenset(p.name for p in named if p.default is p.empty),
        frozenset(p.name for p in first),
    )


# ---- the start-up check -------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeRow:
    """One real prompt row to check functions on: where it is ('prompts.jsonl, row 1'), its
    prompt text, ground truth and extra fields (one value each, as the row holds them)."""

    where: str
    prompt: str
    gt_answer: str | None
    fields: dict[str, Any]


def probe(fn: RewardFunction, key: str, row: ProbeRow) -> None:
    """Call `fn` once through `values`, exactly as training and evaluation call it, on `row`
    with its gt_answer ('' without one) as the response, so that a function that cannot be
    called that way stops a run in its first seconds rather than at its first evaluation.
    A one-line RewardError names the function, what was wrong, the config `key` and the row."""
    response = "" if row.gt_answer is None else row.gt_answer
    try:
        fn.check_call(list(row.fields))
        fn.values([row.prompt], [response], [row.gt_answer], {k: [v] for k, v in row.fields.items()})
    except RewardError as err:
        given = "its gt_answer" if row.gt_answer is not None else "'' (the row has no gt_answer)"
        raise RewardError(f"{err}; found at start-up by calling {key} on {row.where}, with {given} as the response") from err


# ---- the weighted sum ---------------------------------------------------------------------
@dataclass
class RewardScores:
    """Scores of one batch of B rollouts (all on CPU).

    total: (B,) float32, sum_k weight_k * terms[k];
    terms: name -> (B,) float32 unweighted values of each term (a function's spec, or the
        neural term's name), in the order they were configured;
    weights: name -> the weight of that term.
    """

    total: torch.Tensor
    terms: dict[str, torch.Tensor] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)


NeuralScorer = Callable[..., torch.Tensor]


class CompositeReward:
    """Weighted sum of reward functions and, optionally, one neural term.

    Args:
        functions: `{spec: weight}` (the config's form) or `[(spec or callable, weight), ...]`.
            A weight of 0 still computes and reports the term (a metric you do not train on).
        neural: scores token sequences: a callable (an nn.Module, a function) is called, any
            other object has its `.score` called, with `model_inputs` of `score`, e.g.
            `(sequences, attention_mask)`; it returns (B,) scores.
        neural_weight: the neural term's weight.
        neural_name: the neural term's name in `RewardScores.terms`.
        allow_empty: no terms at all is allowed (every score 0): the reward of multi-turn
            episodes may come from their environment alone.
    """

    def __init__(
        self,
        functions: Mapping[str, float] | Sequence[tuple[str | Callable[..., Any], float]] = (),
        *,
        neural: NeuralScorer | Any | None = None,
        neural_weight: float = 1.0,
        neural_name: str = "model",
        allow_empty: bool = False,
    ) -> None:
        pairs = list(functions.items()) if isinstance(functions, Mapping) else list(functions)
        if not pairs and neural is None and not allow_empty:  # allowed where an environment rewards the episodes
            raise RewardError("no reward terms: give reward functions, a neural reward, or both")
        if neural is not None and not callable(neural) and not callable(getattr(neural, "score", None)):
            raise RewardError(f"the neural reward must be callable or have a score method, got {type(neural).__name__}")
        names = _unique([_default_name(spec) for spec, _ in pairs] + [neural_name])
        self.functions = [reward_function(spec, name) for (spec, _), name in zip(pairs, names[:-1], strict=True)]
        self.function_weights = [_weight(w, f.name) for (_, w), f in zip(pairs, self.functions, strict=True)]
        self.neural, self.neural_name = neural, names[-1]
        self.neural_weight = _weight(neural_weight, self.neural_name)

    @property
    def term_weights(self) -> dict[str, float]:
        """Term name -> weight, in scoring order."""
        terms = {f.name: w for f, w in zip(self.functions, self.function_weights, strict=True)}
        return terms | ({self.neural_name: self.neural_weight} if self.neural is not None else {})

    def score(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        gt_answers: Sequence[str | None],
        row_fields: Mapping[str, Sequence[Any]] | None = None,
        *,
        model_inputs: Sequence[Any] | None = None,
    ) -> RewardScores:
        """Score B rollouts: every term, validated, and their weighted sum (see `RewardScores`).

        row_fields: extra prompt-row fields, each a list of B values; model_inputs: the
        positional arguments of the neural term (needed when there is one).
        """
        n = len(prompts)
        _check_lengths(n, responses, gt_answers, row_fields or {})
        total = torch.zeros(n, dtype=torch.float64)  # float64 sum, as Python floats always did
        terms: dict[str, torch.Tensor] = {}
        for fn, weight in zip(self.functions, self.function_weights, strict=True):
            values = fn.values(prompts, responses, gt_answers, row_fields)
            total += weight * values
            terms[fn.name] = values.float()
        if self.neural is not None:
            values = self._neural_values(prompts, model_inputs)
            total += self.neural_weight * values
            terms[self.neural_name] = values.float()
        return RewardScores(total.float(), terms, self.term_weights)

    def _neural_values(self, prompts: Sequence[str], model_inputs: Sequence[Any] | None) -> torch.Tensor:
        if model_inputs is None:
            raise ValueError(f"the neural reward '{self.neural_name}' needs model_inputs, e.g. (sequences, attention_mask)")
        scorer = self.neural if callable(self.neural) else self.neural.score
        out = torch.as_tensor(scorer(*model_inputs)).detach()
        if out.shape != (len(prompts),):
            raise RewardError(f"neural reward '{self.neural_name}' returned shape {tuple(out.shape)} for {len(prompts)} rows, expected ({len(prompts)},)")
        out = out.to("cpu", torch.float64)
        bad = (~torch.isfinite(out)).nonzero()
        if len(bad):
            row = int(bad[0])
            raise RewardError(f"neural reward '{self.neural_name}' returned {out[row].item()} for row {row} "
                              f"(prompt {_shorten(prompts[row])}); rewards must be finite")
        return out

    # The trainer moves reward models around (offloading): follow the neural term, if any.
    def to(self, *args: Any, **kwargs: Any) -> CompositeReward:
        if hasattr(self.neural, "to"):
            self.neural.to(*args, **kwargs)
        return self

    def eval(self) -> CompositeReward:
        if hasattr(self.neural, "eval"):
            self.neural.eval()
        return self


# ---- helpers ---------------------------------------------------------------------------------
def _check_lengths(n: int, responses: Sequence[str], gt_answers: Sequence[str | None], row_fields: Mapping[str, Sequence[Any]]) -> None:
    """The caller's lists line up (a bug in the caller otherwise, hence ValueError)."""
    lengths = {"responses": len(responses), "gt_answers": len(gt_answers)} | {f"row field '{k}'": len(v) for k, v in row_fields.items()}
    wrong = [f"{what}: {length}" for what, length in lengths.items() if length != n]
    if wrong:
        raise ValueError(f"reward scoring got {n} prompts but {', '.join(wrong)}")


def _weight(value: float, name: str) -> float:
    if isinstance(value, bool) or _as_float(value) is None or not math.isfinite(float(value)):
        raise RewardError(f"the weight of reward '{name}' must be a finite number, got {value!r}")
    return float(value)


def _default_name(spec: str | Callable[..., Any]) -> str:
    """A term's name: its spec as configured, or the callable's name."""
    return spec if isinstance(spec, str) else getattr(spec, "__name__", type(spec).__name__)


def _unique(names: list[str]) -> list[str]:
    """Names as given; a repeated one gets '#2', '#3' (terms are keyed by name)."""
    seen: dict[str, int] = {}
    out: list[str] = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def _as_float(value: Any) -> float | None:
    """float(value) for numbers (bools, numpy scalars, one-element tensors), None otherwise."""
    if value is None or isinstance(value, str | bytes):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _shorten(text: str, width: int = 60) -> str:
    """repr of text, its middle cut out when long: prompts open with templates, end with the question."""
    if len(text) <= width:
        return repr(text)
    half = (width - 5) // 2
    return repr(text[:half] + " ... " + text[-half:])


def _describe(value: Any) -> str:
    """'str 'yes'', 'None', 'dict {...}': a returned value's type and a short repr."""
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
