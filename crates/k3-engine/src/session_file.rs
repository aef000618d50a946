//! Sessions on disk: save a [`Session`] (tokens, position, KDA state, latent KV) and load it
//! back so that continuing it is bit-identical to never having stopped.
//!
//! # Format (version 1, all integers and floats little-endian)
//! ```text
//! offset 0   magic        "K3SS"
//!        4   version      u32 = 1
//!        8   fingerprint  u64   Engine::fingerprint() of the model (and numeric mode) that
//!                                  wrote it
//!       16   body_len     u64   bytes from offset 24 up to the checksum
//!       24   body:
//!              max_ctx    u64   context of the saving session (informational)
//!              pos        u64   tokens already run through the model
//!              n_tokens   u64, then n_tokens × u32   fed ids, then the pending id if any
//!                                                    (n_tokens is pos or pos + 1)
//!              n_logits   u64, then n_logits × f32   0, or vocab_size logits after the last
//!                                                    fed token (so `generate` can go on)
//!              n_kda      u32, per KDA layer: len u64 + recurrent [H][D][D] f32,
//!                                             len u64 + conv history [3][P][K−1] f32
//!              n_mla      u32, row_width u32, per MLA layer: pos × row_width f32 latent rows
//!   24+body_len checksum  u64   xxh3-64 of every byte before it
//! ```
//! Loading refuses, with [`EngineError::Invalid`] (exit code 2): a wrong magic, another
//! version, a truncated or over-long file, a bad checksum, another model's (or numeric mode's)
//! fingerprint, and a `max_ctx` smaller than the saved tokens. Files are written atomically
//! (temp file + rename).
//!
//! Over ranks (docs/DISTRIBUTED.md#the-seam) the file is the same one-process file: saving
//! gathers every rank's KDA heads (a collective, every rank calls it; rank 0 writes), loading
//! keeps each rank's own heads, so a file moves freely between any numbers of ranks.

use crate::{Engine, EngineError, Session};
use k3_format::{ModelBinding, TensorRef};
use std::io::Write;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

mod le_bytes;

use le_bytes::{put_f32s, put_u64, Reader};

/// First four bytes of a session file.
pub const SESSION_MAGIC: &[u8; 4] = b"K3SS";
/// The session-file format version this build reads and writes.
pub const SESSION_VERSION: u32 = 1;
/// Bytes before the body: magic, version, fingerprint, body length.
const HEADER_LEN: usize = 24;

/// What a saved (or loaded) session holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionInfo {
    /// Size of the encoded session in bytes.
    pub bytes: u64,
    /// Token ids of the conversation (fed, plus the pending generated one).
    pub tokens: usize,
    /// Positions already run through the model: the prefill a load saves.
    pub prefill_tokens_saved: usize,
    /// The model fingerprint recorded in the file.
    pub fingerprint: u64,
}

/// Writes `bytes` to `path` atomically: a temp file beside it, fsync, rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), EngineError> {
    let io = |source| EngineError::Io {
        path: path.to_path_buf(),
        source,
    };
    let name = path
        .file_name()
        .ok_or_else(|| EngineError::Invalid(format!("{}: not a file path", path.display())))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp: PathBuf = path.with_file_name(tmp_name);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Feeds every tensor reference of the binding (names, dtypes, shapes) to `f`.
fn each_tensor(b: &ModelBinding, mut f: impl FnMut(&TensorRef)) {
    let g = &b.globals;
    [
        &g.embed_tokens,
        &g.norm,
        &g.output_attn_res_norm,
        &g.output_attn_res_proj,
        &g.lm_head,
    ]
    .into_iter()
    .for_each(&mut f);
    for l in &b.layers {
        [
            &l.input_layernorm,
            &l.post_attention_layernorm,
            &l.self_attention_res_norm,
            &l.self_attention_res_proj,
            &l.mlp_res_norm,
            &l.mlp_res_proj,
        ]
        .into_iter()
        .for_each(&mut f);
        match &l.attn {
            k3_format::bind::AttnTensors::Kda(k) => [
                &k.q_proj,
                &k.k_proj,
                &k.v_proj,
                &k.g_proj,
                &k.o_proj,
                &k.q_conv1d,
                &k.k_conv1d,
                &k.v_conv1d,
                &k.f_a_proj,
                &k.f_b_proj,
                &k.b_proj,
                &k.a_log,
                &k.dt_bias,
                &k.o_norm,
            ]
            .into_iter()
            .for_each(&mut f),
            k3_format::bind::AttnTensors::Mla(m) => {
                [
                    &m.q_a_proj,
                    &m.q_a_layernorm,
                    &m.q_b_proj,
                    &m.kv_a_proj_with_mqa,
                    &m.kv_a_layernorm,
                    &m.kv_b_proj,
                    &m.o_proj,
                ]
                .into_iter()
                .for_each(&mut f);
                m.g_proj.iter().for_each(&mut f);
            }
        }
        match &l.ffn {
            k3_format::bind::FfnTensors::Dense(d) => [&d.gate_proj, &d.up_proj, &d.down_proj]
                .into_iter()
                .for_each(&mut f),
            k3_format::bind::FfnTensors::Moe(m) => [
                &m.gate,
                &m.e_score_correction_bias,
                &m.routed_expert_down_proj,
                &m.routed_expert_norm,
                &m.routed_expert_up_proj,
                &m.shared_gate_proj,
                &m.shared_up_proj,
                &m.shared_down_proj,
            ]
            .into_iter()
            .for_each(&mut f),
        }
    }
}

impl Engine {
    /// A 64-bit fingerprint of the model's shape: the config's shape-determining fields, the
    /// vocabulary size, and every bound tensor's name, dtype and shape (plus the routed experts'
    /// shapes), and the numeric mode in use (`--numerics`, docs/NUMERICS.md#numeric-mode-fast),
    /// since modes give different logits: [`Engine::fingerprint_in`] the current mode. Two
    /// checkpoints with the same architecture but different weights share it.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint_in(k3_kernels::fast::numerics())
    }

    /// [`Engine::fingerprint`] under numeric mode `mode`. Contract v2 adds nothing to the shape
    /// fingerprint, so files saved before numeric modes existed still load.
    pub fn fingerprint_in(&self, mode: k3_kernels::fast::Numerics) -> u64 {
        let c = &self.config;
        let mut h = Xxh3::new();
        h.update(b"k3-model-fingerprint-v1\0");
        let ints = [
            c.hidden_size,
            c.num_hidden_layers,
            c.vocab_size,
            c.kda_num_heads,
            c.kda_head_dim,
            c.short_conv_kernel_size,
            c.num_attention_heads,
            c.q_lora_rank,
            c.kv_lora_rank,
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
            usize::from(c.mla_use_output_gate),
            c.num_experts,
            c.num_experts_per_token,
            c.num_shared_experts,
            c.routed_expert_hidden_size,
            c.moe_intermediate_size,
            c.first_k_dense_replace,
            c.intermediate_size,
            c.attn_res_block_size,
            c.full_attn_layers.len(),
        ];
        ints.iter()
            .chain(&c.full_attn_layers)
            .for_each(|v| h.update(&(*v as u64).to_le_bytes()));
        let binding = match &self.stores {
            crate::Stores::Resident(s) => s.binding(),
            crate::Stores::Streaming(s) => s.binding(),
        };
        each_tensor(binding, |t| {
            h.update(t.name.as_bytes());
            h.update(format!("\0{:?}\0", t.dtype).as_bytes());
            h.update(&(t.shape.len() as u64).to_le_bytes());
            t.shape
                .iter()
                .for_each(|d| h.update(&(*d as u64).to_le_bytes()));
        });
        if let Ok(loc) = binding.expert(c.first_k_dense_replace, 0) {
            loc.shapes
                .iter()
                .flatten()
                .for_each(|d| h.update(&(*d as u64).to_le_bytes()));
        }
        if mode.code() != 0 {
            h.update(b"\0numerics\0");
            h.update(&[mode.code()]);
        }
        h.digest()
    }

    /// Loads a session saved by [`Session::save`] into a new session of `max_ctx` positions.
    /// Continuing it gives bit-identical logits to the uninterrupted conversation.
    pub fn load_session(&self, path: &Path, max_ctx: usize) -> Result<Session<'_>, EngineError> {
        self.load_session_with_info(path, max_ctx).map(|(s, _)| s)
    }

    /// [`Engine::load_session`], also returning what the file held.
    pub fn load_session_with_info(
        &self,
        path: &Path,
        max_ctx: usize,
    ) -> Result<(Session<'_>, SessionInfo), EngineError> {
        let bytes = std::fs::read(path).map_err(|source| EngineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        self.decode_session(&bytes, max_ctx, &path.display().to_string())
    }

    /// Restores a session from [`Session::to_bytes`] output (see [`Engine::load_session`]).
    pub fn session_from_bytes(
        &self,
        bytes: &[u8],
        max_ctx: usize,
    ) -> Result<Session<'_>, EngineError> {
        self.decode_session(bytes, max_ctx, "session bytes")
            .map(|(s, _)| s)
    }

    fn decode_session(
        &self,
        bytes: &[u8],
        max_ctx: usize,
        name: &str,
    ) -> Result<(Session<'_>, SessionInfo), EngineError> {
        let bad = |what: String| EngineError::Invalid(format!("session file {name}: {what}"));
        let fingerprint = check_envelope(bytes, name)?;
        let ours = self.fingerprint();
        if fingerprint != ours {
            return Err(bad(format!(
                "saved by another model or numeric mode (fingerprint {fingerprint:016x}, this model under --numerics {} is {ours:016x}): load it with the model and numeric mode that wrote it",
                k3_kernels::fast::numerics().name()
            )));
        }
        let end = bytes.len() - 8;
        let mut r = Reader {
            buf: &bytes[..end],
            at: HEADER_LEN,
            name,
        };
        let saved = self.read_tokens(&mut r, max_ctx)?;
        let mut session = self.new_session(max_ctx)?;
        self.read_state(&mut r, &mut session, saved.pos)?;
        if r.at != end {
            return Err(bad(format!("{} unread bytes after the state", end - r.at)));
        }
        let state = session.state_mut();
        state.set_pos(saved.pos).map_err(|e| bad(e.to_string()))?;
        let n_tokens = saved.tokens.len();
        let mut fed = saved.tokens;
        let pending = if n_tokens > saved.pos {
            fed.pop()
        } else {
            None
        };
        session.restore(fed, pending, saved.logits);
        let info = SessionInfo {
            bytes: bytes.len() as u64,
            tokens: n_tokens,
            prefill_tokens_saved: saved.pos,
            fingerprint,
        };
        Ok((session, info))
    }

    /// The saved position, tokens and logits, checked against the model and `max_ctx`.
    fn read_tokens(&self, r: &mut Reader<'_>, max_ctx: usize) -> Result<SavedTokens, EngineError> {
        let name = r.name;
        let bad = |what: String| EngineError::Invalid(format!("session file {name}: {what}"));
        let (_saved_ctx, pos) = (r.u64()?, r.usize()?);
        let n_tokens = r.usize()?;
        if n_tokens != pos && Some(n_tokens) != pos.checked_add(1) {
            return Err(bad(format!("{n_tokens} tokens for position {pos}")));
        }
        if max_ctx < n_tokens {
            return Err(bad(format!(
                "the saved session holds {n_tokens} tokens (position {pos}) but the new session has room for {max_ctx}: raise --ctx"
            )));
        }
        let tokens = (0..n_tokens)
            .map(|_| r.u32())
            .collect::<Result<Vec<u32>, _>>()?;
        let vocab = self.config.vocab_size;
        if let Some(id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(bad(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            )));
        }
        let n_logits = r.usize()?;
        if n_logits != 0 && n_logits != vocab {
            return Err(bad(format!("{n_logits} logits; expected 0 or {vocab}")));
        }
        let logits = r.f32s(n_logits)?;
        Ok(SavedTokens {
            pos,
            tokens,
            logits,
        })
    }

    /// Every KDA layer's recurrent state and conv history, then every MLA layer's latent rows
    /// up to `pos`, into `session`.
    fn read_state(
        &self,
        r: &mut Reader<'_>,
        session: &mut Session<'_>,
        pos: usize,
    ) -> Result<(), EngineError> {
        let name = r.name;
        let bad = |what: String| EngineError::Invalid(format!("session file {name}: {what}"));
        let state = session.state_mut();
        let n_kda = r.u32()? as usize;
        if n_kda != state.kda_states().len() {
            return Err(bad(format!(
                "{n_kda} KDA layers; the model has {}",
                state.kda_states().len()
            )));
        }
        // the file holds every head (the one-process layout); a rank keeps its own heads
        // (docs/DISTRIBUTED.md#the-seam)
        let d = self.model.dims();
        let heads = state.kda_heads();
        let mut whole = k3_model::KdaState::new(d.kda_heads, d.kda_dim, d.conv_k);
        for (i, k) in state.kda_states_mut().iter_mut().enumerate() {
            r.fill(
                whole.recurrent_mut(),
                &format!("KDA layer {i} recurrent state"),
            )?;
            r.fill(whole.conv_mut(), &format!("KDA layer {i} conv history"))?;
            k.load_heads(whole.recurrent(), whole.conv(), heads.clone(), d.kda_dim)?;
        }
        let (n_mla, width) = (r.u32()? as usize, r.u32()? as usize);
        if n_mla != state.mla_caches().len() {
            return Err(bad(format!(
                "{n_mla} MLA layers; the model has {}",
                state.mla_caches().len()
            )));
        }
        for (i, m) in state.mla_caches_mut().iter_mut().enumerate() {
            if width != m.row_width() {
                return Err(bad(format!(
                    "MLA rows of {width} floats; the model's are {}",
                    m.row_width()
                )));
            }
            r.fill_exact(m.rows_mut(pos), &format!("MLA layer {i} latent rows"))?;
        }
        Ok(())
    }
}

/// What a session file saved before its state.
struct SavedTokens {
    pos: usize,
    tokens: Vec<u32>,
    logits: Vec<f32>,
}

/// Checks the magic, version, length and checksum of a session file; its model fingerprint.
fn check_envelope(bytes: &[u8], name: &str) -> Result<u64, EngineError> {
    let bad = |what: String| EngineError::Invalid(format!("session file {name}: {what}"));
    if bytes.len() >= 4 && &bytes[..4] != SESSION_MAGIC {
        return Err(bad(format!(
            "not a k3 session file (magic {:?}, expected \"K3SS\")",
            String::from_utf8_lossy(&bytes[..4])
        )));
    }
    if bytes.len() < HEADER_LEN + 8 {
        return Err(bad(format!(
            "truncated: {} bytes, shorter than the {}-byte header",
            bytes.len(),
            HEADER_LEN + 8
        )));
    }
    let mut r = Reader {
        buf: bytes,
        at: 4,
        name,
    };
    let version = r.u32()?;
    if version != SESSION_VERSION {
        return Err(bad(format!(
            "format version {version}; this build reads version {SESSION_VERSION}"
        )));
    }
    let fingerprint = r.u64()?;
    let body_len = r.u64()?;
    let expected = (HEADER_LEN as u64)
        .checked_add(body_len)
        .and_then(|n| n.checked_add(8));
    match expected {
        Some(n) if n == bytes.len() as u64 => {}
        Some(n) if n > bytes.len() as u64 => {
            return Err(bad(format!(
                "truncated: {} bytes, the header says {n}",
                bytes.len()
            )))
        }
        _ => {
            return Err(bad(format!(
                "damaged: {} bytes, the header says {expected:?}",
                bytes.len()
            )))
        }
    }
    let end = bytes.len() - 8;
    let mut stored = [0u8; 8];
    stored.copy_from_slice(&bytes[end..]);
    if xxh3_64(&bytes[..end]) != u64::from_le_bytes(stored) {
        return Err(bad("bad checksum: the file is damaged".into()));
    }
    Ok(fingerprint)
}

impl Session<'_> {
    /// Encodes the session (see the module docs for the layout). Refuses a session whose last
    /// forward failed half-way (its state is unsound).
    ///
    /// Over ranks the bytes are the one-process file (every KDA head), gathered from every
    /// rank's heads: **a collective** — every rank must call it for the same session at the
    /// same point (docs/DISTRIBUTED.md#the-seam). Every rank gets the same bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, EngineError> {
        let state = self.state();
        if state.is_poisoned() {
            return Err(EngineError::Invalid(
                "the session's last forward failed: reset it before saving".into(),
            ));
        }
        let kda = self.owner().model.gather_kda_states(state)?;
        let (pos, tokens, logits) = (state.pos(), self.tokens(), self.logits());
        let floats: usize = kda
            .iter()
            .map(|k| k.recurrent().len() + k.conv().len())
            .sum::<usize>()
            + state
                .mla_caches()
                .iter()
                .map(|m| pos * m.row_width())
                .sum::<usize>()
            + logits.len();
        let mut out =
            Vec::with_capacity(HEADER_LEN + 64 + 4 * (tokens.len() + floats) + 16 * kda.len());
        out.extend_from_slice(SESSION_MAGIC);
        out.extend_from_slice(&SESSION_VERSION.to_le_bytes());
        out.extend_from_slice(&self.owner().fingerprint().to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes()); // body_len, patched below
        put_u64(&mut out, state.max_ctx());
        put_u64(&mut out, pos);
        put_u64(&mut out, tokens.len());
        tokens
            .iter()
            .for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
        put_u64(&mut out, logits.len());
        put_f32s(&mut out, logits);
        out.extend_from_slice(&(kda.len() as u32).to_le_bytes());
        for k in &kda {
            put_u64(&mut out, k.recurrent().len());
            put_f32s(&mut out, k.recurrent());
            put_u64(&mut out, k.conv().len());
            put_f32s(&mut out, k.conv());
        }
        let width = state.mla_caches().first().map_or(0, |m| m.row_width());
        out.extend_from_slice(&(state.mla_caches().len() as u32).to_le_bytes());
        out.extend_from_slice(&(width as u32).to_le_bytes());
        for m in state.mla_caches() {
            put_f32s(&mut out, m.rows(pos));
        }
        let body_len = (out.len() - HEADER_LEN) as u64;
        out[16..24].copy_from_slice(&body_len.to_le_bytes());
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Saves the session to `path` atomically (temp file + rename). Over ranks every rank
    /// calls it (the state is gathered, [`Session::to_bytes`]) and rank 0 writes the file.
    pub fn save(&self, path: &Path) -> Result<SessionInfo, EngineError> {
        let bytes = self.to_bytes()?;
        if self.owner().model.comm().rank() == 0 {
            write_atomic(path, &bytes)?;
        }
        Ok(SessionInfo {
            bytes: bytes.len() as u64,
            tokens: self.tokens().len(),
            prefill_tokens_saved: self.state().pos(),
            fingerprint: self.owner().fingerprint(),
        })
    }
}
