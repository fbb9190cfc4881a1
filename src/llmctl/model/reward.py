"""A reward model: the decoder with a scalar head on the final-norm hidden state of one token per
row (the last of the completion), as transformers' *ForSequenceClassification with num_labels = 1
(and TRL's RewardTrainer) build it: `score`, a bias-free d_model → 1 projection. The language-model
head stays (unused, so an LM checkpoint's weights load as they are); a checkpoint of this model
holds `score.weight` beside them."""

from __future__ import annotations

import torch
from torch import nn

from llmctl.model.config import ModelConfig
from llmctl.model.transformer import Transformer

SCORE = "score.weight"


class RewardModel(Transformer):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.score = nn.Linear(cfg.d_model, 1, bias=False)
        # the decoder's init std (transformers' initializer_range for a new classification head)
        nn.init.normal_(self.score.weight, 0.0, cfg.init_std)

    def forward(self, tokens: torch.Tensor, last: torch.Tensor | None = None, **kw) -> torch.Tensor:
        """Rewards (B,) read at index `last` of each row (B,), else at the row's final position.
        Training goes through forward so that DDP's and FSDP's hooks see every step."""
        h = self.hidden(tokens, mask=kw.get("mask"), positions=kw.get("positions"))
        if last is None:
            last = torch.full((tokens.shape[0],), tokens.shape[1] - 1, dtype=torch.long, device=tokens.device)
        return self.score(h[torch.arange(h.shape[0], device=h.device), last]).squeeze(-1).float()
