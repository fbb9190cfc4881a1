"""RL with verifiable rewards: GRPO and variants (grpo.py), rollouts, the trainer, and the
verifiers shared with eval (rewards.py, sandbox.py)."""
