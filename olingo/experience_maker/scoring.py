"""Scoring rollouts, shared by the PPO and group experience makers: the policy's logits and
log-probs of the response tokens, the critic's values, decoded text and its reward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from olingo.engines import Rollout
from olingo.errors import OlingoError
from olingo.models.head import chunkable_head, head_bypassed, output_head
from olingo.models.packing import lm_logits
from olingo.models.reward_model import RewardModel
from olingo.rewards.functions import CompositeReward
from olingo.rl.logprobs import CHUNK_ELEMENTS, HEAD_CHUNK_SHARE, entropy_from_logits, head_chunk_elements, head_token_stats, log_probs_from_logits, token_nll
from olingo.rl.masked import masked_sum


def policy_logits(
    model: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, temperature: float = 1.0, *, packing: bool = False,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits that predict the A response tokens: (B, A, V), divided by the sampling temperature.

    Position P+j-1 predicts response token j. Positions are counted over attended tokens, the
    way `generate` counts them on left-padded prompts, so these logits are the ones sampled from.
    Dividing by `temperature` makes log-probs those of the distribution actually sampled.
    packing: run the rows padding-free (`olingo.models.packing.lm_logits`, docs/packing.md);
    the logits of attended positions are the padded forward's up to float rounding.
    position_ids: (B, P + A) for rows of several segments (`Rollout.position_ids`; packing only).
    """
    logits = lm_logits(model, sequences, attention_mask, packing=packing, last=num_actions + 1, position_ids=position_ids)  # the prompt's logits are not needed
    logits = logits[:, -num_actions - 1 : -1]
    return logits / temperature if temperature != 1.0 else logits


def action_log_probs(
    model: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, temperature: float = 1.0, *, packing: bool = False,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """log pi(response token j | prefix): (B, A), as `policy_token_stats` computes it."""
    return policy_token_stats(model, sequences, attention_mask, num_actions, temperature, packing=packing, position_ids=position_ids, entropy=False)[0]


def policy_token_stats(
    model: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, temperature: float = 1.0, *, packing: bool = False,
    position_ids: torch.Tensor | None = None, entropy: bool = True, chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log pi(response token j | prefix), the policy's entropy there, detached): (B, A) each,
    at `temperature` (entropy None when not asked for).

    When the response logits would exceed `chunk_elements` (B x A x V) and the model's head can be
    taken apart (`chunked_head`), they never exist whole (`head_log_probs`). Otherwise
    `policy_logits` as they are. Both agree up to float rounding.
    """
    labels = sequences[:, -num_actions:]
    head = chunked_head(model, labels.numel(), chunk_elements)
    if head is None:
        logits = policy_logits(model, sequences, attention_mask, num_actions, temperature, packing=packing, position_ids=position_ids)
        return log_probs_from_logits(logits, labels), entropy_from_logits(logits.detach()) if entropy else None
    return head_log_probs(
        model, head, sequences, attention_mask, num_actions + 1, temperature, packing=packing, position_ids=position_ids, entropy=entropy,
        chunk_elements=chunk_elements,
    )


def chunked_head(model: nn.Module, tokens: int, chunk_elements: int | None = None) -> nn.Module | None:
    """The model's output head when the logits of `tokens` positions would exceed `chunk_elements`
    (None: `CHUNK_ELEMENTS`, 2^24) and the head can be taken apart (`olingo.models.head.chunkable_head`);
    None: whole logits."""
    head = output_head(model)
    if head is None or tokens * head.weight.shape[0] <= (chunk_elements or CHUNK_ELEMENTS):
        return None
    return chunkable_head(model)


def head_log_probs(
    model: nn.Module, head: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int, temperature: float = 1.0, *,
    packing: bool = False, position_ids: torch.Tensor | None = None, entropy: bool = False, chunk_elements: int | None = None,
    scored: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(token t+1 | tokens <= t) for the last `keep` positions' predictions, without the
    logits ever existing whole: (B, keep - 1) log-probs (and entropies, detached, with `entropy`).

    input_ids, attention_mask: (B, L); position t of the kept window predicts token t+1, so the
    labels are input_ids[:, L - keep + 1:]. The forward runs with `head` bypassed (its output is
    the head's input, `olingo.models.head`) and `head_token_stats` applies the head to the labels
    that count only: `scored` (B, keep - 1), default the attended labels; the others read 0 (no
    padding position costs a head's worth of vocabulary). A chunk of tokens at a time, in backward
    too: `chunk_elements / HEAD_CHUNK_SHARE / V` tokens (`chunk_elements`, the threshold: None for
    `CHUNK_ELEMENTS` and the device's chunk, `head_chunk_elements`); `position_ids`, `packing` as for `lm_logits`.
    """
    with head_bypassed(model):
        hidden = lm_logits(model, input_ids, attention_mask, packing=packing, last=keep, position_ids=position_ids)[:, :-1]
    labels = input_ids[:, input_ids.shape[1] - keep + 1 :]
    wanted = (attention_mask[:, attention_mask.shape[1] - keep + 1 :] if scored is None else scored).bool()
    per_chunk = chunk_elements // HEAD_CHUNK_SHARE if chunk_elements else head_chunk_elements(hidden.device, CHUNK_ELEMENTS)
    log_probs, entropies = head_token_stats(
        hidden[wanted], head.weight, head.bias, labels[wanted], temperature=temperature, chunk=max(1, per_chunk // head.weight.shape[0]), entropy=entropy,
    )
    return _spread(log_probs, wanted), _spread(entropies, wanted) if entropies is not None else None


def _spread(values: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """(N,) values of the True positions of `wanted` (B, T) back in place, 0 elsewhere (differentiable)."""
    return values.new_zeros(wanted.shape).index_put((wanted,), values)


def lm_nll(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, *, packing: bool = False,
    chunk_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token NLL over the tokens loss_mask[:, 1:] marks, and their count (float32, as
    `token_nll`): SFT's loss and PPO/GRPO's ptx term. The logits whole, or for a large vocabulary a
    chunk of tokens at a time (`chunked_head`, `head_log_probs`)."""
    head = chunked_head(model, input_ids.numel(), chunk_elements)
    if head is None:
        return token_nll(lm_logits(model, input_ids, attention_mask, packing=packing), input_ids, loss_mask)
    scored = loss_mask[:, 1:].bool()
    log_probs, _ = head_log_probs(model, head, input_ids, attention_mask, input_ids.shape[1], packing=packing, chunk_elements=chunk_elements, scored=scored)
    return masked_sum(-log_probs, scored), scored.sum().to(torch.float32)


def action_values(
    critic: nn.Module, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, *, packing: bool = False,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """V(state before response token j): (B, A), the critic at positions P-1 .. P+A-2 (packing: padding-free;
    position_ids: rows of several segments, see `policy_logits`)."""
    segments = {"position_ids": position_ids} if position_ids is not None else {}  # a user's critic keeps its own signature
    return critic(sequences, attention_mask, packing=packing, **segments)[:, -num_actions - 1 : -1]


@dataclass
class ScoredRollout:
    """A rollout with the quantities both training and evaluation need.

    log_probs, ref_log_probs: (B, A), or None where not computed (GRPO without a reference or
    without a need for pi_old); raw_score: (B,) (reward before any normalisation);
    prompts/responses: decoded text (responses without special tokens); gt_answers: B entries.
    """

    rollout: Rollout
    log_probs: torch.Tensor | None
    ref_log_probs: torch.Tensor | None
    raw_score: torch.Tensor
    prompts: list[str]
    responses: list[str]
    gt_answers: list[str | None]
    reward_terms: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    """Each reward term's unweighted (B,) values (reward functions, a neural term), when the
    reward is a `CompositeReward`; logged as `rollout/reward/<name>`."""
    engine_log_probs: torch.Tensor | None = None
    """(B, A): the log-probs a separate rollout engine reported (see `engine_logprobs`)."""
    engine_info: dict[str, float] = dataclasses.field(default_factory=dict)
    """The engine/trainer mismatch metrics of this rollout, logged as `rollout/engine_*`."""
    source_info: dict[str, float] = dataclasses.field(default_factory=dict)
    """What the rollout source measured (multi-turn episodes: turns, errors, tokens by role),
    logged as `rollout/<name>`."""
    turn_rewards: torch.Tensor | None = None
    """(B, A): the environment's step rewards at the turns they answered (`SampledBatch.turn_rewards`)."""
    teacher_log_probs: torch.Tensor | None = None
    """(B, A): log pi_teacher of the sampled tokens, with a distillation teacher (`model.teacher`)."""
    dropped: torch.Tensor | None = None
    """(B,) bool: rollouts the source marked failed (`SampledBatch.dropped`), or None."""

    def samples(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per rollout: prompt, response, gt_answer, reward, truncated."""
        return [
            {"prompt": p, "response": r, "gt_answer": g, "reward": float(s), "truncated": bool(t)}
            for p, r, g, s, t in zip(self.prompts, self.responses, self.gt_answers, self.raw_score.tolist(), self.rollout.truncated.tolist(), strict=True)
        ]



def decode_responses(tokenizer: Any, responses: torch.Tensor, action_mask: torch.Tensor) -> list[str]:
    """The text of each response (B, A) up to its end, without special tokens. One batch_decode
    when the pad token is special (what lies after an end is then dropped like the stop token);
    else row by row, each row cut at its mask."""
    mask = action_mask.bool()
    if tokenizer.pad_token_id in getattr(tokenizer, "all_special_ids", ()):
        return tokenizer.batch_decode(responses.masked_fill(~mask, tokenizer.pad_token_id), skip_special_tokens=True)
    return [tokenizer.decode(row[keep], skip_special_tokens=True) for row, keep in zip(responses, mask, strict=True)]


def response_span(rollout: Rollout) -> torch.Tensor:
    """(B, A) bool: the response tokens reward functions read, the sampled ones and, in a multi-turn
    episode, the environment's replies between them (attended, not actions). A single-turn
    response has no such holes, so its span is its action mask exactly."""
    action = rollout.action_mask.bool()
    columns = torch.arange(action.shape[-1], device=action.device)
    last = torch.where(action, columns, torch.full_like(columns, -1)).amax(dim=-1, keepdim=True)
    attended = rollout.attention_mask[:, -action.shape[-1]:].bool() if action.shape[-1] else action
    return action | (attended & (columns < last))


def score_rollout(
    reward: nn.Module | CompositeReward, tokenizer: Any, input_ids: torch.Tensor, rollout: Rollout,
    gt_answers: list[str | None] | None, row_fields: dict[str, list[Any]] | None,
    log_probs: torch.Tensor | None = None, ref_log_probs: torch.Tensor | None = None, *, packing: bool = False,
) -> ScoredRollout:
    """Decode the prompts (B, P) and responses of `rollout` and score them: reward functions
    (and a neural term) on text, or a reward model at the last attended token, which is the
    stop token, exactly where reward-model training reads. Scores land on the rollout's device.
    packing: an olingo `RewardModel` scores the rows padding-free (any other scorer as it is)."""
    seq, mask, num_actions = rollout.sequences, rollout.attention_mask, rollout.num_actions
    device = seq.device
    prompts = tokenizer.batch_decode(input_ids, skip_special_tokens=True)
    responses = decode_responses(tokenizer, seq[:, -num_actions:], response_span(rollout))
    gt_answers = list(gt_answers) if gt_answers is not None else [None] * seq.shape[0]
    terms: dict[str, torch.Tensor] = {}
    if isinstance(reward, CompositeReward):
        neural = reward.neural
        inputs = to_model_device(neural, seq, mask) if isinstance(neural, nn.Module) else (seq, mask)
        if isinstance(neural, RewardModel):  # RewardModel.forward(ids, mask, packing, position_ids)
            inputs = (*inputs, packing, _on(rollout.position_ids, inputs[0]))
        scores = reward.score(prompts, responses, gt_answers, row_fields, model_inputs=inputs)
        raw_score, terms = scores.total.to(device), scores.terms
    else:
        inputs = to_model_device(reward, seq, mask)
        segments = {"position_ids": _on(rollout.position_ids, inputs[0])} if rollout.position_ids is not None else {}
        packed = {"packing": packing, **segments} if isinstance(reward, RewardModel) else {}  # a user's scorer keeps its own signature
        raw_score = reward(*inputs, **packed).float().to(device)
    return ScoredRollout(rollout, log_probs, ref_log_probs, raw_score, prompts, responses, gt_answers, terms)


def add_source_reward(scored: ScoredRollout, sampled: Any) -> ScoredRollout:
    """The rollout source's own reward (an environment's step rewards, summed per episode) added
    to the reward functions' and logged as the term `environment`, with the source's metrics."""
    info = dict(getattr(sampled, "info", None) or {})
    env_rewards = getattr(sampled, "env_rewards", None)
    if env_rewards is None:
        return dataclasses.replace(scored, source_info=info)
    env_rewards = env_rewards.to(scored.raw_score.device, scored.raw_score.dtype)
    terms = {**scored.reward_terms, getattr(sampled, "reward_term", "environment"): env_rewards}
    turn_rewards, dropped = getattr(sampled, "turn_rewards", None), getattr(sampled, "dropped", None)
    return dataclasses.replace(
        scored, raw_score=scored.raw_score + env_rewards, reward_terms=terms, source_info=info, turn_rewards=turn_rewards, dropped=dropped,
    )


def select_rows(scored: ScoredRollout, rows: list[int]) -> ScoredRollout:
    """The scored rollout of `rows` alone, every per-row field indexed alike (dropping failed
    episodes); batch-level metrics are kept as they were measured."""
    index = torch.tensor(rows, dtype=torch.long, device=scored.raw_score.device)
    pick = lambda t: None if t is None else t.index_select(0, index.to(t.device))  # noqa: E731
    r = scored.rollout
    rollout = dataclasses.replace(
        r, sequences=pick(r.sequences), attention_mask=pick(r.attention_mask), action_mask=pick(r.action_mask), truncated=pick(r.truncated),
        log_probs=pick(r.log_probs), position_ids=pick(r.position_ids), finish_reasons=[r.finish_reasons[i] for i in rows] if r.finish_reasons else [],
    )
    return dataclasses.replace(
        scored, rollout=rollout, log_probs=pick(scored.log_probs), ref_log_probs=pick(scored.ref_log_probs), raw_score=pick(scored.raw_score),
        prompts=[scored.prompts[i] for i in rows], responses=[scored.responses[i] for i in rows], gt_answers=[scored.gt_answers[i] for i in rows],
        reward_terms={name: pick(v) for name, v in scored.reward_terms.items()}, engine_log_probs=pick(scored.engine_log_probs),
        turn_rewards=pick(scored.turn_rewards), teacher_log_probs=pick(scored.teacher_log_probs), dropped=pick(scored.dropped),
    )


def kept_rows(dropped: torch.Tensor, group_size: int, agree: Callable[[int, int], int]) -> list[int]:
    """The rows of the groups (`group_size` consecutive rows) holding no dropped row, the first
    `agree(kept groups, groups)` of them (the fewest any data-parallel rank keeps, so every rank
    takes the same optimizer steps). A `RolloutFailure` where no group is left."""
    clean = (~dropped.view(-1, group_size).any(-1)).nonzero().flatten().tolist()
    groups = dropped.numel() // group_size
    agreed = agree(len(clean), groups)
    if agreed == 0:
        raise RolloutFailure(
            f"every group of this batch holds a failed episode ({int(dropped.sum())} of {dropped.numel()} failed; see rollout/agent_* "
            "and the warnings above): nothing is left to train on"
        )
    return [g * group_size + j for g in clean[:agreed] for j in range(group_size)]


def fewest_over_ranks(kept: int, target: int, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None, device: torch.device) -> int:
    """The smallest `kept` (0..target) over the data-parallel ranks; `kept` itself in one process.

    From sums alone: entry k of the summed vector [1, kept >= 1, ..., kept >= target] counts the
    ranks holding at least k, and entry 0 counts the ranks; the minimum is the number of k at
    which every rank is counted."""
    if all_reduce_sum is None:
        return kept
    flags = torch.tensor([1.0] + [float(kept >= k) for k in range(1, target + 1)], device=device)
    counts = all_reduce_sum(flags)
    return int((counts[1:] == counts[0]).sum())


class RolloutFailure(OlingoError, RuntimeError):
    """A rollout that leaves nothing to train on."""


def to_model_device(model: nn.Module, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`tensors` moved to `model`'s device (inference models may sit elsewhere than the actor)."""
    device = next(model.parameters()).device
    return tuple(t.to(device) for t in tensors)


def _on(position_ids: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """`position_ids` on the device of `like` (the model's inputs), or None."""
    return None if position_ids is None else position_ids.to(like.device)
