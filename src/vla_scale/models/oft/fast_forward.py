"""The rollout engine's fast forward pass: the same bin logits as `OFTPolicy.action_logits`, computed with less work.

What differs from the policy's own (plain) forward, and why each keeps the function the same:

- **Trimmed text.** `Processor` pads every prompt to `max_text_len`; the plain pass runs all those pad positions.
  Here the prompt columns are cut to the longest prompt of the batch first (`PolicyInputs.trimmed`, on the host).
- **Packed positions, no mask.** Every row's real positions (BOS, patches, proprio, prompt, slots, stop) come first
  in it and pads after, and pad outputs are never read. So the decoder runs on the real positions only, packed into
  one [N, D] matrix (rows ordered by length), and attention runs once per run of equal-length rows as a dense SDPA
  call with no mask (`is_causal` for causal policies): the fused kernels take it as is, and no real position sees a
  different set of keys or gets a different rotary position than in the plain pass.
- **Free functions per block.** A ViT block and the parts of a Llama decoder layer are written as functions of their
  weights, so `torch.compile` traces each once (batch and sequence sizes dynamic) and every layer reuses the compiled
  code; it fuses each norm, rotary embedding and activation into one pass. The arithmetic follows transformers' Llama
  (RMSNorm in float32, cast back before the weight) and the towers in `models/oft/vision.py` (same ops, same order).
- **Stacked projections.** The engine lays its weights end to end in parameter order, so a layer's q, k and v
  weights (and its gate and up weights) already form one matrix: a view of it makes each one matrix product.
- **Residual adds in the GEMM.** The output and down projections accumulate into the residual stream in place
  (`addmm_`), so no separate add kernel reads and writes it again.
- **Only what is read.** The last decoder layer computes keys and values for all positions but queries, output
  projection and MLP only for the rows whose logits are read (one per action slot); the final norm runs on those rows
  and the LM head multiplies only its `n_bins` action rows.
- **Towers side by side.** On a GPU the two towers of a fused backbone run on two streams, block by block, so one
  tower's memory-bound kernels and kernel tails overlap the other's matrix products.

Without `compile` the same functions run eagerly (the CPU equivalence test runs them so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from vla_scale.models.fp8 import Fp8Matrix, fp8_linear, quantise_rows, scaled_mm
from vla_scale.models.oft.fp8 import Fp8Llama, Fp8Vit, Fp8Weights
from vla_scale.models.oft.policy import OFTPolicy
from vla_scale.models.oft.vision import ViT, film, quick_gelu
from vla_scale.tensors.spans import span

Weights = tuple[Tensor | None, ...]
Groups = tuple[tuple[int, int], ...]  # (rows, positions per row) for each run of equal-length rows, in packed order


class LlamaWeights(NamedTuple):
    """One decoder layer's tensors as the functions below read them (biases None where the layer has none)."""

    input_norm: Tensor
    q: Tensor
    q_bias: Tensor | None
    k: Tensor
    k_bias: Tensor | None
    v: Tensor
    v_bias: Tensor | None
    o: Tensor
    o_bias: Tensor | None
    post_norm: Tensor
    gate: Tensor
    gate_bias: Tensor | None
    up: Tensor
    up_bias: Tensor | None
    down: Tensor
    down_bias: Tensor | None
    qkv: Tensor | None  # q, k and v weights as one matrix (a view), when they lie end to end without biases
    gate_up: Tensor | None  # gate and up weights as one matrix, likewise
    fp8: Fp8Llama | None = None  # the layer's FP8 matrices, which the products then use (rollout.precision=fp8)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The policy's `FusedRMSNorm`: normalise and scale in float32, rounded once."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _vit_act(x: Tensor, act: str) -> Tensor:
    if act == "gelu":
        return F.gelu(x)
    if act == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    return quick_gelu(x)


def vit_block(x: Tensor, w: Weights, heads: int, eps: float, act: str, fp8: Fp8Vit | None = None,
              film_params: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """One pre-norm ViT block (`models.vision.Block`); w = (norm1 w, b, qkv w, b, proj w, b, norm2 w, b,
    fc1 w, b, fc2 w, b, layer-scale 1, layer-scale 2), the layer scales None when the tower has none. `fp8`: the
    block's four products in FP8 (each input quantised in the kernel that produces it). `film_params`: a FiLMed
    block's (gamma, beta) [B, D], applied between the attention and the MLP."""
    n1w, n1b, qkv_w, qkv_b, proj_w, proj_b, n2w, n2b, fc1_w, fc1_b, fc2_w, fc2_b, ls1, ls2 = w
    f8: tuple[Fp8Matrix | None, ...] = (None,) * 4 if fp8 is None else fp8[:4]
    emulate = fp8 is not None and fp8.emulate
    b, n, d = x.shape
    h = F.layer_norm(x, (d,), n1w, n1b, eps)
    q, k, v = _product(h, qkv_w, qkv_b, f8[0], emulate).reshape(b, n, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    h = _product(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d), proj_w, proj_b, f8[1],
                 emulate)
    x = x + (h if ls1 is None else h * ls1)
    if film_params is not None:
        x = film(x, *film_params)
    h = _product(F.layer_norm(x, (d,), n2w, n2b, eps), fc1_w, fc1_b, f8[2], emulate)
    h = _product(_vit_act(h, act), fc2_w, fc2_b, f8[3], emulate)
    return x + (h if ls2 is None else h * ls2)


def _product(h: Tensor, weight: Tensor, bias: Tensor | None, fp8: Fp8Matrix | None, emulate: bool) -> Tensor:
    """`F.linear`, or its FP8 form when the matrix has an FP8 copy."""
    return F.linear(h, weight, bias) if fp8 is None else fp8_linear(h, fp8, bias, emulate)


def _rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of packed heads x [N, H, hd] at positions whose cos, sin are [N, hd]."""
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


def llama_qkv(x: Tensor, cos: Tensor, sin: Tensor, w: LlamaWeights, heads: int, kv_heads: int, eps: float
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Input norm, projections and rotary embedding of packed positions x [N, D]: q [N, H, hd], k, v [N, H_kv, hd]."""
    n = x.shape[0]
    h = _rms_norm(x, w.input_norm, eps)
    if w.fp8 is not None:
        f = w.fp8
        q, k, v = fp8_linear(h, f.qkv, f.qkv_bias, f.emulate).split(_qkv_sizes(f), dim=1)
        q, k, v = q.view(n, heads, -1), k.view(n, kv_heads, -1), v.view(n, kv_heads, -1)
    elif w.qkv is not None:  # one product for all three (same dot products, one launch, fuller waves)
        q, k, v = F.linear(h, w.qkv).split([w.q.shape[0], w.k.shape[0], w.v.shape[0]], dim=1)
        q, k, v = q.view(n, heads, -1), k.view(n, kv_heads, -1), v.view(n, kv_heads, -1)
    else:
        q = F.linear(h, w.q, w.q_bias).view(n, heads, -1)
        k = F.linear(h, w.k, w.k_bias).view(n, kv_heads, -1)
        v = F.linear(h, w.v, w.v_bias).view(n, kv_heads, -1)
    return _rotary(q, cos, sin), _rotary(k, cos, sin), v


def llama_qkv_rows(x: Tensor, read: Tensor, cos: Tensor, sin: Tensor, w: LlamaWeights, heads: int, kv_heads: int,
                   eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`llama_qkv` for the last layer: keys and values at every position, queries only at the packed indices
    `read` int64[R]; also returns x at `read` (the residual stream of those rows)."""
    n = x.shape[0]
    h = _rms_norm(x, w.input_norm, eps)
    if w.fp8 is not None:
        f = w.fp8
        data, scale = quantise_rows(h)  # once for all three products
        q_bias, k_bias, v_bias = (None,) * 3 if f.qkv_bias is None else f.qkv_bias.split(_qkv_sizes(f))
        kv = scaled_mm(data, scale, f.qkv.rows(f.q_out, f.qkv.data.shape[0]), h.dtype, f.emulate)
        k, v = kv.split([f.k_out, kv.shape[1] - f.k_out], dim=1)
        k, v = _biased(k, k_bias).view(n, kv_heads, -1), _biased(v, v_bias).view(n, kv_heads, -1)
        q = scaled_mm(data.index_select(0, read), scale.index_select(0, read), f.qkv.rows(0, f.q_out), h.dtype,
                      f.emulate)
        q = _biased(q, q_bias).view(read.shape[0], heads, -1)
    else:
        k = F.linear(h, w.k, w.k_bias).view(n, kv_heads, -1)
        v = F.linear(h, w.v, w.v_bias).view(n, kv_heads, -1)
        q = F.linear(h.index_select(0, read), w.q, w.q_bias).view(read.shape[0], heads, -1)
    q = _rotary(q, cos.index_select(0, read), sin.index_select(0, read))
    return q, _rotary(k, cos, sin), v, x.index_select(0, read)


def llama_mlp_in(x: Tensor, w: LlamaWeights, eps: float) -> Tensor:
    """Post-attention norm, gate and up projections and their SiLU product: the down projection's input."""
    h = _rms_norm(x, w.post_norm, eps)
    if w.gate_up is not None:
        gate, up = F.linear(h, w.gate_up).split([w.gate.shape[0], w.up.shape[0]], dim=1)
        return F.silu(gate) * up
    return F.silu(F.linear(h, w.gate, w.gate_bias)) * F.linear(h, w.up, w.up_bias)


def llama_mlp_in_fp8(x: Tensor, w: LlamaWeights, eps: float) -> tuple[Tensor, Tensor]:
    """`llama_mlp_in` through the layer's FP8 matrices, its output quantised per row for the down projection."""
    f = w.fp8
    assert f is not None
    gate, up = fp8_linear(_rms_norm(x, w.post_norm, eps), f.gate_up, f.gate_up_bias, f.emulate).split(
        [f.gate_out, f.gate_up.data.shape[0] - f.gate_out], dim=1)
    return quantise_rows(F.silu(gate) * up)


def _qkv_sizes(f: Fp8Llama) -> list[int]:
    return [f.q_out, f.k_out, f.qkv.data.shape[0] - f.q_out - f.k_out]


def _biased(x: Tensor, bias: Tensor | None) -> Tensor:
    return x if bias is None else x + bias


def add_linear_(x: Tensor, h: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x += h @ weight.T (+ bias), in place: the residual add happens in the matrix product's epilogue."""
    x.addmm_(h, weight.t())
    return x if bias is None else x.add_(bias)


def attend(q: Tensor, k: Tensor, v: Tensor, groups: Groups, causal: bool, queries: Tensor | None = None
           ) -> Iterator[tuple[slice, Tensor]]:
    """Attention of packed rows over their own positions, q [M, H, hd], k, v [N, H_kv, hd]: yields (rows of q, their
    output [rows, H * hd]) for each run of `rows` rows of `length` positions, one dense SDPA call without a mask each
    (causal: `is_causal`). The caller consumes each output in place of a concatenation.

    `queries` int64[B, K] (packed row order): q then holds only K query rows per row, at these positions of it (the
    last layer), and a causal policy masks the keys after each."""
    q_at, kv_at, row_at = 0, 0, 0
    gqa = q.shape[1] != k.shape[1]
    for rows, length in groups:
        nq = length if queries is None else queries.shape[1]
        qs = q[q_at : q_at + rows * nq].view(rows, nq, *q.shape[1:]).transpose(1, 2)
        ks = k[kv_at : kv_at + rows * length].view(rows, length, *k.shape[1:]).transpose(1, 2)
        vs = v[kv_at : kv_at + rows * length].view(rows, length, *v.shape[1:]).transpose(1, 2)
        mask = None
        if causal and queries is not None:
            at = queries[row_at : row_at + rows, :, None]
            mask = (torch.arange(length, device=q.device) <= at).unsqueeze(1)
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, is_causal=causal and queries is None,
                                           enable_gqa=gqa)
        yield slice(q_at, q_at + rows * nq), o.transpose(1, 2).reshape(rows * nq, -1)
        q_at, kv_at, row_at = q_at + rows * nq, kv_at + rows * length, row_at + rows


@dataclass(frozen=True)
class Packing:
    """The host's view of a batch's layout: `groups` (rows, prompt tokens) per run of equal prompt lengths, shortest
    first (the order `pack_index` packs the rows in)."""

    groups: Groups

    @classmethod
    def of(cls, prompt_lengths: Sequence[int]) -> Packing:
        runs: list[list[int]] = []
        for length in sorted(prompt_lengths):
            if runs and runs[-1][1] == length:
                runs[-1][0] += 1
            else:
                runs.append([1, length])
        return cls(tuple((rows, length) for rows, length in runs))

    def positions(self, extra: int) -> Groups:
        """Groups in sequence positions, each row holding `extra` positions besides its prompt tokens."""
        return tuple((rows, length + extra) for rows, length in self.groups)


def pack_index(valid: Tensor, total: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Packing of the real positions of valid bool[B, T] (a prefix of each row), `total` of them.

    Returns `order` int64[B] (rows by number of real positions, stable), `flat` int64[N] (each packed position's index
    in the flattened [B*T]), `positions` int64[N] (its position in its row) and `starts` int64[B] (the packed index of
    the first position of each row, in packed order). No host sync: `total` comes from the host."""
    b, t = valid.shape
    lengths, order = torch.sort(valid.sum(dim=1), stable=True)
    starts = lengths.cumsum(0) - lengths
    row = torch.repeat_interleave(torch.arange(b, device=valid.device), lengths, output_size=total)
    positions = torch.arange(total, device=valid.device) - starts[row]
    return order, order[row] * t + positions, positions, starts


def _linear(module: Any) -> tuple[Tensor, Tensor | None]:
    return module.weight, module.bias


def _vit_weights(block: Any) -> Weights:
    scales = tuple(getattr(block, name).scale_factor if hasattr(getattr(block, name), "scale_factor") else None
                   for name in ("ls1", "ls2"))
    return (block.norm1.weight, block.norm1.bias, *_linear(block.attn.qkv), *_linear(block.attn.proj),
            block.norm2.weight, block.norm2.bias, *_linear(block.mlp.fc1), *_linear(block.mlp.fc2), *scales)


def _llama_weights(layer: Any, fp8: Fp8Llama | None = None) -> LlamaWeights:
    attn, mlp = layer.self_attn, layer.mlp
    return LlamaWeights(layer.input_layernorm.weight, *_linear(attn.q_proj), *_linear(attn.k_proj),
                        *_linear(attn.v_proj), *_linear(attn.o_proj), layer.post_attention_layernorm.weight,
                        *_linear(mlp.gate_proj), *_linear(mlp.up_proj), *_linear(mlp.down_proj),
                        _stacked(attn.q_proj, attn.k_proj, attn.v_proj), _stacked(mlp.gate_proj, mlp.up_proj), fp8)


def _stacked(*linears: Any) -> Tensor | None:
    """The weights of bias-free projections of one input as one [sum of outputs, in] matrix, when they lie end to end
    in memory (as the rollout engine lays them out): a view, no copy. Else None."""
    weights = [m.weight for m in linears]
    first = weights[0]
    if any(m.bias is not None for m in linears) or any(w.dim() != 2 or w.shape[1] != first.shape[1] for w in weights):
        return None
    whole = span(weights)
    return None if whole is None else whole.view(-1, first.shape[1])


class FastForward:
    """`policy.action_logits` (bins only) the fast way; `compile=True` runs the blocks through `torch.compile`;
    `side_by_side` (on a GPU) runs two towers on two streams; `fp8`: the towers' and decoder layers' matrix products
    through these FP8 copies of their weights (`models/oft/fp8.py`; the caller keeps them fresh)."""

    def __init__(self, policy: OFTPolicy, compile: bool = False, side_by_side: bool = True,
                 fp8: Fp8Weights | None = None):
        if not self.supports(policy):
            raise ValueError("the fast forward implements Llama's silu MLP and bin logits; this policy has "
                             f"hidden_act={policy.language_model.config.hidden_act!r}")
        self.policy = policy
        self.compiled = compile
        config = policy.language_model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
        self.eps = config.rms_norm_eps
        self.causal = policy.spec.attention == "causal"
        wrap: Callable[[Callable], Callable] = (lambda f: torch.compile(f)) if compile else (lambda f: f)
        self._vit_block, self._qkv, self._qkv_rows = wrap(vit_block), wrap(llama_qkv), wrap(llama_qkv_rows)
        self._mlp_in, self._mlp_in_fp8, self._fp8_linear = wrap(llama_mlp_in), wrap(llama_mlp_in_fp8), wrap(fp8_linear)
        self.fp8 = fp8
        self.side_by_side = side_by_side
        self._side: torch.cuda.Stream | None = None

    @staticmethod
    def supports(policy: OFTPolicy) -> bool:
        return policy.language_model.config.hidden_act == "silu"

    def _dynamic(self, *dims: tuple[Tensor, int]) -> None:
        """Batch and sequence axes are dynamic from the first call (one compile serves every batch size)."""
        if self.compiled:
            for tensor, dim in dims:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)

    def _tower_steps(self, vit: ViT, pixels: Tensor, language: Tensor | None) -> Iterator[Tensor]:
        """A tower one block per step (`ViT.forward`); the last step yields its patch features."""
        x = vit.norm_pre(vit._prefix_and_positions(vit.patch_embed(pixels)))
        spec = vit.spec
        fp8 = None if self.fp8 is None else self.fp8.towers.get(id(vit))  # absent: the tower in bf16
        for i, block in enumerate(vit.blocks[: spec.blocks_run]):
            self._dynamic((x, 0))
            film_params = None if language is None else (block.scale(language), block.shift(language))
            x = self._vit_block(x, _vit_weights(block), spec.num_heads, spec.norm_eps, spec.act,
                                None if fp8 is None else fp8[i], film_params)
            yield x
        yield (vit.norm(x) if spec.norm_features else x)[:, spec.num_prefix_tokens :]

    def tower(self, vit: ViT, pixels: Tensor, language: Tensor | None = None) -> Tensor:
        *_, features = self._tower_steps(vit, pixels, language)
        return features

    def _towers_side_by_side(self, first: Iterator[Tensor], second: Iterator[Tensor]) -> tuple[Tensor, Tensor]:
        """Both towers' steps alternately, the second on a side stream (enqueued in lockstep, so both run at once)."""
        main = torch.cuda.current_stream()
        if self._side is None:
            self._side = torch.cuda.Stream()
        self._side.wait_stream(main)
        steps: list[tuple[Iterator[Tensor], torch.cuda.Stream]] = [(first, main), (second, self._side)]
        last: list[Tensor | None] = [None, None]
        while steps:
            for pair in list(steps):
                with torch.cuda.stream(pair[1]):
                    x = next(pair[0], None)
                if x is None:
                    steps.remove(pair)
                else:
                    last[pair[1] is self._side] = x
        main.wait_stream(self._side)
        assert last[0] is not None and last[1] is not None
        last[1].record_stream(main)
        return last[0], last[1]

    def vision(self, pixel_values: Tensor, language: Tensor | None = None) -> Tensor:
        """`VisionBackbone.forward` with the towers' blocks run by `vit_block`."""
        backbone = self.policy.vision_backbone
        batch, n = pixel_values.shape[0], backbone.num_images(pixel_values)
        images = pixel_values.unflatten(1, (n, backbone.channels_per_image)).flatten(0, 1)
        lang = None if language is None else language.to(images.dtype).repeat_interleave(n, dim=0)
        first, fused = backbone.featurizer, backbone.fused_featurizer
        if fused is None:
            features = self.tower(first, images[:, :3], lang)
        elif self.side_by_side and images.is_cuda:
            features = torch.cat(self._towers_side_by_side(self._tower_steps(first, images[:, :3], lang),
                                                           self._tower_steps(fused, images[:, 3:], lang)), dim=2)
        else:
            features = torch.cat([self.tower(first, images[:, :3], lang), self.tower(fused, images[:, 3:], lang)],
                                 dim=2)
        return features.reshape(batch, n * features.shape[1], features.shape[2])

    def _mlp(self, x: Tensor, w: LlamaWeights) -> Tensor:
        self._dynamic((x, 0))
        if w.fp8 is None:
            return add_linear_(x, self._mlp_in(x, w, self.eps), w.down, w.down_bias)
        data, scale = self._mlp_in_fp8(x, w, self.eps)
        x.add_(scaled_mm(data, scale, w.fp8.down, x.dtype, w.fp8.emulate))
        return x if w.down_bias is None else x.add_(w.down_bias)

    def _add_o_proj(self, x: Tensor, out: Tensor, w: LlamaWeights) -> None:
        """x += out's output projection, in place."""
        if w.fp8 is None:
            add_linear_(x, out, w.o, w.o_bias)
        else:
            self._dynamic((out, 0))
            x.add_(self._fp8_linear(out, w.fp8.o, w.o_bias, w.fp8.emulate))

    def _llama_weights(self, layer: Any, index: int) -> LlamaWeights:
        return _llama_weights(layer, None if self.fp8 is None else self.fp8.layers[index])

    def _layer(self, x: Tensor, cos: Tensor, sin: Tensor, groups: Groups, w: LlamaWeights) -> Tensor:
        """One decoder layer over the packed positions x [N, D], updated in place."""
        self._dynamic((x, 0), (cos, 0), (sin, 0))
        q, k, v = self._qkv(x, cos, sin, w, self.heads, self.kv_heads, self.eps)
        for rows, out in attend(q, k, v, groups, self.causal):
            self._add_o_proj(x[rows], out, w)
        return self._mlp(x, w)

    def _last_layer(self, x: Tensor, read: Tensor, starts: Tensor, cos: Tensor, sin: Tensor, groups: Groups,
                    w: LlamaWeights) -> Tensor:
        """The last layer's output [B*K, D] at the positions `read` int64[B, K] of the rows (packed order)."""
        flat = (starts.unsqueeze(1) + read).flatten()
        self._dynamic((x, 0), (flat, 0), (cos, 0), (sin, 0))
        q, k, v, x_rows = self._qkv_rows(x, flat, cos, sin, w, self.heads, self.kv_heads, self.eps)
        for rows, out in attend(q, k, v, groups, self.causal, read):
            self._add_o_proj(x_rows[rows], out, w)
        return self._mlp(x_rows, w)

    def forward(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor, proprio: Tensor | None,
                packing: Packing) -> Tensor:
        """Bin logits float32[B, K, n_bins] (the l1 head's [B, K, 2]); `packing` must be `Packing.of` the rows'
        prompt lengths."""
        policy, spec = self.policy, self.policy.spec
        prefix = policy.prefix_embeddings(pixel_values, proprio, self.vision,
                                          policy.film_language(input_ids, attention_mask))
        x, valid, rows = policy._sequence(prefix, input_ids, attention_mask)
        b, t, d = x.shape
        groups = packing.positions(t - input_ids.shape[1])
        order, flat, positions, starts = pack_index(valid, sum(r * n for r, n in groups))
        x = x.reshape(b * t, d).index_select(0, flat)
        llm = policy.language_model.model
        cos, sin = (c[0] for c in llm.rotary_emb(x, positions.unsqueeze(0)))
        layers = llm.layers[: llm.config.num_hidden_layers]
        for i, layer in enumerate(layers[:-1]):
            x = self._layer(x, cos, sin, groups, self._llama_weights(layer, i))
        read = rows.index_select(0, order)
        last = self._llama_weights(layers[-1], len(layers) - 1)
        hidden = llm.norm(self._last_layer(x, read, starts, cos, sin, groups, last))
        if policy.action_head is not None:  # the L1 head's Gaussian, from the action rows' hidden states
            params = policy.head_params(hidden.view(b, read.shape[1], d))
            return torch.empty_like(params).index_copy_(0, order, params)
        begin = spec.action_token_begin
        head = policy.language_model.lm_head
        bias = None if head.bias is None else head.bias[begin : begin + spec.n_bins]
        logits = F.linear(hidden, head.weight[begin : begin + spec.n_bins], bias).float().view(b, read.shape[1], -1)
        return torch.empty_like(logits).index_copy_(0, order, logits)

    @torch.no_grad()
    def __call__(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor,
                 proprio: Tensor | None = None, prompt_lengths: list[int] | None = None) -> Tensor:
        """What the policy's forward gives (bin logits float32[B, chunk*action_dim, n_bins], or the l1 head's).
        `prompt_lengths` (the mask's row sums) come from the caller's host copy; without them they are read back from
        the device (one sync, before any of the forward's work is queued)."""
        lengths = attention_mask.sum(dim=1).tolist() if prompt_lengths is None else prompt_lengths
        return self.forward(pixel_values, input_ids, attention_mask, proprio, Packing.of(lengths))
