"""Every EAGLE part in one place: the draft-head modules, their checkpoints and the drafter that
grows trees with them.

* :mod:`eagle.heads.common`: what the head kinds share (errors, :class:`HeadConfig`, the layer config);
* :mod:`eagle.heads.eagle`: the EAGLE-1/2 head (``fc([embed; feature]) -> one decoder layer``);
* :mod:`eagle.heads.eagle3`: the EAGLE-3 head (fused target layers, its own draft-vocabulary LM head);
* :mod:`eagle.heads.medusa`: Medusa-1 heads, their checkpoint and drafter;
* :mod:`eagle.heads.formats`: EAGLE head checkpoints (ours and the official / vLLM layouts): save,
  read, check, load, export;
* :mod:`eagle.heads.drafter`: :class:`EagleDrafter`, drafting static or dynamic trees level by level.
"""
from __future__ import annotations

from .common import HeadConfig, HeadError, HeadMismatchError, HeadNotFoundError
from .eagle import DraftHead
from .formats import check_head, load_head, read_head_config, save_head

__all__ = ["DraftHead", "HeadConfig", "load_head", "read_head_config", "check_head", "save_head", "HeadError",
           "HeadNotFoundError", "HeadMismatchError"]
