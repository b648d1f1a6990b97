"""Weight-only int8 drafting (``drafter.dtype: int8``): the head's linear layers and its draft LM
head hold int8 weights with one float scale per output row; everything else (norms, attention, the
activations between products) stays in the head's own precision.

Why: a draft level of a few rows is bound by reading the weights (a 135M target's head and its
8,192-row draft LM head are ~36 MB in float32), so a quarter of the bytes is most of a level's time
saved. Drafts only propose and the verifier checks every token against the target, so this moves
acceptance a little and never the output.

The product ``x @ (q * scale).T`` runs through the target backend's ``int8_linear`` (the reference
dequantizes; the CPU backend takes torch's weight-only int8 kernel).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..attention import sharing_copy

__all__ = ["quantize_rows", "int8_linear_reference", "Int8Linear", "int8_copy"]

Int8Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight (N, K)`` -> ``(q (N, K) int8, scale (N,) float32)``, symmetric per output row:
    ``weight ~= q * scale[:, None]`` with ``|q| <= 127`` (an all-zero row gets scale 1)."""
    w = weight.detach().float()
    amax = w.abs().amax(dim=1)  # (N,)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale


def int8_linear_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x (T, K) @ (q (N, K) * scale (N,)).T -> (T, N)`` in ``x``'s dtype, by dequantizing."""
    return torch.nn.functional.linear(x, q.to(x.dtype)) * scale.to(x.dtype)


class Int8Linear(nn.Module):
    """An ``nn.Linear`` with its weight quantized by :func:`quantize_rows`; the product is ``mm``
    (a backend's ``int8_linear``), the bias added in the input's dtype."""

    def __init__(self, linear: nn.Linear, mm: Int8Product = int8_linear_reference):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q, scale = quantize_rows(linear.weight)
        self.register_buffer("q", q)  # (N, K) int8
        self.register_buffer("scale", scale.to(linear.weight.device))  # (N,)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.mm = mm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.mm(x.reshape(-1, self.in_features), self.q, self.scale)  # (T, N)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


def int8_copy(head: nn.Module, mm: Int8Product = int8_linear_reference, skip: nn.Module | None = None) -> nn.Module:
    """A copy of ``head`` whose ``nn.Linear`` layers but ``skip`` are :class:`Int8Linear` (the rest
    shares the head's parameters and buffers; the head itself is not changed)."""
    return sharing_copy(head, lambda lin: Int8Linear(lin, mm), skip=skip)
