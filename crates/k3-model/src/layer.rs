//! One decoder layer (docs/MODEL.md#decoder-layer): block attention residuals around the token mixer and the FFN.
//!
//! ```text
//! prefix = h
//! if n_blocks > 0: h = mix([blocks, prefix], fold_attn)      (guard only here)
//! if l % block == 0: blocks[n_blocks++] = prefix; prefix = NONE
//! a = attn(rmsnorm(h, input_norm));  prefix = NONE ? a : prefix + a
//! h = mix([blocks, prefix], fold_mlp)                          (no guard)
//! prefix += ffn(rmsnorm(h, post_attention_norm));  return prefix
//! ```

use crate::dense::dense_forward;
use crate::dims::Dims;
use crate::error::{check_len, ModelError};
use crate::kda::kda_forward_batch;
use crate::mla::mla_forward_batch;
use crate::moe::moe_forward;
use crate::pass::{Pass, ROWS_PER_JOB};
use crate::residual::{fold, mix};
use crate::scratch::LayerScratch;
use crate::weights::{AttnWeights, ChannelWeights, FfnWeights, LayerWeights, MixerWeights};
use k3_kernels::norm::rmsnorm;
use rayon::prelude::*;

pub use crate::state::AttnState;

/// The residual stream of one call: `h` `[T][E]` and the per-token block stack `blocks`
/// `[T][max_blocks][E]` holding `n_blocks` snapshots.
pub struct Residual<'a> {
    /// `[T][E]` layer input on entry, layer output (`prefix`) on return.
    pub h: &'a mut [f32],
    /// `[T][max_blocks][E]` block snapshots.
    pub blocks: &'a mut [f32],
    /// Snapshots held (same for every token).
    pub n_blocks: usize,
}

fn check_norms(d: &Dims, l: usize, norms: [(&'static str, &[f32]); 3]) -> Result<(), ModelError> {
    for (what, v) in norms {
        check_len(Some(l), what, v.len(), d.hidden)?;
    }
    Ok(())
}

fn check_mixer(d: &Dims, w: &MixerWeights, l: usize) -> Result<(), ModelError> {
    check_norms(
        d,
        l,
        [
            ("input_layernorm", w.input_norm),
            ("self_attention_res_norm", w.attn_res_norm),
            ("self_attention_res_proj", w.attn_res_proj),
        ],
    )
}

fn check_channel(d: &Dims, w: &ChannelWeights, l: usize) -> Result<(), ModelError> {
    check_norms(
        d,
        l,
        [
            ("post_attention_layernorm", w.post_attn_norm),
            ("mlp_res_norm", w.mlp_res_norm),
            ("mlp_res_proj", w.mlp_res_proj),
        ],
    )?;
    let dense = matches!(w.ffn, FfnWeights::Dense(_));
    if dense != d.dense.get(l).copied().unwrap_or(false) {
        let kind = |b: bool| if b { "dense MLP" } else { "MoE" }.to_string();
        let (got, want) = (kind(dense), kind(!dense));
        return Err(ModelError::Shape {
            layer: Some(l),
            what: "feed-forward kind",
            got,
            want,
        });
    }
    Ok(())
}

/// Mixes every token of `s` into `out`: sources `[blocks[t][0..n), src[t]]`; tokens in
/// parallel (each token's mix is computed alone, so the bits are thread-count-free).
fn mix_tokens(
    d: &Dims,
    out: &mut [f32],
    blocks: &[f32],
    n: usize,
    src: &[f32],
    fold: &[f32],
    t: usize,
) {
    let (e, bs) = (d.hidden, d.max_blocks * d.hidden);
    out[..t * e]
        .par_chunks_mut(e)
        .enumerate()
        .with_max_len(ROWS_PER_JOB)
        .for_each(|(tok, o)| {
            let r = tok * e..(tok + 1) * e;
            mix(
                o,
                &blocks[tok * bs..(tok + 1) * bs],
                n,
                &src[r],
                fold,
                d.eps,
            );
        });
}

/// RMSNorm of every token of `x` into `y` (`[T][E]`), tokens in parallel.
fn norm_tokens(d: &Dims, y: &mut [f32], x: &[f32], w: &[f32], t: usize) {
    let e = d.hidden;
    y[..t * e]
        .par_chunks_mut(e)
        .zip(x[..t * e].par_chunks(e))
        .with_max_len(ROWS_PER_JOB)
        .for_each(|(y, x)| rmsnorm(y, x, w, d.eps));
}

/// Runs decoder layer `l` over the residual stream `res` (docs/MODEL.md#decoder-layer).
pub fn decoder_layer(
    pass: &Pass<'_>,
    l: usize,
    w: &LayerWeights,
    res: &mut Residual<'_>,
    attn: AttnState<'_>,
    sc: &mut LayerScratch,
) -> Result<(), ModelError> {
    let one = Pass {
        batch: &[],
        ..*pass
    };
    decoder_layer_batch(&one, l, w, res, &mut [attn], sc)
}

/// [`decoder_layer`] over every sequence of `pass` (`attn[i]` carries `pass.seq(i)`): all
/// row-wise work runs over the batch's rows at once, the token mixer's carried part per
/// sequence.
pub fn decoder_layer_batch(
    pass: &Pass<'_>,
    l: usize,
    w: &LayerWeights,
    res: &mut Residual<'_>,
    attn: &mut [AttnState<'_>],
    sc: &mut LayerScratch,
) -> Result<(), ModelError> {
    let (mixer, channel) = w.halves();
    mixer_half(pass, l, &mixer, res, attn, sc)?;
    channel_half(pass, l, &channel, res, sc)
}

/// The first half of layer `l`: first aggregation, block boundary, token mixer. Leaves the
/// running residual in `sc.prefix` for [`channel_half`]; reads only the mixer's weights.
pub fn mixer_half(
    pass: &Pass<'_>,
    l: usize,
    w: &MixerWeights,
    res: &mut Residual<'_>,
    attn: &mut [AttnState<'_>],
    sc: &mut LayerScratch,
) -> Result<(), ModelError> {
    let (d, t) = (pass.d, pass.t);
    check_mixer(d, w, l)?;
    let (e, bs) = (d.hidden, d.max_blocks * d.hidden);
    sc.ensure(d, t);
    let te = t * e;
    let h = &mut res.h[..te];
    let prefix = &mut sc.prefix[..te];
    prefix.copy_from_slice(h);
    // first aggregation, skipped while the stack is empty
    if res.n_blocks > 0 {
        fold(&mut sc.fold, w.attn_res_norm, w.attn_res_proj);
        mix_tokens(d, h, res.blocks, res.n_blocks, prefix, &sc.fold, t);
    }
    // block boundary: snapshot the running residual, then clear it
    let cleared = d.is_boundary(l);
    if cleared {
        let n = res.n_blocks;
        for tok in 0..t {
            res.blocks[tok * bs + n * e..tok * bs + (n + 1) * e]
                .copy_from_slice(&prefix[tok * e..(tok + 1) * e]);
        }
        res.n_blocks += 1;
    }
    // token mixer
    norm_tokens(d, &mut sc.xn, h, w.input_norm, t);
    let (xn, y) = (&sc.xn[..te], &mut sc.y[..te]);
    match &w.attn {
        AttnWeights::Kda(kw) => kda_forward_batch(pass, l, kw, xn, attn, y, &mut sc.kda)?,
        AttnWeights::Mla(mw) => mla_forward_batch(pass, l, mw, xn, attn, y, &mut sc.mla)?,
    }
    if cleared {
        prefix.copy_from_slice(y);
    } else {
        prefix.iter_mut().zip(y.iter()).for_each(|(p, &a)| *p += a);
    }
    Ok(())
}

/// The second half of layer `l` after [`mixer_half`]: second aggregation, channel mixer;
/// leaves the layer's output in `res.h`. Reads only the channel mixer's weights.
pub fn channel_half(
    pass: &Pass<'_>,
    l: usize,
    w: &ChannelWeights,
    res: &mut Residual<'_>,
    sc: &mut LayerScratch,
) -> Result<(), ModelError> {
    let (d, t) = (pass.d, pass.t);
    check_channel(d, w, l)?;
    let te = t * d.hidden;
    let h = &mut res.h[..te];
    let prefix = &mut sc.prefix[..te];
    // second aggregation, no guard
    fold(&mut sc.fold, w.mlp_res_norm, w.mlp_res_proj);
    mix_tokens(d, h, res.blocks, res.n_blocks, prefix, &sc.fold, t);
    // channel mixer
    norm_tokens(d, &mut sc.xn, h, w.post_attn_norm, t);
    let (xn, y) = (&sc.xn[..te], &mut sc.y[..te]);
    match &w.ffn {
        FfnWeights::Dense(dw) => dense_forward(pass, l, dw, xn, y, &mut sc.dense)?,
        FfnWeights::Moe(mw) => moe_forward(pass, l, mw, xn, y, &mut sc.moe)?,
    }
    prefix.iter_mut().zip(y.iter()).for_each(|(p, &m)| *p += m);
    h.copy_from_slice(prefix);
    Ok(())
}
