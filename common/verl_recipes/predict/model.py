"""Architecture numbers from a Hugging Face `config.json`: parameters, activations, KV cache.

Everything here is counted from tensor shapes, so it can be checked by hand and by the meta
device (`tests/test_arch.py` holds `Arch.params()` equal to the real module's count for every
bundled architecture). The planner models the dense, decoder-only causal LMs whose layers it
knows (`FAMILIES`: Llama, Mistral, Qwen2, Qwen3, Gemma 2); any other model type fails with the
reason instead of being silently mis-modelled. A family's defaults for keys a config.json may
leave out (Gemma 2 ties its embeddings and has head_dim 256 unless told otherwise; Qwen3 has
head_dim 128; Mistral slides a 4096 window) are transformers' own, checked against its config
classes by the tests.

Parameters (h hidden, f intermediate, a heads, k KV heads, d head_dim, V vocab, L layers, n norms
per layer: 2, or 4 for Gemma 2's pre/post norms around attention and MLP):

    per layer  = h*a*d (q) + 2*h*k*d (k, v) + a*d*h (o) + 3*h*f (gate, up, down) + n*h (norms)
                 + a*d + 2*k*d if the q/k/v projections have biases (Qwen2), + h for an o bias
                 + 2*d for Qwen3's RMSNorm on each head's query and key (`q_norm`, `k_norm`)
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
  * no dropout (Llama/Qwen/Gemma configs use 0), so no dropout masks;
  * GQA: K and V are k*d wide, not h;
  * RMSNorm as Hugging Face writes it upcasts to fp32, so each norm keeps its bf16 input (2h)
    and the fp32 copy (4h); Qwen3's per-head q/k norms do the same over a*d and k*d;
  * a gated MLP keeps its input (2h), gate and up outputs (2f each), the activation's output (2f)
    and the product fed to the down projection (2f): 2h + 8f (SiLU and Gemma's tanh GELU alike).

    A = n * (2h + 4h) (norms) + 2h (qkv input) + 2(a*d + 2k*d) (q, k, v) + 2*a*d (o input)
        + 4a (lse) + 2h (MLP input) + 8f  [+ 6(a*d + k*d) with q/k norms]
      = (6n + 4)h + 4*a*d + 4*k*d + 4a + 8f   (16h + ... for two norms)

With gradient checkpointing (Hugging Face checkpoints every decoder layer) only each layer's
input survives (2h per token per layer) and one layer is recomputed at a time (A).

Gemma 2 soft-caps its logits (`final_logit_softcapping`: logits / c, tanh, * c): one more bf16
vocabulary-wide tensor per token, the tanh output autograd keeps (`logits_softcap_bytes`, 2 B).

KV cache (vLLM), bytes per token per GPU = 2 (K and V) * L * max(1, k / TP) * d * dtype bytes;
vLLM replicates KV heads when TP exceeds k, so a GPU never holds less than one head. A layer
with a sliding window (Mistral v0.1: every layer; Gemma 2: every other layer, from the first)
holds at most `window - 1 + max_num_batched_tokens` tokens of a sequence (vLLM 0.24's
`SlidingWindowSpec.max_admission_blocks_per_request`), which is what vLLM's start-up check
(`check_enough_kv_cache_memory`: one max_model_len sequence must fit) sums over layers.
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
class Family:
    """What a model type's decoder layer holds beyond a Llama layer, and the defaults its
    transformers config class gives keys a config.json may leave out."""

    norms_per_layer: int = 2
    qkv_bias: bool = False  # q, k, v biases whatever `attention_bias` says (Qwen2)
    qk_norm: bool = False  # an RMSNorm over each head's query and key (Qwen3)
    tie_embeddings: bool = False
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    sliding_window: int | None = None  # the window when the config has no `sliding_window` key
    sliding_layers: str = "none"  # "none", "all", or "even" (layers 0, 2, 4, ...: Gemma 2)
    logit_softcap: float | None = None  # `final_logit_softcapping` when the config has none


#: The decoder families the planner models, with transformers 5.10's defaults (configuration_*.py).
FAMILIES: dict[str, Family] = {
    "llama": Family(),
    "mistral": Family(sliding_window=4096, sliding_layers="all"),
    "qwen2": Family(qkv_bias=True),
    "qwen3": Family(qk_norm=True, head_dim=128),
    "gemma2": Family(
        norms_per_layer=4,
        tie_embeddings=True,
        head_dim=256,
        sliding_window=4096,
        sliding_layers="even",
        logit_softcap=30.0,
    ),
}


def _sliding(mt: str, fam: Family, cfg: dict[str, Any], layers: int, source: str) -> tuple[int | None, str]:
    """(window, which layers) as vLLM 0.24 lays the KV cache out for this config."""
    if mt in ("qwen2", "qwen3"):
        # transformers gives Qwen's layers from max_window_layers on a window, vLLM every layer or
        # none (qwen2.py asserts max_window_layers == num_hidden_layers): no release enables it.
        if cfg.get("use_sliding_window"):
            raise RecipeError(
                f"{source}: use_sliding_window=true: transformers and vLLM disagree on which layers slide, "
                "so the planner does not model it; set it false (as every released Qwen config does)"
            )
        return None, "none"
    window = cfg.get("sliding_window", fam.sliding_window)
    if window is None:
        return None, "none"
    pattern = fam.sliding_layers
    types = cfg.get("layer_types")
    if isinstance(types, list):
        sliding = [t == "sliding_attention" for t in types[:layers]]
        pattern = "none" if not any(sliding) else "all" if all(sliding) else "even"
        if pattern == "even" and sliding != [i % 2 == 0 for i in range(len(sliding))]:
            raise RecipeError(f"{source}: layer_types mixes windows in a pattern the planner does not model")
    elif pattern == "none":  # a Llama config with a window and no layer_types: vLLM slides every layer
        pattern = "all"
    return (int(window), pattern) if pattern != "none" else (None, "none")


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
    norms_per_layer: int = 2
    qk_norm: bool = False
    sliding_window: int | None = None
    sliding_layers: str = "none"  # "none", "all" or "even" (see Family)
    logit_softcap: bool = False

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_config(cls, cfg: dict[str, Any], source: str = "config.json") -> Arch:
        """Read and check a config.json; a model the planner cannot model raises RecipeError."""
        mt = str(cfg.get("model_type", "")).lower()
        if cfg.get("is_encoder_decoder") or mt in _NOT_DECODER:
            raise RecipeError(
                f"{source}: model_type {mt or '?'!r} is not a decoder-only causal LM; "
                f"the planner models decoder-only LMs ({', '.join(FAMILIES)})"
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
        fam = FAMILIES.get(mt)
        if fam is None:
            raise RecipeError(
                f"{source}: model_type {mt or '?'!r}: the planner models {', '.join(FAMILIES)} decoder layers; "
                "pass the config.json of one of those"
            )
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        kv = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or fam.head_dim or hidden // heads)
        if heads % kv:
            raise RecipeError(f"{source}: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
        attn_bias = bool(cfg.get("attention_bias", False))
        tie = cfg.get("tie_word_embeddings")
        window, sliding = _sliding(mt, fam, cfg, layers, source)
        softcap = cfg.get("final_logit_softcapping", fam.logit_softcap)
        return cls(
            model_type=mt,
            layers=layers,
            hidden=hidden,
            intermediate=int(cfg["intermediate_size"]),
            heads=heads,
            kv_heads=kv,
            head_dim=head_dim,
            vocab=int(cfg["vocab_size"]),
            tie_embeddings=fam.tie_embeddings if tie is None else bool(tie),
            # Qwen2 has biases on q, k and v but not on o; its config does not say so.
            qkv_bias=attn_bias or fam.qkv_bias,
            o_bias=attn_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096),
            norms_per_layer=fam.norms_per_layer,
            qk_norm=fam.qk_norm,
            sliding_window=window,
            sliding_layers=sliding,
            logit_softcap=softcap is not None,
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

    def norm_widths(self) -> list[int]:
        """The width of every norm weight of one decoder layer (h per hidden-state norm, d for
        Qwen3's query and key norms)."""
        return [self.hidden] * self.norms_per_layer + ([self.head_dim] * 2 if self.qk_norm else [])

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
        n = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 3 * h * f + sum(self.norm_widths())
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
        qk_norm = 6 * (self.q_dim + self.kv_dim) if self.qk_norm else 0
        return (6 * self.norms_per_layer + 4) * h + 4 * self.q_dim + 4 * self.kv_dim + 4 * self.heads + 8 * f + qk_norm

    def checkpoint_bytes_per_token_layer(self) -> int:
        """With per-layer checkpointing, only the layer input survives: 2h bytes per token."""
        return 2 * self.hidden

    def eager_attention_bytes(self, seq_len: int) -> int:
        """Eager attention's kept scores per token per layer: fp32 softmax + bf16 copy, 6*a*s."""
        return 6 * self.heads * seq_len

    def forward_transient_bytes_per_token(self) -> int:
        """Peak live bytes per token inside one layer with no autograd (log-prob passes).

        The hidden state and residual (2h each, bf16), the fp32 norm upcast (4h), and the wider of
        the MLP's gate, up and product (3 x 2f) or the attention's q, k, v and output (with q/k
        norms, the fp32 upcast of the queries on top).
        """
        h, f = self.hidden, self.intermediate
        mlp = 3 * 2 * f
        attn = 2 * (2 * self.q_dim + 2 * self.kv_dim) + (4 * self.q_dim if self.qk_norm else 0)
        return 2 * 2 * h + 4 * h + max(mlp, attn)

    @property
    def logits_softcap_bytes(self) -> int:
        """Bytes per (token x vocab) a soft-capped output layer adds to the logits' (module doc)."""
        return 2 if self.logit_softcap else 0

    # ---- KV cache ----------------------------------------------------------------------
    def kv_heads_per_gpu(self, tp: int) -> int:
        return max(1, self.kv_heads // tp)

    def kv_bytes_per_token(self, tp: int = 1, dtype_bytes: int = 2) -> int:
        """vLLM KV cache bytes per token on one GPU of a TP group."""
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes

    @property
    def sliding_layer_count(self) -> int:
        """Layers whose KV cache keeps only the window (vLLM's SlidingWindowSpec)."""
        if self.sliding_window is None or self.sliding_layers == "none":
            return 0
        return self.layers if self.sliding_layers == "all" else (self.layers + 1) // 2

    def kv_bytes_for_sequence(self, tokens: int, tp: int = 1, dtype_bytes: int = 2, batched_tokens: int = 8192) -> int:
        """vLLM's KV bytes for one sequence of `tokens` on one GPU: every token in a full-attention
        layer, at most `window - 1 + batched_tokens` in a sliding-window layer (module docstring)."""
        per_layer_token = 2 * self.kv_heads_per_gpu(tp) * self.head_dim * dtype_bytes
        slide = self.sliding_layer_count
        held = min(tokens, (self.sliding_window or 0) - 1 + batched_tokens) if slide else 0
        return per_layer_token * ((self.layers - slide) * tokens + slide * held)

    def describe(self) -> str:
        extra = [f"head_dim {self.head_dim}"] if self.head_dim != self.hidden // self.heads else []
        if self.tie_embeddings:
            extra.append("tied embeddings")
        if self.sliding_layer_count:
            extra.append(f"{self.sliding_window}-token window on {self.sliding_layer_count} layers")
        return (
            f"{self.model_type}, {self.params() / 1e9:.2f}B params, {self.layers} layers, h={self.hidden}, "
            f"f={self.intermediate}, {self.heads} heads / {self.kv_heads} KV heads, vocab {self.vocab}"
            + "".join(f", {e}" for e in extra)
        )
