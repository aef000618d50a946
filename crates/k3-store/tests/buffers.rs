//! `AlignedBuf` under every `BufferPolicy`: 4096-aligned, zeroed, writable, its own length;
//! `prefault` keeps the contents; huge-page advice where the kernel offers THP. One test
//! function, since the policy is process-wide (docs/PERFORMANCE.md#cold-start).

use k3_store::io::{AlignedBuf, BufferPolicy, Prefault, ALIGN, HUGE_PAGE};

const LENS: [usize; 8] = [
    0,
    1,
    4095,
    4096,
    4097,
    HUGE_PAGE - 1,
    HUGE_PAGE,
    3 * HUGE_PAGE + 12_345,
];

fn policies() -> Vec<BufferPolicy> {
    let mut v = Vec::new();
    for anon_map in [false, true] {
        for huge_pages in [false, true] {
            for prefault in [false, true] {
                v.push(BufferPolicy {
                    anon_map,
                    huge_pages,
                    prefault,
                });
            }
        }
    }
    v
}

/// Writes a pattern at every 1000th byte and the last, checks it reads back.
fn write_and_check(buf: &mut AlignedBuf) {
    let n = buf.len();
    for i in (0..n).step_by(1000).chain(n.checked_sub(1)) {
        buf[i] = (i % 251) as u8 + 1;
    }
    for i in (0..n).step_by(1000).chain(n.checked_sub(1)) {
        assert_eq!(buf[i], (i % 251) as u8 + 1, "byte {i} of {n}");
    }
}

#[test]
fn every_policy_gives_aligned_zeroed_buffers() {
    let thp = k3_store::thp_mode();
    for policy in policies() {
        policy.install();
        assert_eq!(BufferPolicy::current(), policy);
        for len in LENS {
            let mut buf = AlignedBuf::new(len);
            let what = format!("{policy:?}, {len} bytes");
            assert_eq!(buf.len(), len, "{what}");
            assert_eq!(buf.is_empty(), len == 0, "{what}");
            assert_eq!(buf.as_ptr() as usize % ALIGN, 0, "{what}: not 4096-aligned");
            assert!(buf.iter().all(|&b| b == 0), "{what}: not zeroed");
            write_and_check(&mut buf);
            let prefault = buf.prefault();
            if !policy.anon_map || len == 0 {
                assert_eq!(prefault, Prefault::Nothing, "{what}");
            } else if cfg!(target_os = "linux") {
                // MADV_POPULATE_WRITE is Linux ≥ 5.14; older kernels refuse it.
                assert_ne!(prefault, Prefault::Nothing, "{what}");
            }
            // Pre-faulting never changes what the buffer holds.
            write_and_check(&mut buf);
            if len > 1001 {
                assert_eq!(buf[500], 0, "{what}: an unwritten byte changed");
            }
            let advised_expected = policy.anon_map
                && policy.huge_pages
                && len >= HUGE_PAGE
                && matches!(thp.as_deref(), Some("always" | "madvise"));
            if advised_expected {
                assert!(buf.huge_page_advised(), "{what}: THP {thp:?}, not advised");
            }
            if !policy.huge_pages || !policy.anon_map || len < HUGE_PAGE {
                assert!(!buf.huge_page_advised(), "{what}: advised against policy");
            }
        }
    }
    BufferPolicy::default().install();
}

#[test]
fn thp_mode_reads_the_bracketed_word() {
    // Where the file exists the mode is one of the kernel's three words.
    if let Some(mode) = k3_store::thp_mode() {
        assert!(
            ["always", "madvise", "never"].contains(&mode.as_str()),
            "{mode}"
        );
    }
}
