//! Whether a compressed trunk pack pays on this machine (docs/PERFORMANCE.md#trunk-compression):
//! the disk reads the STORED bytes, the cores decode them into the bytes the slots hold.

use super::table::fmt_bytes;

/// A compressed pack and the machine reading it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecRates {
    /// Stored ÷ decoded bytes of the pack (0.667 measured on trained-like BF16 weights).
    pub stored_ratio: f64,
    /// The drive's O_DIRECT read rate, bytes/s.
    pub disk_bytes_per_s: f64,
    /// Decoded bytes one core produces per second.
    pub decode_bytes_per_s_per_core: f64,
    /// Cores decoding.
    pub decoding_cores: usize,
    /// Trunk bytes one core runs the forward pass's mat-vecs through per second (0: not
    /// counted). Decoding and the forward pass share the same cores, so a compressed pack's
    /// decode adds to the compute its reads must hide.
    pub compute_bytes_per_s_per_core: f64,
    /// True when the next run's read overlaps the current run's decode (a second staging
    /// buffer); false when a run is read, then decoded.
    pub overlapped: bool,
}

/// Seconds per token to stream `decoded_bytes` of trunk, plain and compressed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecForecast {
    /// Decoded (held) bytes per token.
    pub decoded_bytes: u64,
    /// Stored bytes the disk reads per token from the compressed pack.
    pub stored_bytes: u64,
    /// Seconds per token reading a plain pack.
    pub plain_s: f64,
    /// Seconds per token reading and decoding the compressed pack.
    pub compressed_s: f64,
    /// Seconds per token of decoding alone.
    pub decode_s: f64,
}

impl CodecRates {
    /// Seconds of the forward pass's mat-vecs over `d` trunk bytes on the decoding cores
    /// (`C = D / (k·T)`; 0 when not counted).
    fn compute_s(&self, d: f64) -> f64 {
        match self.compute_bytes_per_s_per_core > 0.0 {
            true => d / (self.compute_bytes_per_s_per_core * self.decoding_cores.max(1) as f64),
            false => 0.0,
        }
    }

    /// The forecast for `decoded_bytes` per token, the reads overlapping the cores' work:
    /// plain `max(D / B, C)`; compressed `max(r·D / B, C + D / (c·T))` overlapped,
    /// `max(r·D / B + D / (c·T), C + D / (c·T))` read then decoded, with `C` the forward
    /// pass's mat-vecs on the same cores.
    pub fn forecast(&self, decoded_bytes: u64) -> CodecForecast {
        let d = decoded_bytes as f64;
        let read = self.stored_ratio * d / self.disk_bytes_per_s.max(1.0);
        let decode =
            d / (self.decode_bytes_per_s_per_core * self.decoding_cores.max(1) as f64).max(1.0);
        let compute = self.compute_s(d);
        CodecForecast {
            decoded_bytes,
            stored_bytes: (self.stored_ratio * d).round() as u64,
            plain_s: (d / self.disk_bytes_per_s.max(1.0)).max(compute),
            compressed_s: match self.overlapped {
                true => read.max(compute + decode),
                false => (read + decode).max(compute + decode),
            },
            decode_s: decode,
        }
    }

    /// The drive rate below which the compressed pack is faster (bytes/s): `1 / (1/(k·T) +
    /// 1/(c·T))` overlapped — the decode and the mat-vecs must both fit in the plain pack's
    /// read time — and at most `(1 − r)·c·T` read then decoded; `c·T` and `(1 − r)·c·T`
    /// when compute is not counted.
    pub fn crossover_bytes_per_s(&self) -> f64 {
        let cores = self.decoding_cores.max(1) as f64;
        let ct = self.decode_bytes_per_s_per_core * cores;
        let shared = match self.compute_bytes_per_s_per_core > 0.0 {
            true => 1.0 / (1.0 / (self.compute_bytes_per_s_per_core * cores) + 1.0 / ct),
            false => ct,
        };
        match self.overlapped {
            true => shared,
            false => shared.min((1.0 - self.stored_ratio) * ct),
        }
    }

    /// Whether the compressed pack streams faster than a plain one (never when it stores
    /// no fewer bytes: a pack of small tensors, kept raw, has a ratio of 1).
    pub fn pays(&self) -> bool {
        self.stored_ratio < 1.0 && self.disk_bytes_per_s < self.crossover_bytes_per_s()
    }

    /// The first line for `k3 plan`: the bytes read and decoded per token, the decode
    /// seconds, and both packs' seconds per token.
    pub fn summary(&self, decoded_bytes: u64) -> String {
        let f = self.forecast(decoded_bytes);
        let compute = self.compute_s(decoded_bytes as f64);
        let beside = match compute > 0.0 {
            true => format!(" beside {compute:.2} s of mat-vecs"),
            false => String::new(),
        };
        format!(
            "compressed trunk: {} read + {} decoded per token, decode {:.2} s{beside} on {} cores ({:.2} s/token vs {:.2} s plain{})",
            fmt_bytes(f.stored_bytes),
            fmt_bytes(f.decoded_bytes),
            f.decode_s,
            self.decoding_cores,
            f.compressed_s,
            f.plain_s,
            if self.overlapped { ", read overlapping decode" } else { "" }
        )
    }

    /// Whether compression pays, and why: `compression pays at R GB/s with N decoding cores
    /// (crossover X GB/s per core)`, or `does not pay`.
    pub fn decision(&self) -> String {
        let per_core = self.crossover_bytes_per_s() / self.decoding_cores.max(1) as f64;
        let gbps = self.disk_bytes_per_s / 1e9;
        let rate = match gbps >= 1.0 {
            true => format!("{gbps:.1}"),
            false => format!("{gbps:.2}"),
        };
        format!(
            "compression {} at {rate} GB/s with {} decoding cores (crossover {:.2} GB/s per core)",
            if self.pays() { "pays" } else { "does not pay" },
            self.decoding_cores,
            per_core / 1e9
        )
    }

    /// [`Self::summary`] and [`Self::decision`] with the pack to make: two lines.
    pub fn verdict(&self, decoded_bytes: u64) -> String {
        let advice = match self.pays() {
            true => "use the compressed pack (`k3 pack --compress MODEL DIR`)",
            false => "use a plain pack (`k3 pack MODEL DIR`)",
        };
        format!(
            "{}\n{}: {advice}",
            self.summary(decoded_bytes),
            self.decision()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(disk_gb_s: f64, cores: usize, overlapped: bool) -> CodecRates {
        CodecRates {
            stored_ratio: 0.667,
            disk_bytes_per_s: disk_gb_s * 1e9,
            decode_bytes_per_s_per_core: 2e9,
            decoding_cores: cores,
            overlapped,
            compute_bytes_per_s_per_core: 0.0,
        }
    }

    /// The forward pass's mat-vecs share the decoding cores: at 6 GB/s of trunk per core
    /// (2 cores: 12 GB/s) beside 2 GB/s of decode per core (4 GB/s), an overlapped pack
    /// pays below 1 / (1/12 + 1/4) = 3 GB/s, not 4; the forecast agrees on both sides, and
    /// a drive faster than the cores' compute never makes compression pay.
    #[test]
    fn compute_on_the_decoding_cores_lowers_the_crossover() {
        for overlapped in [true, false] {
            let r = CodecRates {
                compute_bytes_per_s_per_core: 6e9,
                ..rates(2.0, 2, overlapped)
            };
            let want: f64 = if overlapped { 3e9 } else { 1.332e9 };
            assert!((r.crossover_bytes_per_s() - want).abs() < 1e6, "{r:?}");
            for d in [0.5, 1.3, 1.4, 2.9, 3.1, 6.0, 20.0] {
                let r = CodecRates {
                    disk_bytes_per_s: d * 1e9,
                    ..r
                };
                let f = r.forecast(6_000_000_000);
                assert_eq!(f.compressed_s < f.plain_s, r.pays(), "{r:?} {f:?}");
            }
        }
        // compute-bound (drive 20 GB/s > 12 GB/s of mat-vecs): plain takes the compute time
        let fast = CodecRates {
            compute_bytes_per_s_per_core: 6e9,
            ..rates(20.0, 2, true)
        };
        assert_eq!(fast.forecast(6_000_000_000).plain_s, 0.5);
        assert!(!fast.pays());
    }

    #[test]
    fn crossover_is_one_minus_r_c_t_serial_and_c_t_overlapped() {
        // 2 cores at 2 GB/s: serial pays below 0.333·4 = 1.33 GB/s, overlapped below 4 GB/s.
        let serial = rates(2.4, 2, false);
        assert!((serial.crossover_bytes_per_s() - 1.332e9).abs() < 1e6);
        assert!(!serial.pays());
        let overlapped = rates(2.4, 2, true);
        assert_eq!(overlapped.crossover_bytes_per_s(), 4e9);
        assert!(overlapped.pays());
        // The forecast agrees with the crossover on both sides of it.
        for (r, d) in [
            (serial, 1.2),
            (serial, 1.5),
            (overlapped, 3.9),
            (overlapped, 4.1),
        ] {
            let r = CodecRates {
                disk_bytes_per_s: d * 1e9,
                ..r
            };
            let f = r.forecast(4_000_000_000);
            assert_eq!(f.compressed_s < f.plain_s, r.pays(), "{r:?}");
        }
    }

    #[test]
    fn a_pack_that_stores_every_byte_never_pays() {
        for overlapped in [false, true] {
            let r = CodecRates {
                stored_ratio: 1.0,
                ..rates(0.01, 2, overlapped)
            };
            assert!(!r.pays(), "{r:?}");
            let f = r.forecast(1_000_000);
            assert!(f.compressed_s >= f.plain_s, "{f:?}");
        }
    }

    #[test]
    fn verdict_names_the_pack_to_use() {
        let v = rates(2.4, 2, false).verdict(4_004_000_000);
        assert!(
            v.contains("compression does not pay at 2.4 GB/s with 2 decoding cores (crossover 0.67 GB/s per core)"),
            "{v}"
        );
        assert!(v.contains("use a plain pack (`k3 pack MODEL DIR`)"), "{v}");
        assert!(
            v.contains("2.67 GB read + 4.00 GB decoded per token"),
            "{v}"
        );
        let v = rates(1.0, 2, false).verdict(4_004_000_000);
        assert!(v.contains("compression pays at 1.0 GB/s"), "{v}");
        assert!(
            v.contains("use the compressed pack (`k3 pack --compress MODEL DIR`)"),
            "{v}"
        );
    }
}
