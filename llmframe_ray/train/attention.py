"""The reranker's attention with learned gates across the query / passage boundary
(train/reranker.py: mean_pool_classifier): eager attention whose additive biases come in as
extra query and key dimensions, registered with transformers under SEGMENT_GATED so that the
exported ONNX graph is plain MatMul / Softmax / MatMul."""

from __future__ import annotations


SEGMENT_GATED = "llmframe_segment_gated"


def segment_gated_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager attention whose additive biases come as extra query/key dimensions: `attention_mask`
    is (query_side [batch, heads, tokens, e], key_side [batch, 1, tokens, e]), and each score is
    scaling * q . k + query_side_i . key_side_j (mean_pool_classifier)."""
    import torch

    query_side, key_side = attention_mask
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    queries = torch.cat([query * scaling, query_side.to(query.dtype)], -1)
    keys = torch.cat([key, key_side.to(key.dtype).expand(-1, key.size(1), -1, -1)], -1)
    weights = torch.nn.functional.softmax(torch.matmul(queries, keys.transpose(2, 3)), dim=-1)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def register_segment_gated_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(SEGMENT_GATED, segment_gated_attention)
