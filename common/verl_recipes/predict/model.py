"""Architecture numbers from a Hugging Face `config.json`: parameters, activations, KV cache.

Everything here is counted from tensor shapes, so it can be checked by hand and by the meta
device (the recipes' `model.params` equal `Arch.params()` exactly). The planner models dense,
decoder-only causal LMs with a gated MLP (Llama, Qwen2, Mistral, Qwen3 style); anything else
fails with the reason instead of being silently mis-modelled.

Parameters (h hidden, f intermediate, a heads, k KV heads, d head_dim, V vocab, L layers):

    per layer  = h*a*d (q) + 2*h*k*d (k, v) + a*d*h (o) + 3*h*f (gate, up, down) + 2h (norms)
                 + a*d + 2*k*d if the q/k/v projections have biases (Qwen2), + h for an o bias
    total      = L * per_layer + V*h (embedding) + h (final norm) + V*h (lm_head, unless tied)
    critic     = total - lm_head + h + 1   (verl's value model: the LM body + a Linear(h, 1)
                 score head, `AutoModelForTokenClassification` with num_labels=1)
    LoRA       = r * (in + out) per targeted Linear (A: in x r, B: r x out)

Activations kept for backward, bytes per token per layer, 16-bit activations. This follows
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), section 4.1, which counts sbh(34 + 5as/h) for a GPT layer: 11sbh + 5as^2b
for attention, 19sbh for a 4h GeLU MLP, 4sbh for two LayerNorms. Adapted to what verl trains:

  * flash/SDPA attention keeps no a*s^2 score matrix (the 5as/h term vanishes; the kernel keeps a
    per-head log-sum-exp, 4 bytes per head); eager attention keeps the fp32 softmax and its bf16
    copy, 6*a*s bytes per token (counted separately, `eager_attention_bytes`);
  * no dropout (Llama/Qwen2 configs use 0), so no dropout masks;
  * GQA: K and V are k*d wide, not h;
  * RMSNorm as Hugging Face writes it upcasts to fp32, so each norm keeps its bf16 input (2h)
    and the fp32 copy (4h);
  * a gated MLP keeps its input (2h), gate and up outputs (2f each), SiLU output (2f) and the
    product fed to the down projection (2f): 2h + 8f.

    A = 2 * (2h + 4h) (norms) + 2h (qkv input) + 2(a*d + 2k*d) (q, k, v) + 2*a*d (o input)
        + 4a (lse) + 2h (MLP input) + 8f
      = 16h + 4*a*d + 4*k*d + 4a + 8f

With gradient checkpointing (Hugging Face checkpoints every decoder layer) only each layer's
input survives (2h per token per layer) and one layer is recomputed at a time (A).

KV cache (vLLM), bytes per token per GPU = 2 (K and V) * L * max(1, k / TP) * d * dtype bytes;
vLLM replicates KV heads when TP exceeds k, so a GPU never holds less than one head.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError

# Model types that are not decoder-only causal LMs: their configs may carry the same keys.
_NOT_DECODER = {
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "albert",
    "electra",
    "deberta",
    "deberta-v2",
    "mpnet",
    "t5",
    "mt5",
    "umt5",
    "bart",
    "mbart",
    "pegasus",
    "marian",
    "whisper",
    "encoder-decoder",
}
_REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
# Linear modules a LoRA `target_modules: all-linear` reaches in a Llama-style layer (peft excludes
# the output layer): name -> (input width, output width) as functions of the architecture.
LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Arch:
    """The shape of a dense decoder-only LM, as read from its config.json."""

    model_type: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tie_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    max_position_embeddings: int

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: dict[str, Any], source: str = "config.json") -> Arch:
        """Read and check a config.json; a model the planner cannot model raises RecipeError."""
        mt = str(cfg.get("model_type", "")).lower()
        if cfg.get("is_encoder_decoder") or mt in _NOT_DECODER:
            raise RecipeError(
                f"{source}: model_type {mt or '?'!r} is not a decoder-only causal LM; "
                "the planner models decoder-only LMs (Llama, Qwen2, Mistral)"
            )
        archs = cfg.get("architectures") or []
        if archs and not any(str(a).endswith("ForCausalLM") for a in archs):
            raise RecipeError(
                f"{source}: architectures {archs} has no *ForCausalLM; the planner models decoder-only causal LMs"
            )
        missing = [k for k in _REQUIRED if not isinstance(cfg.get(k), int) or cfg[k] <= 0]
        if missing:
            raise RecipeError(
                f"{source}: no positive integer {', '.join(missing)}; give the config.json of a decoder-only LM"
            )
        for moe_key in ("num_experts", "num_local_experts", "n_routed_experts"):
            if (cfg.get(moe_key) or 0) > 0:
                raise RecipeError(f"{source}: {moe_key}={cfg[moe_key]}: mixture-of-experts models are not modelled")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        kv = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        if heads % kv:
            raise RecipeError(f"{source}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
        attn_bias = bool(cfg.get("attention_bias", False))
        # Qwen2 has biases on q, k and v but not on o; its config does not say so.
        qkv_bias = attn_bias or mt == "qwen2"
        return cls(
            model_type=mt or "unknown",
            layers=int(cfg["num_hidden_layers"]),
            hidden=hidden,
            intermediate=int(cfg["intermediate_size"]),
            heads=heads,
            kv_heads=kv,
            head_dim=head_dim,
            vocab=int(cfg["vocab_size"]),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=attn_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
        )

    @classmethod
    def from_file(cls, path: Path) -> Arch:
        try:
            cfg = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RecipeError(f"{path}: cannot read a config.json: {e}") from None
        if not isinstance(cfg, dict):
            raise RecipeError(f"{path}: expected a JSON object")
        return cls.from_config(cfg, str(path))

    # ---- widths ------------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shape(self, module: str) -> tuple[int, int]:
        """(in, out) of a Llama-style projection, for LoRA counting."""
        h, f = self.hidden, self.intermediate
        shapes = {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, f),
            "up_proj": (h, f),
            "down_proj": (f, h),
        }
        if module not in shapes:
            raise RecipeError(f"LoRA target {module!r} is not a Llama-style projection; use {', '.join(shapes)}")
        return shapes[module]

    # ---- parameters --------------------------------------------------------------------
    def layer_params(self) -> int:
        h, f = self.hidden, self.intermediate
        n = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 3 * h * f + 2 * h
        if self.qkv_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.o_bias:
            n += h
        if self.mlp_bias:
            n += 2 * f + h
        return n

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """The output layer's own parameters: 0 when it shares the embedding."""
        return 0 if self.tie_embeddings else self.vocab * self.hidden

    def params(self) -> int:
        """Total parameters of the causal LM."""
        return self.layers * self.layer_params() + self.embed_params + self.hidden + self.lm_head_params

    def critic_params(self) -> int:
        """verl's value model: the LM body plus a Linear(h, 1) score head with a bias."""
        return self.params() - self.lm_head_params + self.hidden + 1

    def largest_tensor_params(self) -> int:
        """The biggest single weight (embedding or an MLP matrix): the sync staging unit."""
        return max(self.embed_params, self.hidden * self.intermediate, self.hidden * self.q_dim)

    def lora_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """Adapter parameters for rank r on the given modules of every layer (0 when r == 0)."""
        if rank <= 0:
            return 0
        per_layer = sum(rank * sum(self.linear_shape(m)) for m in targets)
        return self.layers * per_layer

    def lora_layer_params(self, rank: int, targets: tuple[str, ...]) -> int:
        return self.lora_params(rank, targets) // self.layers if rank > 0 else 0

    # ---- activations -------------------------------------------------------------------
    def activation_bytes_per_token_layer(self) -> int:
        """A: bytes one decoder layer keeps for backward per token (module docstring)."""
        h, f = self.hidden, self.intermediate
        return 16 * h + 4 * self.q_dim + 4 * self.kv_dim + 4 * self.heads + 8 * f

    def checkpoint_bytes_per_token_layer(self) -> int:
        """With per-layer checkpointing, only the layer input survives: 2h bytes per token."""
        return 2 * self.hidden

    def eager_attention_bytes(self, seq_len: int) -> int:
        """Eager attention's kept scores per token per layer: fp32 softmax + bf16 copy, 6*a*s."""
        return 6 * self.heads * seq_len

    def forward_transient_bytes_per_token(self) -> int:
        """Peak live bytes per token inside one layer with no autograd (log-prob passes).

        The hidden state and residual (2h each, bf16), the fp32 norm upcast (4h), and the wider of
        the MLP's gate, up and product (3 x 2f) or the attention's q, k, v and output.
        """
        h, f = self.hidden, self.intermediate
        mlp = 3 * 2 * f
        attn = 2 * (2 * self.q_dim + 2 * self.kv_dim)
        return 2 * 2 * h + 4 * h + max(mlp, attn)

    # ---- KV cache ----------------------------------------------------------------------
    def kv_heads_per_gpu(self, tp: int) -> int:
        return max(1, self.kv_heads // tp)

    def kv_bytes_per_token(self, tp: int = 1, dtype_bytes: int = 2) -> int:
        """vLLM KV cache bytes per token on one GPU of a TP group."""
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes

    def describe(self) -> str:
        return (
            f"{self.model_type}, {self.params() / 1e9:.2f}B params, {self.layers} layers, h={self.hidden}, "
            f"f={self.intermediate}, {self.heads} heads / {self.kv_heads} KV heads, vocab {self.vocab}"
        )
