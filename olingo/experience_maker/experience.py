"""`Experience`: one batch of scored rollouts, everything the learn phase needs.

Layout (the one every engine returns, docs/engines.md):
`sequences = [left-padded prompt | response, right-padded]`, shape (B, P + A). Every per-token
tensor is (B, A) and its column j is response token j; `action_mask` covers the response up to and
including the stop token and nothing after. `values[:, j]` is the critic's value of the state
*before* response token j (the prefix it was sampled from), and
`action_log_probs[:, j]` the log-probability of token j under the rollout policy. Without a
critic, `values` and `returns` are None and no per-token tensor of theirs exists anywhere; the
same holds for `base_action_log_probs` and `kl` without a reference model (GRPO with
kl_coef 0), and for `action_log_probs` when the learner needs no pi_old (one update per batch:
the ratio is then 1 and its gradient is that of log pi).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from olingo.rl.masked import masked_sum

# Fields with one (A,) row per sequence; `values` and `returns` exist only with a critic,
# `base_action_log_probs` and `kl` only with a reference model, `engine_log_probs` only with
# truncated importance sampling on, `teacher_log_probs` only with on-policy distillation (a teacher model).
PER_TOKEN = ("action_log_probs", "base_action_log_probs", "values", "kl", "rewards", "advantages", "returns", "engine_log_probs", "teacher_log_probs")
CRITIC_FIELDS = ("values", "returns")


@dataclass
class Experience:
    """A batch of B rollouts with P prompt columns and A response columns.

    Attributes:
        sequences: (B, P+A) long. Prompt tokens (left-padded) then response tokens (pad after the end).
        attention_mask: (B, P+A) long. 1 on real prompt tokens and on `action_mask` positions.
        action_mask: (B, A) bool. Response tokens up to and including the stop token.
        action_log_probs: (B, A) float or None. log pi_old(token j): the policy that generated
            the batch; None when no learner step needs it (the ratio is then exactly 1).
        base_action_log_probs: (B, A) float or None. log pi_ref(token j): the frozen initial
            model; None without a reference model.
        kl: (B, A) float or None. Per-token KL estimate between the policy and the reference;
            None without a reference model.
        rewards: (B, A) float. Per-token reward: -kl_coef * kl (when in the reward), plus the
            score at the last token.
        advantages: (B, A) float. From the advantage estimator (GAE: whitened when asked).
        score: (B,) float. Sequence reward after normalisation/clipping/penalties, as trained on.
        raw_score: (B,) float. The reward model's (or reward functions') output before any of that.
        truncated: (B,) bool. The response hit max_new_tokens without a stop.
        policy_version: optimizer steps the actor had taken when it generated this batch.
        values: (B, A) float or None. V_old(state before token j) from the critic at rollout
            time; None without a critic.
        returns: (B, A) float or None. advantages (before whitening) + values: the critic's
            targets; None without a critic.
        engine_log_probs: (B, A) float or None. log pi_engine(token j) as the rollout engine
            reported it while sampling; carried only for truncated importance sampling
            (`tis_cap`), None otherwise.
        position_ids: (B, P+A) long or None. Only for rows of several segments (a multi-turn
            episode split where its chat template is not append-only, `Rollout.position_ids`):
            positions restart at 0 where a segment starts, and every forward over the batch
            passes them (packed, so segments do not see each other). None: positions count the
            attended tokens of each row.
        teacher_log_probs: (B, A) float or None. log pi_teacher(token j) at the sampling
            temperature, from the frozen teacher of on-policy distillation (`model.teacher`,
            docs/algorithms.md); None without a teacher.
        info: per-batch scalar diagnostics (mean reward, KL, response length, ...).
    """

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    action_log_probs: torch.Tensor | None
    base_action_log_probs: torch.Tensor | None
    kl: torch.Tensor | None
    rewards: torch.Tensor
    advantages: torch.Tensor
    score: torch.Tensor
    raw_score: torch.Tensor
    truncated: torch.Tensor
    policy_version: int = 0
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    engine_log_probs: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    teacher_log_probs: torch.Tensor | None = None
    info: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.values is None) != (self.returns is None):
            raise ValueError("values and returns come together (with a critic) or not at all")

    @property
    def per_token_fields(self) -> tuple[str, ...]:
        """The (B, A) fields this batch carries: `PER_TOKEN` less the critic's without a critic."""
        return tuple(name for name in PER_TOKEN if getattr(self, name) is not None)

    @property
    def batch_size(self) -> int:
        return self.sequences.shape[0]

    @property
    def num_actions(self) -> int:
        return self.action_mask.shape[1]

    @property
    def num_prompt_tokens(self) -> int:
        return self.sequences.shape[1] - self.action_mask.shape[1]

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}

    def to_device(self, device: torch.device | str) -> Experience:
        """A copy with every tensor on `device`."""
        return replace(self, **{name: t.to(device) for name, t in self.tensors().items()})

    def pin_memory(self) -> Experience:
        return replace(self, **{name: t.pin_memory() for name, t in self.tensors().items()})


@dataclass
class BufferItem:
    """One rollout of an `Experience`, stored without padding: P_i prompt and A_i response tokens.

    Attributes:
        prompt: (P_i,) long, the real prompt tokens.
        response: (A_i,) long, the response up to and including its last sampled token (the stop
            token of a single turn; in a multi-turn episode, environment tokens between turns too).
        per_token: each per-token field of the batch (`Experience.per_token_fields`) as an (A_i,) tensor.
        score, raw_score: () float. truncated: () bool. policy_version: int.
        action_mask: (A_i,) bool, the response tokens the policy sampled, when not all of them are
            (a multi-turn episode: environment tokens are False); None: every token was sampled.
        positions: (P_i + A_i,) long, the row's position ids when it holds several segments
            (`Experience.position_ids`); None: 0 .. P_i + A_i - 1.
    """

    prompt: torch.Tensor
    response: torch.Tensor
    per_token: dict[str, torch.Tensor]
    score: torch.Tensor
    raw_score: torch.Tensor
    truncated: torch.Tensor
    policy_version: int
    action_mask: torch.Tensor | None = None
    positions: torch.Tensor | None = None


def split_experience_batch(experience: Experience) -> list[BufferItem]:
    """The B rollouts of a batch as unpadded items (the inverse of `make_experience_batch`).

    Items are views into the batch's tensors (no copy). Lengths are read once for the whole
    batch: a left-padded prompt is the last p_i columns of the prompt block (checked; a mask with
    holes keeps exactly its attended tokens, by boolean indexing), a response the first a_i."""
    num_prompt = experience.num_prompt_tokens
    prompt_mask = experience.attention_mask[:, :num_prompt].bool()
    prompt_lengths = prompt_mask.sum(-1)
    suffix = torch.arange(num_prompt, device=prompt_mask.device) >= (num_prompt - prompt_lengths).unsqueeze(-1)
    contiguous = bool((suffix == prompt_mask).all())
    columns = torch.arange(1, experience.num_actions + 1, device=experience.action_mask.device)
    lengths = (experience.action_mask * columns).amax(-1).tolist()  # one past the last sampled token (0: none)
    fields = {name: getattr(experience, name).unbind(0) for name in experience.per_token_fields}
    rows = experience.sequences.unbind(0)
    positions = experience.position_ids
    items = []
    for i, (p, a) in enumerate(zip(prompt_lengths.tolist(), lengths, strict=True)):
        items.append(
            BufferItem(
                prompt=rows[i][num_prompt - p : num_prompt] if contiguous else rows[i][:num_prompt][prompt_mask[i]],
                response=rows[i][num_prompt : num_prompt + a],
                per_token={name: values[i][:a] for name, values in fields.items()},
                score=experience.score[i],
                raw_score=experience.raw_score[i],
                truncated=experience.truncated[i],
                policy_version=experience.policy_version,
                action_mask=None if bool(experience.action_mask[i, :a].all()) else experience.action_mask[i, :a],
                positions=None if positions is None else _row_positions(positions[i], prompt_mask[i], num_prompt, a),
            )
        )
    return items


def _row_positions(positions: torch.Tensor, prompt_mask: torch.Tensor, num_prompt: int, response_length: int) -> torch.Tensor:
    """One row's position ids over its attended prompt tokens and its first `response_length` response tokens."""
    return torch.cat([positions[:num_prompt][prompt_mask], positions[num_prompt : num_prompt + response_length]])


def make_experience_batch(items: list[BufferItem], pad_token_id: int = 0) -> Experience:
    """Pad items back into one `Experience`: prompts left-padded, responses right-padded.

    Padding is to the longest prompt and the longest response of these items only, so a
    minibatch never carries more columns than it needs. `policy_version` is the oldest
    item's (the most off-policy data in the batch); `info` is empty.
    """
    if not items:
        raise ValueError("make_experience_batch needs at least one item")
    num_prompt = max(item.prompt.numel() for item in items)
    num_actions = max(item.response.numel() for item in items)
    batch = len(items)
    sequences = torch.full((batch, num_prompt + num_actions), pad_token_id, dtype=items[0].prompt.dtype)
    attention_mask = torch.zeros((batch, num_prompt + num_actions), dtype=torch.long)
    action_mask = torch.zeros((batch, num_actions), dtype=torch.bool)
    names = list(items[0].per_token)
    if any(list(item.per_token) != names for item in items):
        raise ValueError(
            "make_experience_batch: items with different per-token fields (with and without critic values, reference or old log-probs) "
            "cannot share a batch"
        )
    per_token = {name: torch.zeros((batch, num_actions), dtype=items[0].per_token[name].dtype) for name in names}
    for i, item in enumerate(items):
        p, a = item.prompt.numel(), item.response.numel()
        sequences[i, num_prompt - p : num_prompt] = item.prompt
        sequences[i, num_prompt : num_prompt + a] = item.response
        attention_mask[i, num_prompt - p : num_prompt + a] = 1
        action_mask[i, :a] = True if item.action_mask is None else item.action_mask
        for name in names:
            per_token[name][i, :a] = item.per_token[name]
    per_token = {name: torch.where(action_mask, values, values.new_zeros(())) for name, values in per_token.items()}  # 0 off the actions
    return Experience(
        position_ids=_padded_positions(items, num_prompt, num_actions),
        sequences=sequences,
        attention_mask=attention_mask,
        action_mask=action_mask,
        score=torch.stack([item.score for item in items]),
        raw_score=torch.stack([item.raw_score for item in items]),
        truncated=torch.stack([item.truncated for item in items]),
        policy_version=min(item.policy_version for item in items),
        **{name: per_token.get(name) for name in PER_TOKEN},
    )


def _padded_positions(items: list[BufferItem], num_prompt: int, num_actions: int) -> torch.Tensor | None:
    """(B, P + A) position ids of items laid out as `make_experience_batch` lays them out, when
    any item holds segments (items without count 0, 1, ..; padding 0); else None."""
    if all(item.positions is None for item in items):
        return None
    out = torch.zeros((len(items), num_prompt + num_actions), dtype=torch.long)
    for i, item in enumerate(items):
        p, a = item.prompt.numel(), item.response.numel()
        out[i, num_prompt - p : num_prompt + a] = item.positions if item.positions is not None else torch.arange(p + a)
    return out


def experience_info(experience: Experience) -> dict[str, Any]:
    """Scalar rollout diagnostics of one batch (the `rollout/...` metrics)."""
    mask = experience.action_mask
    lengths = mask.float().sum(dim=-1)
    info = {
        "reward_mean": float(experience.raw_score.float().mean()),
        "reward_std": float(experience.raw_score.float().std(unbiased=False)),
        "score_mean": float(experience.score.float().mean()),
        "response_length": float(lengths.mean()),
        "truncated": float(experience.truncated.float().mean()),
    }
    if experience.kl is not None:  # without a reference model there is no KL to report
        info["kl"] = float(masked_sum(experience.kl, mask, dim=-1).mean())
    return info
