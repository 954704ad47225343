"""The maths of RL and preference optimisation: pure torch, no model, config or I/O.

    masked.py       masked sum/mean/var/whiten and explained variance over (B, A) tensors
    moments.py      RunningMoments, running reward statistics for normalisation
    logprobs.py     log-probabilities and entropy from logits; the causal-LM NLL (GPTLMLoss)
    kl.py           KL estimators k1/k2/k3; truncated importance weights of a rollout engine
    advantages.py   per-token rewards, GAE, the GRPO family's group advantages, REINFORCE++,
                    DAPO's overlong penalty
    policy_loss.py  the clipped surrogate (one implementation), loss aggregation, PolicyLoss,
                    ValueLoss and GroupPolicyLoss
    preference.py   Bradley-Terry reward-model losses and the DPO family (DPO, cDPO, IPO,
                    SimPO, ORPO, KTO)

Each function documents its tensor shapes and the paper it comes from.
"""
