"""The float64 implementations of ``magicpig`` and ``vattention`` before their float32 algorithms (commit 96e67b3),
kept as the reference of the fast paths: every logit, cosine and sampling probability of a row block formed
densely in float64. Each takes the method's explicit draw and returns ``(output, info)`` (output in float64);
``tests/test_sampling_fast_paths.py`` checks the methods against them on the same draws."""

from __future__ import annotations

import torch

from approxlab import lsh
from approxlab.cache._policy import prompt_length_of
from approxlab.methods._selection import logit_blocks
from approxlab.methods._weighted_keys import fixed_keys, row_weights, weighted_output
from approxlab.methods.magicpig import centring_keys, collision_counts, sampling_probability, sorted_buckets
from approxlab.methods.vattention import sample_size


def magicpig_reference(q, k, v, draw, *, bits=8, min_collisions=None, sink=0, window=0, center=True,
                       key_mask=None, causal=False, prompt_length=None):
    hyperplanes = draw["hyperplanes"].double()
    num_features = hyperplanes.shape[-3]
    min_collisions = min(2, num_features) if min_collisions is None else min_collisions
    prompt = prompt_length_of(prompt_length, k.shape[-2]) if causal else None
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = q.double(), k.double(), v.double()
    k, v = k.expand(*batch, *k.shape[-2:]), v.expand(*batch, *v.shape[-2:])
    if center:
        middle = centring_keys(k.shape[-2], sink=sink, window=window, prompt_length=prompt, key_mask=key_mask,
                               device=k.device).expand(k.shape[:-1])
        counts = middle.sum(-1, keepdim=True).clamp(min=1).unsqueeze(-1)
        hashed = k - (k * middle.unsqueeze(-1)).sum(-2, keepdim=True) / counts
    else:
        hashed = k
    codes_q = lsh.hash_codes(q.expand(*batch, *q.shape[-2:]), hyperplanes)
    codes_k = lsh.hash_codes(hashed, hyperplanes)
    buckets = sorted_buckets(codes_k)
    key_norms = hashed.norm(dim=-1)
    blocks, fixed_counts, sampled_counts = [], [], []
    for start, stop, logits in logit_blocks(q, k, causal=bool(causal), key_mask=key_mask):
        fixed = fixed_keys(logits, start, heavy=0, sink=sink, window=window)
        if prompt is not None:
            prefill = torch.arange(start, stop, device=logits.device).unsqueeze(-1) < prompt
            fixed = fixed | (prefill & torch.isfinite(logits))
        collisions = collision_counts(codes_q[..., start:stop], codes_k, buckets)
        rows = q[..., start:stop, :].expand(*batch, stop - start, q.shape[-1])
        cosine = (rows @ hashed.transpose(-1, -2)) / (rows.norm(dim=-1, keepdim=True) * key_norms.unsqueeze(-2)
                                                      ).clamp(min=torch.finfo(torch.float64).tiny)
        probability = sampling_probability(cosine, bits=bits, tables=num_features, min_collisions=min_collisions)
        sampled = (collisions >= min_collisions) & torch.isfinite(logits) & ~fixed & (probability > 0)
        weighted = torch.where(fixed, logits, torch.where(sampled, logits - torch.log(probability.clamp(
            min=torch.finfo(torch.float64).tiny)), torch.full_like(logits, float("-inf"))))
        peak = weighted.amax(-1, keepdim=True)
        peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
        blocks.append(weighted_output(torch.exp(weighted - peak), v))
        fixed_counts.append(fixed.sum(-1))
        sampled_counts.append(sampled.sum(-1))
    output = torch.cat([block[0] for block in blocks], dim=-2)
    return output, {"fixed": torch.cat(fixed_counts, dim=-1), "sampled": torch.cat(sampled_counts, dim=-1)}


def vattention_reference(q, k, v, draw, *, num_features, epsilon=0.3, delta=0.1, sink=0, window=0, key_mask=None,
                         causal=False):
    q, k, v = q.double(), k.double(), v.double()
    v = v.expand(*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2]), *v.shape[-2:])
    unit = v / v.abs().amax((-2, -1), keepdim=True).clamp(min=torch.finfo(torch.float64).tiny)
    blocks, stats = [], []
    for start, stop, logits in logit_blocks(q, k, causal=bool(causal), key_mask=key_mask):
        fixed = fixed_keys(logits, start, heavy=num_features, sink=sink, window=window)
        tail = torch.isfinite(logits) & ~fixed
        weights = row_weights(logits)
        tail_weights = weights * tail
        denominator = weights.sum(-1)
        safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
        output = (weights @ unit) / safe.unsqueeze(-1)
        size = tail.sum(-1)
        squared = tail_weights * tail_weights
        spread = (squared @ (unit * unit).sum(-1, keepdim=True)).squeeze(-1) \
            - 2 * ((squared @ unit) * output).sum(-1) + squared.sum(-1) * (output * output).sum(-1)
        mean = tail_weights @ unit - tail_weights.sum(-1, keepdim=True) * output
        trace = (size * spread - (mean * mean).sum(-1)).clamp(min=0.0)
        required = sample_size(trace, safe, output.norm(dim=-1), epsilon=epsilon, delta=delta)
        needed = torch.nan_to_num(required, nan=float("inf")).clamp(min=1)
        exact_tail = needed >= size
        samples = torch.where(exact_tail, torch.zeros_like(size), needed.nan_to_num(posinf=0).long())
        coefficients = weights * (fixed | (tail & exact_tail.unsqueeze(-1)))
        width = int(samples.max()) if samples.numel() else 0
        if width:
            uniform = draw["uniform"][..., start:stop, :width].double().expand(*samples.shape, width)
            rank = (uniform * size.unsqueeze(-1)).long().clamp(max=logits.shape[-1] - 1)
            order = torch.argsort((~tail).to(torch.int8), dim=-1, stable=True)
            drawn = torch.gather(order, -1, rank)
            used = torch.arange(width, device=logits.device) < samples.unsqueeze(-1)
            scale = size.double() / samples.clamp(min=1)
            contribution = torch.gather(weights, -1, drawn) * scale.unsqueeze(-1) * used
            coefficients = coefficients.scatter_add(-1, drawn, contribution)
        blocks.append(weighted_output(coefficients, v))
        stats.append((fixed.sum(-1), size, samples, exact_tail & (size > 0), required))
    output = torch.cat([block[0] for block in blocks], dim=-2)
    info = {key: torch.cat([row[index] for row in stats], dim=-1)
            for index, key in enumerate(("fixed", "tail", "samples", "exact_tail", "required"))}
    return output, info
