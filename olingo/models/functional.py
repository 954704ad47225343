"""Pure tensor maths for RLHF: masked statistics, log-probabilities, KL, rewards, GAE, the
group-relative advantages of the GRPO family, and loss aggregation.

Conventions: per-token RL tensors are (B, A), column j being response token j. `action_mask`
(B, A) is 1/True on real response tokens and 0 on the padding after the stop token (any
nonzero value counts as 1). Masked-out entries of every output are exactly 0, and a row whose
mask is all zero gives 0, never NaN. No function here detaches its inputs: callers that build
experience run them under `torch.no_grad()`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F

KLEstimator = Literal["k1", "k2", "k3"]
RewardPlacement = Literal["last", "every"]
LossAggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
AllReduceSum = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over data-parallel ranks


def _local(values: torch.Tensor) -> torch.Tensor:
    return values


def _as_bool(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.bool().expand_as(like)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over entries where `mask` is nonzero.

    x: any shape; mask: broadcastable to x. dim=None gives a scalar over all masked entries;
    dim=-1 gives one value per row. `torch.where` (not multiplication) so that inf or NaN in
    masked-out entries, e.g. log-probabilities of padding, neither leak into the value nor
    into the gradient.
    """
    kept = torch.where(_as_bool(mask, x), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over entries where `mask` is nonzero; 0 where there are none.

    Shapes as `masked_sum`: dim=None gives a scalar, dim=-1 gives (B,) for x of shape (B, A).
    """
    count = masked_sum(torch.ones_like(x), mask, dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = False) -> torch.Tensor:
    """Variance of `x` over all masked entries: a scalar (population variance by default).

    An empty mask gives 0, and so does one entry with unbiased=True (Bessel's n - 1 is
    clamped to at least 1; the centred sum is 0 there anyway).
    """
    mean = masked_mean(x, mask)
    centred_sq = masked_sum((x - mean) ** 2, mask)
    count = masked_sum(torch.ones_like(x), mask)
    denominator = count - 1 if unbiased else count
    return centred_sq / denominator.clamp(min=1)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8,
    all_reduce_sum: AllReduceSum | None = None,
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) with mean and population variance over masked entries.

    x, mask: same shape (usually (B, A) advantages). shift_mean=False adds the mean back, so
    only the scale is normalised (trlx does this for rewards). Masked-out entries are 0. The
    statistics are over the whole batch, not per row: whitening advantages per batch is the
    PPO convention (OpenAI baselines), and per row would erase the signal of one-token rows.
    `all_reduce_sum` (sums a tensor over data-parallel ranks) makes the statistics global:
    W ranks then whiten exactly as one process whitening their concatenated batches. The
    variance takes a second pass around the global mean, as in one process.
    """
    reduce = all_reduce_sum or _local
    count = reduce(masked_sum(torch.ones_like(x), mask)).clamp(min=1)
    mean = reduce(masked_sum(x, mask)) / count
    var = reduce(masked_sum((x - mean) ** 2, mask)) / count
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_as_bool(mask, x), whitened, torch.zeros_like(whitened))


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position, in float32.

    logits: (B, L, V), any float dtype; labels: (B, L) long, valid token ids. Returns (B, L)
    float32. log p(y) = logit_y - logsumexp(logits), a chunk of rows at a time (`CHUNK_ELEMENTS`):
    a float32 copy of a whole (B, L, V) bf16 tensor is the largest allocation of a PPO step.
    """
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1).float()
    normaliser = torch.cat([torch.logsumexp(rows.float(), dim=-1) for rows in _row_chunks(logits)])
    return picked - normaliser


def sequence_log_probs(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probability of each row's masked tokens, and how many there are.

    logits: (B, L, V) from a causal LM; input_ids, mask: (B, L). Position t predicts token t+1,
    so token t counts when mask[t] is nonzero, for t = 1..L-1. Returns (sums (B,), counts (B,)),
    both float32: log pi(y|x) of the DPO family (Rafailov et al. 2023) is `sums`, the
    length-normalised one (SimPO, IPO, ORPO) `sums / counts`.
    """
    token_logps = log_probs_from_logits(logits[:, :-1], input_ids[:, 1:])
    keep = mask[:, 1:]
    return masked_sum(token_logps, keep, dim=-1), keep.bool().sum(-1).to(torch.float32)


# Rows of (B, L, V) logits handled at once: as many as keep a float32 copy under this many
# elements (64 MiB), at least one. Small models go in one piece (no Python loop per row); a
# large vocabulary goes a row at a time, as before.
CHUNK_ELEMENTS = 1 << 24


def _row_chunks(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if logits.shape[0] == 0:
        return (logits,)
    return logits.split(max(1, CHUNK_ELEMENTS // max(1, logits[0].numel())))


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: H = -sum_v p_v log p_v, in float32.

    logits: (B, L, V); returns (B, L) float32, in chunks of rows to bound memory (`CHUNK_ELEMENTS`).
    Vocabulary entries with p = 0 (e.g. -inf logits) contribute 0 rather than 0 * -inf = NaN.
    """

    def rows_entropy(rows: torch.Tensor) -> torch.Tensor:
        log_p = F.log_softmax(rows.float(), dim=-1)
        p = log_p.exp()
        return -(p * torch.where(p > 0, log_p, torch.zeros_like(log_p))).sum(dim=-1)

    return torch.cat([rows_entropy(rows) for rows in _row_chunks(logits)])


def kl_estimate(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimator = "k1",
    action_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020,
    "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

    log_probs, ref_log_probs: (B, A) log-probabilities of the sampled tokens. Returns (B, A).
    With log r = logp_ref - logp: k1 = -log r (unbiased, can be negative); k2 = (log r)^2 / 2
    (biased, low variance); k3 = (r - 1) - log r (unbiased and always >= 0). With
    `action_mask` (B, A), masked-out entries are exactly 0: the log-ratio is selected away
    before exp, because padding can hold any log-probability, exp of it can overflow to inf,
    and inf * 0 is NaN. Without a mask, padded entries are whatever the inputs make them.
    """
    log_ratio = ref_log_probs - log_probs
    if action_mask is not None:
        log_ratio = torch.where(_as_bool(action_mask, log_ratio), log_ratio, torch.zeros_like(log_ratio))
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of 'k1', 'k2', 'k3'")


def truncated_is_weights(
    trainer_log_probs: torch.Tensor, engine_log_probs: torch.Tensor, cap: float, action_mask: torch.Tensor,
) -> torch.Tensor:
    """Truncated importance sampling weights for a rollout engine's mismatch (Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training"; REFERENCE.md D3).

    trainer_log_probs, engine_log_probs, action_mask: (B, A). The engine sampled token t with
    probability pi_engine(t), while the ratio of the policy loss divides by the trainer's
    pi_old(t) of the same weights; the two differ by kernels and precision, so the gradient
    is off-policy. w_t = min(pi_old(t) / pi_engine(t), cap), a constant (no gradient), multiplies
    each token's policy loss. Returns (B, A); 1 at masked positions (padding is multiplied by a
    zero mask anyway; 1 keeps inf/NaN out of it).
    """
    if cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {cap}")
    mask = _as_bool(action_mask, trainer_log_probs)
    log_ratio = torch.where(mask, trainer_log_probs.detach() - engine_log_probs, torch.zeros_like(trainer_log_probs))
    return log_ratio.exp().clamp(max=cap).detach()


def engine_mismatch(trainer_log_probs: torch.Tensor, engine_log_probs: torch.Tensor, action_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far a rollout engine's log-probs of the sampled tokens are from the trainer's.

    trainer_log_probs, engine_log_probs, action_mask: (B, A), the same tokens under the same
    weights. Returns scalars: `engine_logprob_abs_diff`, the mean |log pi_trainer - log
    pi_engine| over response tokens, its max `engine_logprob_max_diff`, and `engine_kl`, the k3
    estimate of KL(pi_engine || pi_trainer) per token from the engine's own samples (>= 0; 0
    when the two agree). Both are 0 for an exact engine; kernels and precision make them
    ~1e-6 in fp32 and ~1e-3 to 1e-2 in bf16.
    """
    mask = _as_bool(action_mask, trainer_log_probs)
    diff = torch.where(mask, trainer_log_probs - engine_log_probs, torch.zeros_like(trainer_log_probs))
    return {
        "engine_logprob_abs_diff": masked_mean(diff.abs(), mask),
        "engine_logprob_max_diff": diff.abs().max() if diff.numel() else diff.new_zeros(()),
        "engine_kl": masked_mean(kl_estimate(engine_log_probs, trainer_log_probs, "k3", mask), mask),
    }


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
    returns = A + V. Rewards and values are masked first, so V and A after the last real token
    are 0: the episode ends there and nothing is bootstrapped from padding.
    """
    mask = action_mask.bool()
    rewards = torch.where(mask, rewards, torch.zeros_like(rewards))
    values = torch.where(mask, values, torch.zeros_like(values))
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages = []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        next_value = values[:, t]
        advantages.append(next_advantage)
    advantages = torch.stack(advantages[::-1], dim=-1)
    zeros = torch.zeros_like(advantages)
    return torch.where(mask, advantages, zeros), torch.where(mask, advantages + values, zeros)


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """1 - Var(returns - values) / Var(returns) over masked entries: a detached scalar.

    values, returns, mask: (B, A). 1 is a perfect critic, 0 no better than a constant, < 0
    worse than one. When Var(returns) is 0 (or the mask is empty) the ratio is undefined and
    0 is returned: there is no evidence the critic explains anything.
    """
    values, returns = values.detach(), returns.detach()
    var_returns = masked_var(returns, mask)
    var_residual = masked_var(returns - values, mask)
    ratio = var_residual / var_returns.clamp(min=torch.finfo(var_returns.dtype).tiny)
    return torch.where(var_returns > 0, 1 - ratio, torch.zeros_like(ratio))



# ---- the GRPO family: sequence advantages from groups of G responses to one prompt ----------
# Rows are grouped contiguously: rows g*G .. g*G+G-1 answer prompt g (`repeat_interleave`).


def _groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B/G, G), refusing a batch that is not whole groups."""
    if group_size < 1 or scores.dim() != 1 or scores.numel() % group_size:
        raise ValueError(f"scores of shape {tuple(scores.shape)} are not whole groups of {group_size}")
    return scores.view(-1, group_size)


def group_mean(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each row's group mean reward, (B,) -> (B,)."""
    return _groups(scores, group_size).mean(dim=-1).repeat_interleave(group_size)


def grpo_advantages(scores: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath, section 4.1.2): A_i = (r_i - mean(r)) / (std(r) + eps).

    scores: (B,) sequence rewards, B = groups x `group_size` (G >= 2). Returns (B,). std is
    the unbiased one (n - 1), as in TRL and verl. A group whose rewards are all equal gets 0.
    """
    groups = _groups(scores, group_size)
    if group_size < 2:
        raise ValueError("grpo advantages need at least 2 responses per prompt (the std of one is undefined)")
    centred = groups - groups.mean(dim=-1, keepdim=True)
    return (centred / (groups.std(dim=-1, keepdim=True) + eps)).flatten()


def dr_grpo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like Training", eq. 3): A_i = r_i - mean(r).

    No division by the group std, which up-weights groups that are nearly all right or all
    wrong. scores: (B,) -> (B,).
    """
    groups = _groups(scores, group_size)
    return (groups - groups.mean(dim=-1, keepdim=True)).flatten()


def rloo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics", eq. 6): A_i = r_i - mean of the other G-1
    rewards = G / (G - 1) * (r_i - mean(r)). scores: (B,) -> (B,); G >= 2."""
    if group_size < 2:
        raise ValueError("rloo advantages need at least 2 responses per prompt (a leave-one-out baseline)")
    groups = _groups(scores, group_size)
    others = (groups.sum(dim=-1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).flatten()


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
    rewards: torch.Tensor, scores: torch.Tensor, action_mask: torch.Tensor, group_size: int | None = None,
    all_reduce_sum: AllReduceSum | None = None,
) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach"): the reward-to-go
    of the per-token rewards (KL penalty at every token, score at the last) with gamma 1,
    whitened over the whole global batch. With `group_size` (the "baseline" variant) the group
    mean score is subtracted first: every token of a response sees its terminal score in the
    reward-to-go, so subtracting it there equals subtracting it from the score.

    rewards, action_mask: (B, A); scores: (B,) the sequence scores inside `rewards`. Returns
    (B, A). `all_reduce_sum` makes the whitening statistics those of every rank's batch.
    """
    returns = reward_to_go(rewards, action_mask)
    if group_size is not None:
        returns = returns - group_mean(scores, group_size).to(returns.dtype).unsqueeze(-1)
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


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped policy-gradient loss with clip-higher and the optional dual clip.

    log_ratio, advantages: (B, A) (log pi - log pi_old, and the advantage of each token).
    loss_t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (PPO, Schulman et al. 2017 eq. 7;
    asymmetric bounds: DAPO's clip-higher, Yu et al. 2025 eq. 10). With `dual_clip` = c > 1 the
    loss of a token with A < 0 is also capped at -c A (Ye et al. 2020, "Mastering Complex
    Control in MOBA Games", eq. 5), so one very unlikely token cannot dominate. Returns
    (token loss, clipped) both (B, A); `clipped` marks tokens whose clipped term was taken.
    """
    ratio = log_ratio.exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    loss = torch.max(unclipped, clipped)
    took_clip = clipped > unclipped
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        capped = torch.min(loss, -dual_clip * advantages)
        loss = torch.where(advantages < 0, capped, loss)
    return loss, took_clip


def loss_units(action_mask: torch.Tensor, mode: LossAggregation) -> torch.Tensor:
    """What `aggregate_loss` divides by, counted in one micro-batch: response tokens for
    `token_mean`, responses (rows with at least one token) otherwise. A float32 scalar; the
    trainer sums it over every micro-batch and rank of the optimizer step."""
    mask = action_mask.bool()
    if mode == "token_mean":
        return mask.sum().to(torch.float32)
    return mask.any(dim=-1).sum().to(torch.float32)


def aggregate_loss(
    token_loss: torch.Tensor, action_mask: torch.Tensor, mode: LossAggregation, units: torch.Tensor | float, max_length: int | None = None,
) -> torch.Tensor:
    """One micro-batch's share of the optimizer step's loss. token_loss, action_mask: (B, A).

    token_mean (DAPO):               sum_{i,t} l_{i,t} / units, units = tokens of the whole step
    seq_mean_token_mean (GRPO):      sum_i mean_t l_{i,t} / units, units = responses of the step
    seq_mean_token_sum_norm (Dr. GRPO): sum_i (sum_t l_{i,t} / max_length) / units, with the
                                     constant `max_length` (the generation limit): no length bias
    `units` is `loss_units` summed over every micro-batch (and rank) of the step, so that the
    sum of these shares equals the loss of one big batch however it is split (REFERENCE.md D1).
    """
    mask = action_mask.bool()
    if mode == "token_mean":
        total = masked_sum(token_loss, mask)
    elif mode == "seq_mean_token_mean":
        total = masked_mean(token_loss, mask, dim=-1).sum()
    elif mode == "seq_mean_token_sum_norm":
        if not max_length:
            raise ValueError("seq_mean_token_sum_norm needs max_length (the constant response-length normaliser)")
        total = masked_sum(token_loss, mask, dim=-1).sum() / max_length
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose token_mean, seq_mean_token_mean or seq_mean_token_sum_norm")
    units = torch.as_tensor(units, dtype=total.dtype, device=total.device)
    return total / units.clamp(min=1)

class RunningMoments:
    """Running mean and population std of all scalars seen so far, merged batch by batch with
    the parallel algorithm of Chan, Golub and LeVeque (1979), in float64.

    Before any update mean is 0.0 and std 1.0, so normalising by them is a no-op. `std` is at
    least `eps`. State is plain python numbers (JSON-safe) and round-trips exactly.
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps
        self.mean = 0.0
        self.var = 1.0
        self.count = 0

    @property
    def std(self) -> float:
        return max(math.sqrt(self.var), self.eps)

    def update(self, x: torch.Tensor, all_reduce_sum: AllReduceSum | None = None) -> tuple[float, float]:
        """Fold in every element of `x` (any shape, non-empty); returns the batch's mean and
        population std. With `all_reduce_sum` the batch is every rank's `x` together, so the
        statistics stay identical on all ranks (and equal one process's on the whole batch)."""
        if x.numel() == 0:
            raise ValueError("RunningMoments.update needs at least one value")
        reduce = all_reduce_sum or _local
        x = x.detach().double().flatten()
        n = int(reduce(torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)).item())
        batch_mean = (reduce(x.sum()) / n).item()
        batch_var = (reduce(((x - batch_mean) ** 2).sum()) / n).item()
        total = self.count + n
        delta = batch_mean - self.mean
        # Chan et al.: M2 = M2_a + M2_b + delta^2 * n_a * n_b / n; the prior var has weight 0
        # while count is 0, so its initial 1.0 never leaks into the statistics.
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total
        return batch_mean, math.sqrt(batch_var)

    def state_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.mean = float(state["mean"])
        self.var = float(state["var"])
        self.count = int(state["count"])
