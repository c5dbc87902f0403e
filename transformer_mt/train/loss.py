"""Label-smoothed cross-entropy of the output projection, returned as sums so the trainer divides
once by the token count.

Convention (PyTorch's, also fairseq's up to the target's own share): the smoothed target puts
1 - eps on the reference token and eps / V on every token of the vocabulary (the reference
included), so loss_i = (1 - eps) * nll_i + eps * mean_v(-log p_v). Padding positions count zero.

`projected_loss` never holds the logits of the whole batch: it takes the decoder's last hidden
states and the (tied) output embedding, drops the padding positions, and works through the
tokens a chunk at a time. For each chunk it computes the logits, their log-softmax and, when a
gradient is wanted, the gradient at once (softmax minus the smoothed target), turns it into the
gradients of the hidden states and of the embedding, and lets the chunk's logits go. The mean
logit over the vocabulary, which the smoothing term needs, takes no pass over the logits: it is
h . mean(W). Backward then only scales the stored gradients by the incoming one (the loss is a
sum, so that scalar is all autograd passes down).

Per chunk that is three matmuls (the same FLOPs as the plain loss, minus the padding) and five
simple passes over (chunk x V), all but two in place: the row maxima, the subtraction and exp,
their row sums, and for the gradient the division that makes them the softmax (and, under
autocast, the cast of the gradient to the matmuls' dtype); logsumexp would allocate a
(chunk x V) temporary of its own. The plain loss makes about ten passes over the whole
(tokens x V) in fp32 and keeps several of them alive at once (benchmarks/bench_loss.py times the
two). How it works through the tokens is the execution policy's (execution.LossChunks: tokens a
chunk, padding dropped first or weighted 0, the products' dtype and kernels): where the policy
compiles, each chunk's passes over its logits go through torch.compile (`softmax_terms`), which
fuses them into about two reads of the logits in their bf16 and one write of the bf16 gradient
(make gpu-check times the step with them compiled and eager: benchmarks/gpu_check.py).
`label_smoothed_loss` is that plain form over given logits: the reference the tests hold
`projected_loss` to.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from transformer_mt import onednn
from transformer_mt.execution import ExecutionPolicy, LossChunks


class LossSums(NamedTuple):
    loss: Tensor  # summed label-smoothed loss (what is minimised)
    nll: Tensor  # summed negative log-likelihood of the references (for perplexity)
    n_tokens: Tensor  # non-pad target tokens


def label_smoothed_loss(logits: Tensor, target: Tensor, *, epsilon: float, pad_id: int) -> LossSums:
    """logits (B, T, V), target (B, T) -> sums over non-pad positions, in fp32 over the whole
    (B, T, V): the plain form, kept as the reference of `projected_loss`."""
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = target != pad_id  # (B, T)
    nll = F.nll_loss(
        log_probs.flatten(0, 1), target.flatten(), ignore_index=pad_id, reduction="sum"
    )
    uniform = -(log_probs.mean(dim=-1) * keep).sum()
    loss = (1.0 - epsilon) * nll + epsilon * uniform
    return LossSums(loss, nll, keep.sum())


def projected_loss(
    hidden: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    epsilon: float,
    pad_id: int,
    chunks: LossChunks,
) -> LossSums:
    """The sums of `label_smoothed_loss(hidden @ weight.T, target)` without its logits.

    hidden (B, T, D): the decoder's output; weight (V, D): the output projection; target (B, T).
    The matmuls run in chunks.dtype (the policy's autocast dtype: bf16, fp16; None: the tokens'
    own) and everything else in fp32, as the plain loss does after autocast's matmul and its
    cast. The nll is returned without a gradient. `chunks`: how the tokens are worked through,
    as the execution policy says (ExecutionPolicy.loss_chunks)."""
    keep = target != pad_id
    if chunks.drop_padding:
        tokens, references, weights = hidden[keep], target[keep], None
    else:
        tokens, references = hidden.flatten(0, 1), target.flatten()
        weights = keep.flatten().to(torch.float32)
    # forward runs with grad mode off, and needs_input_grad says only what requires a gradient,
    # not whether one will be taken (validation): the caller's grad mode says
    wants_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    plan = ChunkPlan(epsilon=epsilon, wants_grad=wants_grad, chunks=chunks)
    # The products' dtype is chunks.dtype, which the loss applies itself: autocast off here.
    with torch.autocast(hidden.device.type, enabled=False):
        loss, nll = ProjectedLoss.apply(tokens, weight, references, weights, plan)
    return LossSums(loss, nll, keep.sum())


def chunk_products(
    weight: Tensor, by_onednn: bool, wants_grad: bool
) -> tuple[Callable[[Tensor], Tensor], Callable[[Tensor], Tensor]]:
    """A chunk's two products by `weight` (V, D): h -> h W^T (the logits) and g -> g W (the
    gradient of the hidden states); by oneDNN's kernel with W reordered once for all the chunks
    (onednn.py), or by torch's."""
    if not by_onednn:
        return (lambda h: h @ weight.T), (lambda g: g @ weight)
    forward = onednn.packed(weight)
    backward = onednn.packed(weight.t()) if wants_grad else None
    return (
        lambda h: onednn.product_in_row_steps(h, forward),
        lambda g: onednn.product_in_row_steps(g, backward),
    )


def softmax_terms(
    logits: Tensor, references: Tensor, epsilon: float, wants_grad: bool
) -> tuple[Tensor, Tensor, Tensor | None]:
    """A chunk's logits (c, V), in the products' dtype, and its references (c,) -> the logits'
    log-sum-exp (c,) and the references' logits (c,), in fp32, and, when wants_grad, the
    gradient of the loss by the logits less its uniform eps / V (c, V), in the logits' dtype:
    softmax - (1 - eps) * onehot(reference), the reference's share taken off in fp32 before the
    cast (ProjectedLoss puts the eps / V on its (c, D) and (V, D) results instead).

    Eagerly its passes over (c, V) work in place on the logits' fp32 copy (on the logits
    themselves when they are fp32: they are spent); compiled (`compiled_softmax_terms`) they
    fuse into about two reads of the logits and one write of the gradient (compiled on fp32
    logits, the compiled graph writes its in-place work back into them: one pass more, in a
    setting no default chooses)."""
    z = logits.float()
    reference = z.gather(1, references[:, None]).squeeze(1)
    top = z.amax(dim=-1, keepdim=True)
    exps = z.sub_(top).exp_()  # exp(z - max z)
    total = exps.sum(dim=-1, keepdim=True)
    lse = (top + total.log()).squeeze(1)
    if not wants_grad:
        return lse, reference, None
    softmax = exps.div_(total)
    at_reference = softmax.gather(1, references[:, None]) - (1.0 - epsilon)
    grad_z = softmax.to(logits.dtype)
    return lse, reference, grad_z.scatter_(1, references[:, None], at_reference.to(logits.dtype))


@functools.cache
def compiled_softmax_terms(
    backend: str = "inductor",
) -> Callable[..., tuple[Tensor, Tensor, Tensor | None]]:
    """`softmax_terms` through torch.compile's `backend` (once per process and backend), any
    number of tokens a chunk: how, not whether (the policy's LossChunks.compiled says that)."""
    return torch.compile(softmax_terms, dynamic=True, backend=backend)


@dataclass(frozen=True)
class ChunkPlan:
    """What ProjectedLoss does (projected_loss's arguments): the smoothing, whether a gradient
    is taken, and the policy's way through the tokens (the tokens a chunk, the products' dtype,
    which kernels multiply and pass over the logits)."""

    epsilon: float
    wants_grad: bool
    chunks: LossChunks


class ProjectedLoss(torch.autograd.Function):
    """(N, D) hidden states, (V, D) weight, (N,) references, (N,) 0/1 weights or None (all 1),
    a ChunkPlan -> (loss sum, nll sum), with the gradients computed in forward (see the
    module's docstring)."""

    @staticmethod
    def forward(ctx, tokens, weight, references, weights, plan: ChunkPlan):
        epsilon, wants_grad, chunks = plan.epsilon, plan.wants_grad, plan.chunks
        chunk_tokens, vocab = chunks.tokens, weight.shape[0]
        compute = chunks.dtype or tokens.dtype
        weight_c = weight.to(compute)
        by_onednn = chunks.by_onednn and compute == torch.float32
        logits_of, grad_of = chunk_products(weight_c, by_onednn, wants_grad)
        terms = compiled_softmax_terms(chunks.compile_backend) if chunks.compiled else softmax_terms
        mean_row = weight.float().mean(dim=0)  # mean_v z_v = h . mean_v W_v
        loss = torch.zeros((), dtype=torch.float32, device=tokens.device)
        nll = torch.zeros_like(loss)
        grad_tokens = torch.empty_like(tokens, dtype=torch.float32) if wants_grad else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if wants_grad else None
        token_sum = torch.zeros_like(mean_row)  # sum_i h_i, for the eps / V term of grad_weight
        for start in range(0, tokens.shape[0], chunk_tokens):
            h = tokens[start : start + chunk_tokens]
            y = references[start : start + chunk_tokens]
            w = None if weights is None else weights[start : start + chunk_tokens]
            if w is not None:  # a padded position: no share of the loss or of any gradient
                h = h * w[:, None]
            h_c = h.to(compute)
            lse, reference, grad_z = terms(logits_of(h_c), y, epsilon, wants_grad)
            chunk_nll = lse - reference
            h32 = h.float()
            chunk_uniform = lse - h32 @ mean_row
            if w is not None:
                chunk_nll, chunk_uniform = chunk_nll * w, chunk_uniform * w
            nll += chunk_nll.sum()
            loss += (1.0 - epsilon) * chunk_nll.sum() + epsilon * chunk_uniform.sum()
            if not wants_grad:
                continue
            # the uniform eps / V of d loss_i / d z goes onto the (c, D) and (V, D) results
            # instead of a pass over the (c, V) logits
            grad_h = grad_of(grad_z).float() - epsilon * mean_row
            if w is not None:
                grad_h *= w[:, None]
            grad_tokens[start : start + chunk_tokens] = grad_h
            if compute == torch.float32:
                grad_weight.addmm_(grad_z.T, h_c)
            else:
                grad_weight += (grad_z.T @ h_c).float()
            token_sum += h32.sum(0)
        if wants_grad:
            grad_weight -= (epsilon / vocab) * token_sum
            ctx.save_for_backward(grad_tokens, grad_weight)
        ctx.mark_non_differentiable(nll)
        ctx.input_dtypes = (tokens.dtype, weight.dtype)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, _grad_nll):
        grad_tokens, grad_weight = ctx.saved_tensors
        tokens_dtype, weight_dtype = ctx.input_dtypes
        return (
            (grad_tokens * grad_loss).to(tokens_dtype) if ctx.needs_input_grad[0] else None,
            (grad_weight * grad_loss).to(weight_dtype) if ctx.needs_input_grad[1] else None,
            None,  # references
            None,  # weights
            None,  # plan
        )


class TrainingLoss(torch.nn.Module):
    """The model and its loss as one module, (src, tgt_in, tgt_out, src_padded) -> LossSums:
    what DistributedDataParallel wraps. The loss works through the tokens as `chunks` says
    (`projected_loss`); the chunk loop itself stays eager (its token selection has a
    data-dependent size). `for_policy` gives the model and the chunks as the execution policy
    runs a training step."""

    def __init__(self, model, chunks: LossChunks, *, epsilon: float, pad_id: int):
        super().__init__()
        self.model, self.chunks = model, chunks
        self.epsilon, self.pad_id = epsilon, pad_id

    @classmethod
    def for_policy(
        cls, model, policy: ExecutionPolicy, *, epsilon: float, pad_id: int
    ) -> TrainingLoss:
        """`model` and its loss as `policy` runs a training step: its kernels and compiled
        layers (ExecutionPolicy.with_kernels) and the loss's chunks
        (ExecutionPolicy.loss_chunks: by oneDNN where the policy takes it, compiled where it
        compiles)."""
        chunks = policy.loss_chunks(model.embed.num_embeddings)
        return cls(policy.with_kernels(model), chunks, epsilon=epsilon, pad_id=pad_id)

    def forward(
        self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, src_padded: bool = True
    ) -> LossSums:
        """src_padded: False where every source of the batch has its length (Batch.src_padded),
        so that attention takes no key-padding mask."""
        hidden = self.model.decode_hidden(tgt_in, self.model.encode(src, padded=src_padded))
        return projected_loss(
            hidden,
            self.model.embed.weight,
            tgt_out,
            epsilon=self.epsilon,
            pad_id=self.pad_id,
            chunks=self.chunks,
        )
