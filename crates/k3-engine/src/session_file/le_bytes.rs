//! The little-endian encoding of a session file's body: writers of counts and float arrays,
//! and a bounds-checked reader whose every error names the file.

use crate::EngineError;

pub(super) fn put_u64(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&(v as u64).to_le_bytes());
}

pub(super) fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    v.iter()
        .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
}

/// A bounds-checked little-endian reader over a checksummed body; `name` (the file) is in
/// every error.
pub(super) struct Reader<'b> {
    pub(super) buf: &'b [u8],
    pub(super) at: usize,
    pub(super) name: &'b str,
}

impl Reader<'_> {
    pub(super) fn take(&mut self, n: usize) -> Result<&[u8], EngineError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                EngineError::Invalid(format!(
                    "session file {}: malformed: {n} bytes needed at offset {} but the body ends at {}",
                    self.name,
                    self.at,
                    self.buf.len()
                ))
            })?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub(super) fn u32(&mut self) -> Result<u32, EngineError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }
    pub(super) fn u64(&mut self) -> Result<u64, EngineError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }
    pub(super) fn usize(&mut self) -> Result<usize, EngineError> {
        let v = self.u64()?;
        usize::try_from(v).map_err(|_| {
            EngineError::Invalid(format!(
                "session file {}: malformed: count {v} at offset {} does not fit this machine",
                self.name,
                self.at - 8
            ))
        })
    }
    pub(super) fn f32s(&mut self, n: usize) -> Result<Vec<f32>, EngineError> {
        let bytes = self.take(n.saturating_mul(4))?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
    /// A length-prefixed float array that must have exactly `dst.len()` values.
    pub(super) fn fill(&mut self, dst: &mut [f32], what: &str) -> Result<(), EngineError> {
        let n = self.usize()?;
        if n != dst.len() {
            return Err(EngineError::Invalid(format!(
                "session file {}: {what} has {n} values; this model's has {}",
                self.name,
                dst.len()
            )));
        }
        self.fill_exact(dst, what)
    }
    pub(super) fn fill_exact(&mut self, dst: &mut [f32], _what: &str) -> Result<(), EngineError> {
        let bytes = self.take(dst.len().saturating_mul(4))?;
        for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }
}
