//! The BPE rank table: token bytes in one arena, an open-addressing hash index over it (no
//! per-token allocation, so a 200k-rank file loads in milliseconds), and direct tables for
//! single bytes and byte pairs (the hottest lookups of rank-BPE).

/// Token byte strings by rank, and lookup from bytes to rank.
#[derive(Debug, Clone)]
pub(crate) struct Ranks {
    /// All token bytes, concatenated in rank order.
    arena: Vec<u8>,
    /// `rank -> arena range`: `offsets[r]..offsets[r + 1]`.
    offsets: Vec<u32>,
    /// Open addressing, linear probing: `(hash >> 32) << 32 | rank`, `EMPTY` when free.
    slots: Vec<u64>,
    /// Rank of each single byte (`u32::MAX` when absent).
    byte_rank: Vec<u32>,
    /// Rank of each two-byte token, indexed by `b0 << 8 | b1` (`u32::MAX` when absent).
    pair_rank: Vec<u32>,
}

const EMPTY: u64 = u64::MAX;

/// A fast non-cryptographic hash of a byte string (multiply-rotate over 8-byte words).
#[inline]
fn hash(bytes: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (bytes.len() as u64).wrapping_mul(K);
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    h ^ (h >> 29)
}

impl Ranks {
    /// Builds the table from an arena holding the tokens in rank order and the `n + 1`
    /// offsets delimiting them. A repeated byte string fails with `(second rank, first rank)`.
    pub(crate) fn from_arena(arena: Vec<u8>, offsets: Vec<u32>) -> Result<Ranks, (u32, u32)> {
        let n = offsets.len().saturating_sub(1);
        let capacity = (n * 2).next_power_of_two().max(16);
        let mut ranks = Ranks {
            arena,
            offsets,
            slots: vec![EMPTY; capacity],
            byte_rank: vec![u32::MAX; 256],
            pair_rank: vec![u32::MAX; 1 << 16],
        };
        for rank in 0..n as u32 {
            ranks.insert(rank)?;
        }
        Ok(ranks)
    }

    /// Builds the table from separate token byte strings in rank order.
    pub(crate) fn from_tokens(tokens: &[Vec<u8>]) -> Result<Ranks, (u32, u32)> {
        let mut arena = Vec::with_capacity(tokens.iter().map(Vec::len).sum());
        let mut offsets = Vec::with_capacity(tokens.len() + 1);
        offsets.push(0);
        for t in tokens {
            arena.extend_from_slice(t);
            offsets.push(arena.len() as u32);
        }
        Ranks::from_arena(arena, offsets)
    }

    fn insert(&mut self, rank: u32) -> Result<(), (u32, u32)> {
        let bytes = self.bytes_unchecked(rank);
        let h = hash(bytes);
        match *bytes {
            [b] => self.byte_rank[b as usize] = rank,
            [b0, b1] => self.pair_rank[(b0 as usize) << 8 | b1 as usize] = rank,
            _ => {}
        }
        let mask = self.slots.len() - 1;
        let mut i = (h as usize) & mask;
        loop {
            let slot = self.slots[i];
            if slot == EMPTY {
                self.slots[i] = (h & 0xFFFF_FFFF_0000_0000) | u64::from(rank);
                return Ok(());
            }
            let other = slot as u32;
            if slot >> 32 == h >> 32 && self.bytes_unchecked(other) == self.bytes_unchecked(rank) {
                return Err((rank, other));
            }
            i = (i + 1) & mask;
        }
    }

    /// Number of ranks.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    #[inline]
    fn bytes_unchecked(&self, rank: u32) -> &[u8] {
        let r = rank as usize;
        &self.arena[self.offsets[r] as usize..self.offsets[r + 1] as usize]
    }

    /// Bytes of `rank`, if it is one.
    pub(crate) fn bytes(&self, rank: u32) -> Option<&[u8]> {
        ((rank as usize) < self.len()).then(|| self.bytes_unchecked(rank))
    }

    /// Rank of a byte string, if it is a token.
    #[inline]
    pub(crate) fn rank(&self, bytes: &[u8]) -> Option<u32> {
        match *bytes {
            [b] => return Some(self.byte_rank[b as usize]).filter(|&r| r != u32::MAX),
            [b0, b1] => return self.pair(b0, b1),
            _ => {}
        }
        let h = hash(bytes);
        let mask = self.slots.len() - 1;
        let mut i = (h as usize) & mask;
        loop {
            let slot = self.slots[i];
            if slot == EMPTY {
                return None;
            }
            if slot >> 32 == h >> 32 && self.bytes_unchecked(slot as u32) == bytes {
                return Some(slot as u32);
            }
            i = (i + 1) & mask;
        }
    }

    /// Rank of the single byte `b` (`u32::MAX` when absent; loading rejects that).
    #[inline]
    pub(crate) fn byte(&self, b: u8) -> u32 {
        self.byte_rank[b as usize]
    }

    /// Rank of the two-byte token `b0 b1`.
    #[inline]
    pub(crate) fn pair(&self, b0: u8, b1: u8) -> Option<u32> {
        Some(self.pair_rank[(b0 as usize) << 8 | b1 as usize]).filter(|&r| r != u32::MAX)
    }
}
