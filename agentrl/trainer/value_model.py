"""``TurnValueModel``: a critic read from a causal LM's hidden state at given token
positions: at each turn boundary for a turn-level critic ``V(s_k)`` (ArCHer, Zhou et al.
2024, §4, high-level critic; RAGEN's turn-level value in its bi-level GAE), or at the token
before every sampled token for a token-level critic (``gae``, PPO as in verl).

It lives in ``agentrl.trainer`` rather than ``critics`` because it needs ``transformers``
for its backbone, and ``critics`` may import only types, torch and numpy (docs/design.md). The
pure parts (which token is a turn's boundary, turn-level GAE) are in
``critics.turn_critic`` and ``critics.gae``.

Turn boundary: the position of the last token *before* turn k's completion (the last
token of its prompt / observation segment), see ``critics.turn_boundaries``. A causal
backbone's hidden state there has read exactly the state ``s_k`` and none of the action.
Token level: the value of sampled token ``p`` is read at ``p - 1``
(``critics.token_value_positions``), the state in which ``p`` was sampled. The model does
not care which: it returns the head's value at whatever positions it is given.
"""

from __future__ import annotations

import torch

from agentrl.errors import ContractError


class TurnValueModel(torch.nn.Module):
    """Hugging Face base model (no LM head) + a scalar head ``Linear(hidden, 1)``.

    Head initialisation: ``head_init_std == 0`` (the default) zeroes weight and bias, so a
    fresh critic predicts ``V = 0`` for every state: the first advantages are then plain
    turn-level GAE with a zero baseline rather than noise from a random head, and the
    backbone starts receiving gradient once the head has moved (from the second optimizer
    step on). ``head_init_std > 0`` draws the weight from ``N(0, std^2)`` (bias 0), as
    OpenRLHF's value head does with ``std = 1 / (hidden + 1)``.

    Attributes:
        backbone: the HF base model (e.g. ``LlamaModel``), returning ``last_hidden_state``.
        head: ``Linear(hidden_size, 1)``.
    """

    def __init__(self, backbone: torch.nn.Module, *, head_init_std: float = 0.0) -> None:
        super().__init__()
        hidden = int(backbone.config.hidden_size)
        self.backbone = backbone
        self.head = torch.nn.Linear(hidden, 1, dtype=torch.float32)
        with torch.no_grad():
            if head_init_std > 0:
                self.head.weight.normal_(0.0, head_init_std)
            else:
                self.head.weight.zero_()
            self.head.bias.zero_()

    @property
    def config(self):  # noqa: ANN201 - the HF config of the backbone
        """The backbone's Hugging Face config."""
        return self.backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        boundary_index: torch.Tensor,
    ) -> torch.Tensor:
        """Values at the given token positions.

        Args:
            input_ids: ``[B, T]`` int64 token ids (right padding allowed).
            attention_mask: ``[B, T]`` 0/1, 0 on padding.
            position_ids: ``[B, T]`` int64 positions (restarting at 0 per row).
            boundary_index: ``[B, K]`` int64 token index in ``[0, T)`` of each value
                position: a turn's boundary (``critics.turn_boundaries``) or the token
                before a sampled token (``critics.token_value_positions``); pad unused
                slots with any valid index (e.g. 0) and ignore their outputs.

        Returns:
            ``[B, K]`` float32 values ``head(h[b, boundary_index[b, k]])``.

        Raises:
            ContractError: ``boundary_index`` has the wrong shape or an index outside
                ``[0, T)``.
        """
        bsz, seq_len = input_ids.shape
        if boundary_index.dim() != 2 or boundary_index.shape[0] != bsz:
            raise ContractError(
                f"boundary_index has shape {tuple(boundary_index.shape)}; expected [B={bsz}, K]"
            )
        if boundary_index.numel() and (int(boundary_index.min()) < 0 or int(boundary_index.max()) >= seq_len):
            raise ContractError(
                f"boundary_index holds {int(boundary_index.min())}..{int(boundary_index.max())}; "
                f"expected token indices in [0, {seq_len})"
            )
        hidden = self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, T, H)
        idx = boundary_index.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])  # (B, K, H)
        h = torch.gather(hidden, 1, idx)  # (B, K, H)
        # (a fresh tensor, not a view: FSDP2 hooks the root module's output for backward)
        return self.head(h).squeeze(-1).to(torch.float32, copy=True)  # (B, K)
