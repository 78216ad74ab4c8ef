"""Argument checks shared by the LoRA shrink and expand launchers."""

from __future__ import annotations

import torch

from kernels._launch import INDEX_DTYPES, check_shape, check_tensor


def check_segments(op: str, seg_indptr: torch.Tensor, seg_lora_ids: torch.Tensor) -> int:
    """Returns the number of segments."""
    check_tensor(op, "seg_lora_ids", seg_lora_ids, ndim=1, dtypes=INDEX_DTYPES, contiguous=True)
    num_segments = seg_lora_ids.shape[0]
    check_tensor(op, "seg_indptr", seg_indptr, ndim=1, dtypes=INDEX_DTYPES, contiguous=True)
    check_shape(op, "seg_indptr", seg_indptr, [num_segments + 1])
    return num_segments


def check_token_ids(op: str, token_lora_ids: torch.Tensor, num_tokens: int) -> None:
    check_tensor(op, "token_lora_ids", token_lora_ids, ndim=1, dtypes=INDEX_DTYPES, contiguous=True)
    check_shape(op, "token_lora_ids", token_lora_ids, [num_tokens])


def max_segment_length(seg_indptr: torch.Tensor, given: int | None) -> int:
    if given is not None:
        return given
    return int((seg_indptr[1:] - seg_indptr[:-1]).max()) if seg_indptr.numel() > 1 else 0


def check_scaling(op: str, scaling: torch.Tensor, num_slots: int) -> None:
    check_tensor(op, "scaling", scaling, ndim=1, dtypes=(torch.float32,), contiguous=True)
    check_shape(op, "scaling", scaling, [num_slots])
