"""Masked statistics over per-token tensors: sums, means, variances, whitening.

Conventions: per-token RL tensors are (B, A), column j being response token j. `action_mask`
(B, A) is 1/True on real response tokens and 0 on the padding after the stop token (any
nonzero value counts as 1). Masked-out entries of every output are exactly 0, and a row whose
mask is all zero gives 0, never NaN. No function here detaches its inputs: callers that build
experience run them under `torch.no_grad()`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

AllReduceSum = Callable[[torch.Tensor], torch.Tensor]  # sums a tensor over data-parallel ranks


def local_sum(values: torch.Tensor) -> torch.Tensor:
    """The `AllReduceSum` of one process: the values as they are."""
    return values


def bool_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`mask` as booleans (any nonzero value is True), broadcast to the shape of `like`."""
    return mask.bool().expand_as(like)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `x` over entries where `mask` is nonzero.

    x: any shape; mask: broadcastable to x. dim=None gives a scalar over all masked entries;
    dim=-1 gives one value per row. `torch.where` (not multiplication) so that inf or NaN in
    masked-out entries, e.g. log-probabilities of padding, neither leak into the value nor
    into the gradient.
    """
    kept = torch.where(bool_mask(mask, x), x, torch.zeros((), dtype=x.dtype, device=x.device))
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
    reduce = all_reduce_sum or local_sum
    count = reduce(masked_sum(torch.ones_like(x), mask)).clamp(min=1)
    mean = reduce(masked_sum(x, mask)) / count
    var = reduce(masked_sum((x - mean) ** 2, mask)) / count
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(bool_mask(mask, x), whitened, torch.zeros_like(whitened))


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
