//! The distribution seam (docs/DISTRIBUTED.md#the-seam): a row-dealt product equals the
//! whole product bit for bit in every storage, and the whole model over an in-process group
//! of N ranks gives every rank one process's logits, for every storage of the random model.

use super::*;
use crate::dist::{row_share, Dist};
use k3_kernels::{matmul, Matrix};
use std::sync::Arc;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / 8e6 - 1.0
        })
        .collect()
}

#[test]
fn row_shares_cover_every_row_once_in_rank_order() {
    for rows in [0, 1, 5, 32, 97] {
        for n in 1..=5 {
            let shares: Vec<_> = (0..n).map(|r| row_share(rows, r, n)).collect();
            assert_eq!(shares[0].0, 0);
            assert_eq!(shares[n - 1].1, rows);
            assert!(shares.windows(2).all(|w| w[0].1 == w[1].0));
        }
    }
}

#[test]
fn dealt_products_equal_the_whole_product_in_every_storage() {
    let (rows, cols) = (37, 64);
    let f = values(rows * cols, 1);
    let bf: Vec<half::bf16> = f.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let packed: Vec<u8> = (0..rows * cols / 2).map(|i| (i * 37 % 251) as u8).collect();
    let scales: Vec<u8> = (0..rows * cols / 32).map(|i| 120 + (i % 5) as u8).collect();
    let q: Vec<i8> = (0..rows * cols).map(|i| (i * 13 % 255) as i8).collect();
    let qs = values(rows, 9);
    let mats = [
        Matrix::f32(rows, cols, &f).unwrap(),
        Matrix::bf16(rows, cols, &bf).unwrap(),
        Matrix::mxfp4(rows, cols, &packed, &scales).unwrap(),
        Matrix::q8(rows, cols, &q, &qs).unwrap(),
    ];
    for w in &mats {
        for t in [1, 3] {
            let x = values(t * cols, 5);
            let mut whole = vec![0f32; t * rows];
            matmul(&mut whole, w, &x, t);
            for n in 1..=3 {
                let comms = LocalComm::group(n);
                std::thread::scope(|s| {
                    for c in &comms {
                        let (x, whole) = (&x, &whole);
                        s.spawn(move || {
                            let mut y = vec![0f32; t * rows];
                            Dist { comm: c }.matmul(&mut y, w, x, t).unwrap();
                            let same = y.iter().zip(whole).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{:?} t={t} N={n} rank {}", w.data, c.rank());
                        });
                    }
                });
            }
        }
    }
}

#[test]
fn the_random_model_over_ranks_gives_every_rank_one_process_logits() {
    let (m, w, x) = model();
    let mut st = m.new_state(32);
    let want = m
        .forward(&w, &x, &PROMPT, &mut st, LogitsMode::All)
        .unwrap();
    for n in 2..=3 {
        let comms = LocalComm::group(n);
        std::thread::scope(|s| {
            for c in comms {
                let (m, w, x, want) = (&m, &w, &x, &want);
                s.spawn(move || {
                    let ranked = m.clone().with_comm(Arc::new(c));
                    let mut st = ranked.new_state(32);
                    let got = ranked
                        .forward(w, x, &PROMPT, &mut st, LogitsMode::All)
                        .unwrap();
                    let same = got
                        .data
                        .iter()
                        .zip(&want.data)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same && got.rows == want.rows, "N={n}: logits differ");
                });
            }
        });
    }
}

#[test]
fn byte_broadcast_delivers_the_roots_bytes_of_any_length() {
    for len in [0usize, 1, 3, 4, 5, 1000] {
        let group = crate::LocalComm::group(3);
        let sent: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
        let got: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .map(|c| {
                    let sent = sent.clone();
                    s.spawn(move || {
                        let mut mine = if c.rank() == 1 { sent } else { vec![9; 2] };
                        c.broadcast_bytes(1, &mut mine).unwrap();
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(got.iter().all(|g| *g == sent), "len {len}: {got:?}");
    }
}
