"""Kimi K3 ops in plain float64 numpy (docs/MODEL.md#forward-pass).

One function per op, written from the formulas of docs/MODEL.md. All arrays are float64; matrices are
row-major [out][in] (PyTorch nn.Linear layout), y = W x. Shapes use: T tokens, E hidden,
H heads, D head dim, P = H*D, NE experts, K top-k, L latent, I expert inter.
"""
import numpy as np


# --------------------------------------------------- primitives, docs/MODEL.md#primitive-ops

def linear(x, W):
    """y = W x for every row of x.  x [..., in], W [out, in] -> [..., out]."""
    return x @ W.T


def rmsnorm(x, w, eps):
    """docs/MODEL.md#rmsnorm: RMSNorm: eps INSIDE the sqrt; x [..., n], w [n] or None -> [..., n]."""
    inv = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)   # [..., 1]
    y = x * inv
    return y if w is None else y * w


def l2norm(x, eps=1e-6):
    """docs/MODEL.md#l2-norm: L2Norm (KDA q, k): SUM of squares (not mean), eps 1e-6 inside the sqrt."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def situ_glu(g, u, b1, b2):
    """docs/MODEL.md#silu-and-situ-glu: SiTU-GLU: a = b1*tanh(g/b1) * sigmoid(g)  (sigmoid of the UNCAPPED gate),
    u' = b2*tanh(u/b2), y = a*u'.  g, u [..., n] -> [..., n];  |y| <= b1*b2."""
    a = (b1 * np.tanh(g / b1)) * sigmoid(g)
    return a * (b2 * np.tanh(u / b2))


def softmax(s, axis=-1):
    e = np.exp(s - np.max(s, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


# ------------------------------------- attn_res, docs/MODEL.md#attention-residual-attn_res

def attn_res(sources, fold, eps):
    """docs/MODEL.md#attention-residual-attn_res: Block Attention Residual aggregation.
    sources: list of S arrays [T, E] (block snapshots then the running prefix);
    fold [E] = res_norm.weight * res_proj.weight.
    Keys are RMS-normalised sources (no gain), VALUES are the RAW sources."""
    V = np.stack(sources, axis=0)                      # [S, T, E]
    keys = rmsnorm(V, None, eps)                       # [S, T, E]
    scores = keys @ fold                               # [S, T]
    p = softmax(scores, axis=0)                        # [S, T] softmax over sources
    return np.einsum("st,ste->te", p, V)               # [T, E]


# ------------------------------------------------------- dense MLP, docs/MODEL.md#dense-mlp

def dense_mlp(x, w_gate, w_up, w_down, b1, b2):
    """docs/MODEL.md#dense-mlp (also the fused shared expert of
    docs/MODEL.md#moe-aggregation-order).
    x [T, E]; w_gate, w_up [I, E]; w_down [E, I] -> [T, E]."""
    return linear(situ_glu(linear(x, w_gate), linear(x, w_up), b1, b2), w_down)


# -------------------------------------------- KDA, docs/MODEL.md#kimi-delta-attention

def short_conv(x, w, hist):
    """docs/MODEL.md#kda-short-conv: causal depthwise conv with fused SiLU and carried history.
    x [T, C] (pre-conv inputs), w [C, K] taps oldest -> newest (w[:, K-1] hits the current
    input), hist [C, K-1] previous inputs oldest first (zeros at sequence start).
    Returns out [T, C], new hist [C, K-1]."""
    T, C = x.shape
    K = w.shape[1]
    hist = hist.copy()
    out = np.empty((T, C))
    for t in range(T):
        acc = w[:, K - 1] * x[t]                        # current tap first
        for j in range(K - 1):                          # then history oldest -> newest
            acc = acc + w[:, j] * hist[:, j]
        out[t] = silu(acc)
        if K > 1:
            hist[:, :-1] = hist[:, 1:]                  # shift left
            hist[:, K - 2] = x[t]                       # remember the PRE-conv input
    return out, hist


def kda_decay(z, A_log, dt_bias, lower_bound, H, D):
    """docs/MODEL.md#kda-decay. z [T, P] (f_b output, before dt_bias), A_log [>= H] (PER HEAD: only
    the first H values are used), dt_bias [P]. Returns g, alpha [T, H, D]:
    g = lb * sigmoid(exp(A_log[h]) * (z + dt_bias)), alpha = exp(g) in (e^lb, 1]."""
    T = z.shape[0]
    a = np.exp(np.asarray(A_log, dtype=np.float64)[:H])            # [H]
    u = a[None, :, None] * (z + dt_bias).reshape(T, H, D)          # [T, H, D]
    g = lower_bound * sigmoid(u)
    return g, np.exp(g)


def kda_recurrence(q, k, v, alpha, beta, scale, S):
    """docs/MODEL.md#kda-recurrence: naive sequential gated delta rule, per head.
    q, k [T, H, Dk] (already L2-normed; q NOT yet scaled), v [T, H, Dv], alpha [T, H, Dk],
    beta [T, H], S [H, Dk, Dv] initial state. Returns o [T, H, Dv], S_out [H, Dk, Dv].
    Per token: S *= alpha (per key row); u = k^T S; S += (k*beta) (v - u)^T;
    o = (q*scale)^T S  -- output read from the UPDATED state."""
    T, H, _ = q.shape
    S = S.copy()
    o = np.empty(v.shape)
    for t in range(T):
        S = S * alpha[t][:, :, None]                               # decay rows   [H, Dk, Dv]
        u = np.einsum("hi,hij->hj", k[t], S)                       # read         [H, Dv]
        kb = k[t] * beta[t][:, None]                               # [H, Dk]
        S = S + kb[:, :, None] * (v[t] - u)[:, None, :]            # delta write  [H, Dk, Dv]
        o[t] = np.einsum("hi,hij->hj", q[t] * scale, S)            # output       [H, Dv]
    return o, S


def kda_zero_state(H, D, P, K):
    """per-layer carried KDA state: S [H, D, D] + conv histories for q, k, v [P, K-1]."""
    return {"S": np.zeros((H, D, D)),
            "q_hist": np.zeros((P, K - 1)), "k_hist": np.zeros((P, K - 1)),
            "v_hist": np.zeros((P, K - 1))}


def kda_layer(x, w, H, D, lower_bound, eps, state=None):
    """docs/MODEL.md#kimi-delta-attention: whole KDA layer. x [T, E] (already input-layernormed); w: dict with the
    released suffixes (q_proj, k_proj, v_proj, g_proj [P, E]; o_proj [E, P]; q/k/v_conv1d
    [P, 1, K]; f_a_proj [D, E]; f_b_proj [P, D]; b_proj [H, E]; A_log [>=H]; dt_bias [P];
    o_norm [D]). Returns out [T, E], new state."""
    T = x.shape[0]
    P = H * D
    K = w["q_conv1d.weight"].shape[-1]
    if state is None:
        state = kda_zero_state(H, D, P, K)
    # 1. projections
    q = linear(x, w["q_proj.weight"])                               # [T, P]
    k = linear(x, w["k_proj.weight"])                               # [T, P]
    v = linear(x, w["v_proj.weight"])                               # [T, P]
    braw = linear(x, w["b_proj.weight"])                            # [T, H]
    z = linear(linear(x, w["f_a_proj.weight"]), w["f_b_proj.weight"])   # [T, D] -> [T, P]
    # 2. short convs (separate q/k/v, SiLU fused, carried history)
    q, q_hist = short_conv(q, w["q_conv1d.weight"].reshape(P, K), state["q_hist"])
    k, k_hist = short_conv(k, w["k_conv1d.weight"].reshape(P, K), state["k_hist"])
    v, v_hist = short_conv(v, w["v_conv1d.weight"].reshape(P, K), state["v_hist"])
    # 3. per-head L2 norm on q and k only
    q = l2norm(q.reshape(T, H, D))                                  # [T, H, D]
    k = l2norm(k.reshape(T, H, D))                                  # [T, H, D]
    v = v.reshape(T, H, D)                                          # [T, H, D]
    # 4. beta, one scalar per head
    beta = sigmoid(braw)                                            # [T, H]
    # 5. decay
    _, alpha = kda_decay(z, w["A_log"], w["dt_bias"], lower_bound, H, D)   # [T, H, D]
    # 6. recurrence, q scaled by D^-0.5
    o, S = kda_recurrence(q, k, v, alpha, beta, 1.0 / np.sqrt(D), state["S"])   # [T, H, D]
    # 7. head-wise RMSNorm with the shared o_norm gain, 8. full-rank output gate AFTER the norm
    o = rmsnorm(o, w["o_norm.weight"], eps).reshape(T, P)           # [T, P]
    o = o * sigmoid(linear(x, w["g_proj.weight"]))                  # [T, P]
    # 9. output projection
    out = linear(o, w["o_proj.weight"])                             # [T, E]
    return out, {"S": S, "q_hist": q_hist, "k_hist": k_hist, "v_hist": v_hist}


# ------------------------------------------------------- MLA, docs/MODEL.md#gated-mla

def mla_layer(x, w, H, nope, rope, v_dim, kv_lora, eps, out_gate=True, trace=None):
    """docs/MODEL.md#gated-mla: gated MLA, NoPE. x [T, E] (already input-layernormed); w: released suffixes
    q_a_proj [q_lora, E], q_a_layernorm [q_lora], q_b_proj [H*(nope+rope), q_lora],
    kv_a_proj_with_mqa [kv_lora+rope, E], kv_a_layernorm [kv_lora],
    kv_b_proj [H*(nope+v), kv_lora], o_proj [E, H*v], g_proj [H*v, E]. Returns [T, E].
    Causal over the T tokens of the call. `trace` (dict) receives kv_latent and k_rope."""
    T = x.shape[0]
    cq = rmsnorm(linear(x, w["q_a_proj.weight"]), w["q_a_layernorm.weight"], eps)  # [T, q_lora]
    q = linear(cq, w["q_b_proj.weight"]).reshape(T, H, nope + rope)   # [T, H, nope+rope]
    c = linear(x, w["kv_a_proj_with_mqa.weight"])                     # [T, kv_lora+rope]
    latent = rmsnorm(c[:, :kv_lora], w["kv_a_layernorm.weight"], eps)  # norm: latent ONLY
    k_rope = c[:, kv_lora:]                                           # [T, rope], never rotated
    kv = linear(latent, w["kv_b_proj.weight"]).reshape(T, H, nope + v_dim)
    k_nope, v = kv[:, :, :nope], kv[:, :, nope:]                      # [T, H, nope], [T, H, v]
    if trace is not None:
        trace["kv_latent"], trace["k_rope"] = latent, k_rope
    scale = 1.0 / np.sqrt(nope + rope)                                # NOT 1/sqrt(nope)
    # scores[h, p, s]: nope part per head + rope part with the SHARED k_rope row
    sc = (np.einsum("phi,shi->hps", q[:, :, :nope], k_nope)
          + np.einsum("phi,si->hps", q[:, :, nope:], k_rope)) * scale     # [H, T, T]
    mask = np.triu(np.ones((T, T), dtype=bool), k=1)                  # s > p is masked
    sc = np.where(mask[None], -np.inf, sc)
    p = softmax(sc, axis=-1)                                          # [H, T, T]
    o = np.einsum("hps,shj->phj", p, v).reshape(T, H * v_dim)         # [T, H*v]
    if out_gate:  # sigmoid(g_proj x) BEFORE o_proj, no norm
        o = o * sigmoid(linear(x, w["g_proj.weight"]))
    return linear(o, w["o_proj.weight"])                              # [T, E]


# ------------------------------------------------ MoE, docs/MODEL.md#stable-latentmoe

def route(x, gate_w, bias, topk, renorm=True, routed_scale=1.0):
    """docs/MODEL.md#moe-router. x [T, E], gate_w [NE, E], bias [NE].
    Selection by sigmoid(logit) + bias (descending, ties -> lowest index); weights are the
    UNBIASED sigmoid scores of the chosen experts, renormalised, then * routed_scale.
    Returns idx [T, K] int, weights [T, K]."""
    s = sigmoid(linear(x, gate_w))                                    # [T, NE]
    choice = s + bias                                                 # [T, NE]
    idx = np.argsort(-choice, axis=-1, kind="stable")[:, :topk]       # stable: lowest idx on ties
    wts = np.take_along_axis(s, idx, axis=-1)                         # [T, K]
    if renorm and topk > 1:
        wts = wts / (np.sum(wts, axis=-1, keepdims=True) + 1e-20)
    return idx, wts * routed_scale


def latent_moe(x, w, experts, topk, b1, b2, eps, renorm=True, routed_scale=1.0,
               latent_norm=True, parts=None):
    """docs/MODEL.md#stable-latentmoe: Stable LatentMoE. x [T, E] (post-attention-layernormed).
    w: gate.weight [NE, E], gate.e_score_correction_bias [NE], routed_expert_down_proj [L, E],
    routed_expert_norm [L], routed_expert_up_proj [E, L], shared_experts.{gate,up}_proj [SI, E],
    shared_experts.down_proj [E, SI]. experts[e] = (w1 [I, L], w2 [L, I], w3 [I, L]).
    `parts` (dict) receives the routed and shared contributions [T, E]."""
    idx, wts = route(x, w["gate.weight"], w["gate.e_score_correction_bias"], topk,
                     renorm, routed_scale)                            # [T, K] each
    z = linear(x, w["routed_expert_down_proj.weight"])                # [T, L] router saw FULL x
    T = x.shape[0]
    y = np.zeros((T, topk, z.shape[1]))                               # [T, K, L] expert outputs
    for e in np.unique(idx):                                          # each chosen expert once
        w1, w2, w3 = experts[e]                                       # [I, L], [L, I], [I, L]
        t, j = np.nonzero(idx == e)                                   # (token, slot) pairs
        a = situ_glu(linear(z[t], w1), linear(z[t], w3), b1, b2)      # [n, I]
        y[t, j] = linear(a, w2)                                       # [n, L]
    acc = np.zeros_like(z)                                            # [T, L]
    for j in range(topk):                                             # weighted sum, top-k order
        acc += wts[:, j:j + 1] * y[:, j]
    if latent_norm:                                                   # norm on the AGGREGATE
        acc = rmsnorm(acc, w["routed_expert_norm.weight"], eps)
    routed = linear(acc, w["routed_expert_up_proj.weight"])           # [T, E]
    shared = dense_mlp(x, w["shared_experts.gate_proj.weight"], w["shared_experts.up_proj.weight"],
                       w["shared_experts.down_proj.weight"], b1, b2)  # ORIGINAL x, unweighted
    if parts is not None:
        parts.update(routed=routed, shared=shared, acc=acc, idx=idx, wts=wts)
    return routed + shared
