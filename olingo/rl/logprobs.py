"""Log-probabilities and entropy from logits, and the causal-LM negative log-likelihood.

logits are (B, L, V) from a causal LM, in any float dtype; results are float32. Large
vocabularies are handled a chunk of rows at a time (`CHUNK_ELEMENTS`) to bound memory.
`head_token_stats` never holds the logits whole: from the hidden states before the output head it
computes log-probs and entropy a chunk of tokens at a time, in forward and in backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from olingo.rl.masked import masked_sum

# Rows of (B, L, V) logits handled at once: as many as keep a float32 copy under this many
# elements (64 MiB), at least one. Small models go in one piece (no Python loop per row); a
# large vocabulary goes a row at a time, as before.
CHUNK_ELEMENTS = 1 << 24


def _row_chunks(logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    if logits.shape[0] == 0:
        return (logits,)
    return logits.split(max(1, CHUNK_ELEMENTS // max(1, logits[0].numel())))


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


def head_token_stats(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, *, temperature: float = 1.0, chunk: int = 1024,
    entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(h W^T + b) / T at each label, and the entropy there, `chunk` tokens at a time.

    hidden: (N, H), the output head's input (after the final norm); weight: (V, H) and bias: (V,)
    or None, the head's; labels: (N,) long. Returns (log_probs (N,), entropy (N,)), float32, equal
    to `log_probs_from_logits` and `entropy_from_logits` of `F.linear(hidden, weight, bias) / T`
    up to float rounding. At most one chunk's (chunk, V) logits exist at once: each chunk runs under
    activation checkpointing, so backward recomputes its logits instead of keeping them (the
    approach of Liger-Kernel's fused linear cross-entropy, without its fused kernel). The entropy
    is a statistic: it carries no gradient (None when `entropy` is false).
    """
    pieces = [
        checkpoint(_chunk_stats, h, weight, bias, y, temperature, entropy, use_reentrant=False) if torch.is_grad_enabled()
        else _chunk_stats(h, weight, bias, y, temperature, entropy)
        for h, y in zip(hidden.split(chunk), labels.split(chunk), strict=True)
    ]
    log_probs = torch.cat([p[0] for p in pieces]) if pieces else hidden.new_zeros(0, dtype=torch.float32)
    if not entropy:
        return log_probs, None
    return log_probs, torch.cat([p[1] for p in pieces]) if pieces else torch.zeros_like(log_probs)


def _chunk_stats(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor, temperature: float, entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias)
    logits = (logits / temperature if temperature != 1.0 else logits).float()
    normaliser = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - normaliser
    if not entropy:
        return picked, picked.new_zeros(0)
    with torch.no_grad():
        log_p = logits - normaliser.unsqueeze(-1)
        p = log_p.exp()
        entropies = -(p * torch.where(p > 0, log_p, torch.zeros_like(log_p))).sum(dim=-1)
    return picked, entropies


def token_nll(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token negative log-likelihood over masked positions, and their count.

    logits: (B, L, V) from a causal LM; input_ids, loss_mask: (B, L). Position t predicts token
    t+1, so the loss covers tokens 1..L-1 whose mask is 1. Returning the sum and the count (not
    the mean) lets a trainer normalise by the tokens of a whole optimizer step, so accumulation
    and data parallelism give the same gradient as one big batch.

    Both are float32 whatever the logits' dtype: a bf16 count is wrong above 256 tokens
    (887 would read 888). The NLL is summed with a select, never a product with the mask.
    """
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].bool()
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), reduction="none")
    return masked_sum(nll.view(mask.shape), mask), mask.sum().to(torch.float32)


class GPTLMLoss(nn.Module):
    """Token-mean causal LM loss over masked positions (SFT and PPO's ptx term).

    logits: (B, L, V); input_ids, loss_mask: (B, L) (loss_mask defaults to all ones).
    """

    def forward(self, logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
        if loss_mask is None:
            loss_mask = torch.ones_like(input_ids)
        total, count = token_nll(logits, input_ids, loss_mask)
        return total / count.clamp(min=1)
