"""Every EAGLE part in one place: the draft-head modules, their checkpoints and the drafter that
grows trees with them.

* :mod:`eagle.heads.eagle`: the EAGLE-1/2 head (``fc([embed; feature]) -> one decoder layer``) and
  its checkpoint format (``config.json`` + ``model.safetensors``);
* :mod:`eagle.heads.drafter`: :class:`EagleDrafter`, drafting static or dynamic trees level by level.
"""
from __future__ import annotations

from .eagle import (DraftHead, HeadConfig, HeadError, HeadMismatchError, HeadNotFoundError, check_head, load_head,
                    read_head_config, save_head)

__all__ = ["DraftHead", "HeadConfig", "load_head", "read_head_config", "check_head", "save_head", "HeadError",
           "HeadNotFoundError", "HeadMismatchError"]
