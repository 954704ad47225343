"""Rewards per token and advantage estimators: GAE for PPO, the group-relative advantages of
the GRPO family (GRPO, Dr. GRPO, RLOO), REINFORCE++, DAPO's overlong penalty and on-policy
distillation's per-token term.

Conventions: per-token RL tensors are (B, A), column j being response token j. `action_mask`
(B, A) is 1/True on real response tokens and 0 on the padding after the stop token (any
nonzero value counts as 1). Masked-out entries of every output are exactly 0, and a row whose
mask is all zero gives 0, never NaN. No function here detaches its inputs: callers that build
experience run them under `torch.no_grad()`.
"""

from __future__ import annotations

from typing import Literal

import torch

from olingo.rl.masked import AllReduceSum, masked_whiten

RewardPlacement = Literal["last", "every"]


def per_token_rewards(
    score: torch.Tensor,
    kl: torch.Tensor,
    action_mask: torch.Tensor,
    kl_coef: float,
    placement: RewardPlacement = "last",
) -> torch.Tensor:
    """Shaped reward r_t = -kl_coef * kl_t, plus the sequence score (Ziegler et al. 2019;
    InstructGPT, Ouyang et al. 2022, eq. 2).

    score: (B,) reward-model scores; kl, action_mask: (B, A). Returns (B, A) in kl's dtype.
    placement="last" adds the score at the last masked token of each row (InstructGPT, trlx:
    the score is a terminal reward); "every" adds it to every masked token (ColossalChat), which
    makes longer responses earn more of it. Masked-out entries and empty rows are 0.
    """
    mask = action_mask.bool()
    score = score.to(kl.dtype)
    rewards = torch.where(mask, -kl_coef * kl, torch.zeros_like(kl))
    if placement == "every":
        return rewards + torch.where(mask, score.unsqueeze(-1), torch.zeros_like(kl))
    if placement != "last":
        raise ValueError(f"unknown reward placement {placement!r}; choose 'last' or 'every'")
    # argmax of the flipped mask finds the last True; rows with none get their score zeroed.
    last = mask.shape[-1] - 1 - mask.flip(-1).long().argmax(dim=-1, keepdim=True)
    terminal = torch.where(mask.any(dim=-1), score, torch.zeros_like(score))
    return rewards.scatter_add(-1, last, terminal.unsqueeze(-1))


def place_turn_rewards(rewards: torch.Tensor, turn_rewards: torch.Tensor, action_mask: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Move an environment's step rewards from the episode's last token to the turns they answered.

    rewards: (B, A) from `per_token_rewards(placement="last")`, whose terminal score includes the
    episode's summed step rewards; turn_rewards: (B, A), each step reward at the last sampled
    token of the turn it answered (0 elsewhere); scale: the factor the score was normalised by
    (1 / running std, or 1). Returns rewards + scale * turn_rewards, less scale * their row sum
    at the last masked token: each row's total is unchanged, only where the environment's part
    lands moves, so GAE credits a turn's reward to that turn (docs/agents.md).
    """
    mask = action_mask.bool()
    moved = torch.where(mask, scale * turn_rewards.to(rewards.dtype), torch.zeros_like(rewards))
    last = mask.shape[-1] - 1 - mask.flip(-1).long().argmax(dim=-1, keepdim=True)
    return (rewards + moved).scatter_add(-1, last, -moved.sum(-1, keepdim=True))


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous
    Control Using GAE", eq. 16), and the returns used as value targets.

    rewards, values, action_mask: (B, A), the mask right-padded. Returns (advantages, returns),
    both (B, A): delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1},
    returns = A + V, where t+1 is the next column the mask marks: the recursion runs over the
    policy's tokens only (a multi-turn episode's environment tokens are skipped, not steps). V and
    A after the last masked token are 0: the episode ends there and nothing is bootstrapped from
    padding.
    """
    mask = action_mask.bool()
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    values = torch.where(mask, values, torch.zeros_like(values))
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        # An unmasked column (padding, or an environment's tokens between two turns of a
        # multi-turn episode) is not a step of the policy: the recursion passes over it, so the
        # last token of a turn bootstraps from the first token of the next turn.
        next_advantage = torch.where(mask[:, t], advantage, next_advantage)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        advantages.append(next_advantage)
    advantages = torch.stack(advantages[::-1], dim=-1)
    zeros = torch.zeros_like(advantages)
    return torch.where(mask, advantages, zeros), torch.where(mask, advantages + values, zeros)


# ---- the GRPO family: sequence advantages from groups of G responses to one prompt ----------
# Rows are grouped contiguously: rows g*G .. g*G+G-1 answer prompt g (`repeat_interleave`).


def _groups(scores: torch.Tensor, num_generations: int) -> torch.Tensor:
    """(B,) -> (B/G, G), refusing a batch that is not whole groups."""
    if num_generations < 1 or scores.dim() != 1 or scores.numel() % num_generations:
        raise ValueError(f"scores of shape {tuple(scores.shape)} are not whole groups of {num_generations}")
    return scores.view(-1, num_generations)


def group_centred(groups: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Each value less the mean of its group along `dim`: exactly 0 in a group of equal values.

    The float mean of G equal values can be an ulp off (8 x 1.2 in float32 is), and a std + eps
    denominator turns that ulp into an advantage of 0.1. The deviations from the group's first
    value are exact zeros in such a group, and so is their mean; otherwise this is r - mean(r) to
    rounding (shifted-data centring, Chan, Golub & LeVeque 1983). Any float dtype, any device.
    """
    shifted = groups - groups.narrow(dim, 0, 1)
    return shifted - shifted.mean(dim=dim, keepdim=True)


def group_mean(scores: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Each row's group mean reward, (B,) -> (B,): the first value plus the mean deviation from it,
    so a group of equal values gets exactly that value back (see `group_centred`)."""
    groups = _groups(scores, num_generations)
    first = groups[:, :1]
    return (first + (groups - first).mean(dim=-1, keepdim=True)).flatten().repeat_interleave(num_generations)


def grpo_advantages(scores: torch.Tensor, num_generations: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath, section 4.1.2): A_i = (r_i - mean(r)) / (std(r) + eps).

    scores: (B,) sequence rewards, B = groups x `num_generations` (G >= 2). Returns (B,). std is
    the unbiased one (n - 1), as in TRL and verl. A group whose rewards are all equal gets exactly
    0 (`group_centred`).
    """
    groups = _groups(scores, num_generations)
    if num_generations < 2:
        raise ValueError("grpo advantages need at least 2 responses per prompt (the std of one is undefined)")
    centred = group_centred(groups)
    return (centred / (centred.std(dim=-1, keepdim=True) + eps)).flatten()


def dr_grpo_advantages(scores: torch.Tensor, num_generations: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like Training", eq. 3): A_i = r_i - mean(r).

    No division by the group std, which up-weights groups that are nearly all right or all
    wrong. scores: (B,) -> (B,); exactly 0 for a group of equal rewards (`group_centred`).
    """
    return group_centred(_groups(scores, num_generations)).flatten()


def rloo_advantages(scores: torch.Tensor, num_generations: int) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics", eq. 6): A_i = r_i - mean of the other G-1
    rewards = G / (G - 1) * (r_i - mean(r)). scores: (B,) -> (B,); G >= 2."""
    if num_generations < 2:
        raise ValueError("rloo advantages need at least 2 responses per prompt (a leave-one-out baseline)")
    groups = _groups(scores, num_generations)
    # deviations from the first reward: the baseline is shift-invariant, and an equal group's are exact zeros
    shifted = groups - groups[:, :1]
    others = (shifted.sum(dim=-1, keepdim=True) - shifted) / (num_generations - 1)
    return (shifted - others).flatten()


def reward_to_go(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted returns G_t = sum_{s >= t} gamma^(s-t) r_s over each row's masked tokens.

    rewards, action_mask: (B, A). Returns (B, A), 0 on masked-out entries. With gamma = 1 this
    is a reverse cumulative sum (REINFORCE++, Hu 2025).
    """
    mask = action_mask.bool()
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    if gamma == 1.0:
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
    else:
        running = torch.zeros_like(rewards[:, 0])
        columns = []
        for t in reversed(range(rewards.shape[-1])):
            running = rewards[:, t] + gamma * running
            columns.append(running)
        returns = torch.stack(columns[::-1], dim=-1)
    return torch.where(mask, returns, torch.zeros_like(returns))


def reinforce_pp_advantages(
    rewards: torch.Tensor, scores: torch.Tensor, action_mask: torch.Tensor, num_generations: int | None = None,
    all_reduce_sum: AllReduceSum | None = None,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach"): the reward-to-go
    of the per-token rewards (KL penalty at every token, score at the last) with gamma 1,
    whitened over the whole global batch. With `num_generations` (the "baseline" variant) the group
    mean score is subtracted first: every token of a response sees its terminal score in the
    reward-to-go, so subtracting it there equals subtracting it from the score.

    rewards, action_mask: (B, A); scores: (B,) the sequence scores inside `rewards`. Returns
    (B, A). `all_reduce_sum` makes the whitening statistics those of every rank's batch. Without
    a KL term, a group of equal scores has returns exactly 0 after the baseline (`group_mean`); the
    whitening then shifts them by the batch's token mean, as it does every token (Hu 2025).
    """
    returns = reward_to_go(rewards, action_mask)
    if num_generations is not None:
        returns = returns - group_mean(scores, num_generations).to(returns.dtype).unsqueeze(-1)
    return masked_whiten(returns, action_mask, all_reduce_sum=all_reduce_sum)


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to the score.

    lengths: (B,) response lengths in tokens. With limit L = `max_length` and cache L_c:
    0 for |o| <= L - L_c; ((L - L_c) - |o|) / L_c inside the cache; -1 beyond L. Returns (B,)
    float32. `cache` 0 turns it off (all zeros).
    """
    lengths = lengths.float()
    if cache <= 0:
        return torch.zeros_like(lengths)
    if cache > max_length:
        raise ValueError(f"the overlong cache ({cache}) is longer than the length limit ({max_length})")
    soft = (max_length - cache - lengths) / cache
    return torch.where(lengths <= max_length - cache, torch.zeros_like(lengths), torch.where(lengths <= max_length, soft, -torch.ones_like(lengths)))


# ---- several reward terms: GDPO's decoupled normalisation -----------------------------------


def gdpo_group_sum(terms: torch.Tensor, weights: torch.Tensor, num_generations: int, eps: float = 1e-6) -> torch.Tensor:
    """GDPO's first two steps (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy
    Optimization for Multi-reward RL Optimization", arXiv 2601.05242): each reward term normalised
    within its group, then the weighted sum.

    terms: (B, K) unweighted values of K reward terms, B = groups x `num_generations`; weights: (K,).
    Returns (B,) sum_k w_k (r_k - mean_g(r_k)) / (std_g(r_k) + eps), std the unbiased one as in
    `grpo_advantages`. A term constant within a group adds 0 there, so an easy term cannot swamp
    a hard one's signal; every group's sum has mean 0.
    """
    if terms.dim() != 2 or weights.shape != (terms.shape[1],):
        raise ValueError(f"gdpo needs terms (B, K) and weights (K,), got {tuple(terms.shape)} and {tuple(weights.shape)}")
    if num_generations < 2:
        raise ValueError("gdpo needs at least 2 responses per prompt (the std of one is undefined)")
    _groups(terms[:, 0], num_generations)  # refuses a batch that is not whole groups
    grouped = terms.view(-1, num_generations, terms.shape[1])
    centred = group_centred(grouped, dim=1)  # a term equal within its group is exactly 0 there
    normalised = centred / (centred.std(dim=1, keepdim=True) + eps)
    return (normalised * weights.to(terms.dtype)).sum(-1).flatten()


def batch_normalize(
    x: torch.Tensor, eps: float = 1e-6, all_reduce_sum: AllReduceSum | None = None, *, centre: bool = True,
) -> torch.Tensor:
    """(x - mean) / (std + eps) over the whole batch, std the unbiased one: GDPO's last step, which
    keeps the advantage's scale from growing with the number of terms. x: (B,) -> (B,).
    `all_reduce_sum` makes the statistics those of every data-parallel rank's batch together.
    centre=False divides by the std only, for x whose batch mean is 0 by construction (GDPO's group
    sums): subtracting the float estimate of that 0 would move an all-equal group's exact 0 off it."""
    reduce = all_reduce_sum or (lambda t: t)
    count = reduce(torch.tensor(float(x.numel()), dtype=x.dtype, device=x.device))
    mean = reduce(x.sum()) / count.clamp(min=1)
    var = reduce(((x - mean) ** 2).sum()) / (count - 1).clamp(min=1)
    return (x - mean if centre else x) / (var.sqrt() + eps)


def gdpo_advantages(
    terms: torch.Tensor, weights: torch.Tensor, num_generations: int, eps: float = 1e-6, all_reduce_sum: AllReduceSum | None = None,
) -> torch.Tensor:
    """GDPO's sequence advantages: `batch_normalize(gdpo_group_sum(...))`. terms: (B, K); weights: (K,).
    Returns (B,). With one term this is GRPO's advantage normalised once more over the batch. Every
    group's sum has mean 0, so the batch's mean is 0 and is not subtracted (`centre=False`): a group
    whose terms are all equal keeps its exact 0."""
    return batch_normalize(gdpo_group_sum(terms, weights, num_generations, eps), eps, all_reduce_sum, centre=False)


# ---- on-policy distillation --------------------------------------------------------------------


def distill_advantages(
    advantages: torch.Tensor, old_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, action_mask: torch.Tensor, coef: float,
) -> torch.Tensor:
    """On-policy distillation: advantage_t + coef * (log pi_teacher(y_t) - log pi_old(y_t)).

    The student samples, a frozen teacher scores the same tokens, and the per-token negative
    reverse KL (its k1 estimate) becomes a per-token advantage, undiscounted and without a
    baseline (Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
    Self-Generated Mistakes", GKD with student data, lambda = 1; Thinking Machines 2025,
    "On-Policy Distillation"). A token the teacher finds likelier than the student is pushed up.
    advantages, old_log_probs, teacher_log_probs, action_mask: (B, A); both log-probs of the
    sampled tokens at the sampling temperature. Returns (B, A) in advantages' dtype; masked-out
    entries are left as they are (0 from every estimator). coef 0 returns `advantages` unchanged.
    """
    if coef == 0:
        return advantages
    term = coef * (teacher_log_probs.to(advantages.dtype) - old_log_probs.to(advantages.dtype))
    return advantages + torch.where(action_mask.bool(), term, torch.zeros_like(term))
