"""`olingo eval`: models on prompts or environments, with pass@k, maj@k, bootstrap intervals and
paired comparisons (docs/eval.md). The estimators are pure functions in `olingo.eval.metrics`
(importing this package loads nothing else); the runner is `olingo.eval.runner.run_eval` and the
config `olingo.eval.config.EvalConfig`."""

from olingo.eval.metrics import Interval, bootstrap_interval, maj_at_k, majority_vote, paired_bootstrap, pass_at_k, verdict

__all__ = ["Interval", "bootstrap_interval", "maj_at_k", "majority_vote", "paired_bootstrap", "pass_at_k", "verdict"]
