"""The ColossalChat loss names at their documented path (`coati.models.loss`), re-exported:
the losses themselves live in `olingo.rl` (policy_loss.py, preference.py, logprobs.py)."""

from olingo.rl.logprobs import GPTLMLoss
from olingo.rl.policy_loss import PolicyLoss, ValueLoss
from olingo.rl.preference import LogExpLoss, LogSigLoss

__all__ = ["GPTLMLoss", "LogExpLoss", "LogSigLoss", "PolicyLoss", "ValueLoss"]
