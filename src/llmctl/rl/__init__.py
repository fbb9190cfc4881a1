"""RL with verifiable rewards: GRPO and variants (grpo.py), its settings (config.py), rollouts and
their file (rollout.py), held-out accuracy and headroom (evaluate.py), the trainer, and the
verifiers shared with eval (rewards.py, sandbox.py)."""
