//! Adopting a trunk packed by upstream's packer (docs/FORMATS.md#adopting-an-upstream-pack).
//! The packs are written by the small independent writer in `k3_testkit::upstream_pack` from the
//! format's description (never by transforming k3's pack): the fields upstream writes, the same
//! with the fields derived packers add, and damaged copies (a wrong tensor offset, a flipped
//! run byte, non-zero padding, a missing layer), each refused by layer with nothing written.

use k3_testkit::upstream_pack;

use k3_format::bind::{bind_model, ModelBinding};
use k3_format::pack::{adopt_trunk_pack, UPSTREAM_JSON};
use k3_format::{Checkpoint, K3Config, PackError, TrunkPack};
use std::path::{Path, PathBuf};
use upstream_pack::{edit_index, flip_bin_byte, write_upstream_pack, Run, Style};

fn tiny() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny-k3")
}

fn load(dir: &Path) -> (K3Config, Checkpoint, ModelBinding) {
    let cfg = K3Config::load(dir.join("config.json")).unwrap();
    let ck = Checkpoint::open(dir).unwrap();
    let b = bind_model(&ck, &cfg).unwrap();
    (cfg, ck, b)
}

fn adopt(dir: &Path) -> Result<TrunkPack, PackError> {
    let (cfg, ck, b) = load(&tiny());
    adopt_trunk_pack(&ck, &b, &cfg, dir, &mut |_, _| {})
}

/// Adopts a pack written in `style` and checks the result against the writer's runs.
fn adopts(style: Style) {
    let out = tempfile::tempdir().unwrap();
    let (runs, doc) = write_upstream_pack(&tiny(), out.path(), style);
    let written = std::fs::read_to_string(out.path().join("trunk.json")).unwrap();
    let bin_before = std::fs::read(out.path().join("trunk.bin")).unwrap();

    // k3 refuses upstream's index as it stands, pointing at --adopt.
    let refused = TrunkPack::open(out.path()).unwrap_err();
    assert!(matches!(
        refused,
        PackError::NoChecksums {
            layers: 13,
            of: 13,
            ..
        }
    ));
    assert!(refused.to_string().contains("--adopt"), "{refused}");

    let mut last = (0, 0);
    let (cfg, ck, b) = load(&tiny());
    let pack = adopt_trunk_pack(&ck, &b, &cfg, out.path(), &mut |d, t| last = (d, t)).unwrap();
    let bin_len = bin_before.len() as u64;
    let compared: u64 = doc["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            l["nbytes"]
                .as_u64()
                .unwrap()
                .min(bin_len - l["file_off"].as_u64().unwrap())
        })
        .sum();
    assert_eq!(
        last,
        (compared, compared),
        "progress counts every byte compared"
    );

    assert_eq!(
        std::fs::read(out.path().join("trunk.bin")).unwrap(),
        bin_before
    );
    let kept = std::fs::read_to_string(out.path().join(UPSTREAM_JSON)).unwrap();
    assert_eq!(kept, written);
    assert_eq!(pack.num_layers(), runs.len());
    check_layers(&pack, &runs, &doc, &bin_before);
    pack.verify_checksums(&mut |_, _| {}).unwrap();
    // The adopted index opens as k3's own: checksums, provenance and shapes are in it.
    let reopened = TrunkPack::open(out.path()).unwrap();
    reopened.check_against(&b, &cfg).unwrap();
    reopened.check_source(&ck).unwrap();
}

/// Each layer of the adopted index sits where upstream put it, is the run's exact length,
/// names the writer's tensors at the writer's offsets and holds the shard's bytes.
fn check_layers(pack: &TrunkPack, runs: &[Run], doc: &serde_json::Value, bin: &[u8]) {
    for (l, run) in runs.iter().enumerate() {
        let e = pack.layer_entry(l).unwrap();
        assert_eq!(e.file_off, doc["layers"][l]["file_off"].as_u64().unwrap());
        assert_eq!(e.nbytes, run.end - run.start, "layer {l}: exact length");
        assert_eq!(e.source_offset, run.start);
        assert_eq!(Path::new(&e.source_shard), run.shard.file_name().unwrap());
        assert_eq!(e.tensors.len(), run.tensors.len());
        for t in &run.tensors {
            let p = e.tensor(&t.name).unwrap();
            assert_eq!(
                (p.off, p.nbytes, p.dtype.name()),
                (t.begin - run.start, t.end - t.begin, t.dtype.as_str())
            );
        }
        let shard = std::fs::read(&run.shard).unwrap();
        let packed = &bin[e.file_off as usize..(e.file_off + e.nbytes) as usize];
        assert_eq!(
            packed,
            &shard[run.start as usize..run.end as usize],
            "layer {l}"
        );
        assert!(e.verify(packed), "layer {l}: checksum of the run");
    }
}

#[test]
fn upstreams_fields_only_are_adopted() {
    adopts(Style::default());
}

#[test]
fn extra_fields_of_derived_packers_are_ignored() {
    adopts(Style {
        extra_fields: true,
        ..Style::default()
    });
}

#[test]
fn padding_cut_off_by_the_end_of_the_file_is_accepted() {
    adopts(Style {
        no_tail_padding: true,
        ..Style::default()
    });
}

#[test]
fn an_exact_run_length_is_accepted_too() {
    adopts(Style {
        exact_nbytes: true,
        ..Style::default()
    });
}

/// Adopting `dir` fails; the index, the data and the directory's file list are untouched.
fn refused(dir: &Path) -> PackError {
    let json = std::fs::read(dir.join("trunk.json")).unwrap();
    let bin = std::fs::read(dir.join("trunk.bin")).unwrap();
    let err = adopt(dir).unwrap_err();
    assert_eq!(
        std::fs::read(dir.join("trunk.json")).unwrap(),
        json,
        "{err}"
    );
    assert_eq!(std::fs::read(dir.join("trunk.bin")).unwrap(), bin, "{err}");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["trunk.bin", "trunk.json"], "{err}");
    assert!(err.to_string().contains("nothing was adopted"), "{err}");
    err
}

#[test]
fn a_wrong_tensor_offset_is_refused_by_layer_and_tensor() {
    let out = tempfile::tempdir().unwrap();
    let (runs, _) = write_upstream_pack(&tiny(), out.path(), Style::default());
    let victim = runs[4]
        .tensors
        .iter()
        .max_by_key(|t| t.begin)
        .unwrap()
        .name
        .clone();
    edit_index(out.path(), |d| {
        let off = &mut d["layers"][4]["tensors"][&victim]["off"];
        *off = (off.as_u64().unwrap() + 2).into();
    });
    let err = refused(out.path());
    assert!(matches!(err, PackError::NotAdopted { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("layer 4:") && msg.contains(&format!("{victim:?}")),
        "{msg}"
    );
}

#[test]
fn a_flipped_byte_inside_a_run_is_refused_naming_byte_and_tensor() {
    let out = tempfile::tempdir().unwrap();
    let (runs, doc) = write_upstream_pack(&tiny(), out.path(), Style::default());
    let t = &runs[7].tensors[runs[7].tensors.len() / 2];
    let at = t.begin - runs[7].start + 1;
    flip_bin_byte(
        out.path(),
        doc["layers"][7]["file_off"].as_u64().unwrap() + at,
        0x10,
    );
    match refused(out.path()) {
        PackError::Differs {
            layer,
            at: found,
            tensor,
            shard_off,
            ..
        } => {
            assert_eq!((layer, found, shard_off), (7, at, runs[7].start + at));
            assert_eq!(tensor, t.name);
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn non_zero_padding_is_refused() {
    let out = tempfile::tempdir().unwrap();
    let (runs, doc) = write_upstream_pack(&tiny(), out.path(), Style::default());
    let len = runs[2].end - runs[2].start;
    assert!(
        doc["layers"][2]["nbytes"].as_u64().unwrap() > len + 10,
        "the tiny run is not a multiple of 4096"
    );
    flip_bin_byte(
        out.path(),
        doc["layers"][2]["file_off"].as_u64().unwrap() + len + 10,
        0x01,
    );
    let msg = refused(out.path()).to_string();
    assert!(
        msg.contains("layer 2:")
            && msg.contains(&format!("byte {}", len + 10))
            && msg.contains("padding and must be zero"),
        "{msg}"
    );
}

#[test]
fn a_missing_layer_is_refused_by_number() {
    let out = tempfile::tempdir().unwrap();
    write_upstream_pack(&tiny(), out.path(), Style::default());
    edit_index(out.path(), |d| {
        d["layers"].as_array_mut().unwrap().remove(5);
    });
    let msg = refused(out.path()).to_string();
    assert!(
        msg.contains("lists 12 layers, the checkpoint has 13: layer 5 missing"),
        "{msg}"
    );
}

#[test]
fn swapped_layers_and_a_wrong_length_are_refused() {
    let out = tempfile::tempdir().unwrap();
    write_upstream_pack(&tiny(), out.path(), Style::default());
    edit_index(out.path(), |d| {
        d["layers"].as_array_mut().unwrap().swap(3, 4)
    });
    let msg = refused(out.path()).to_string();
    assert!(
        msg.contains("entry 3 of \"layers\" holds layer 4's tensors"),
        "{msg}"
    );

    let out = tempfile::tempdir().unwrap();
    write_upstream_pack(&tiny(), out.path(), Style::default());
    edit_index(out.path(), |d| {
        let n = &mut d["layers"][6]["nbytes"];
        *n = (n.as_u64().unwrap() + 4096).into();
    });
    let msg = refused(out.path()).to_string();
    assert!(msg.contains("layer 6: nbytes is"), "{msg}");
}

#[test]
fn an_index_that_is_not_upstreams_is_refused_by_field() {
    let out = tempfile::tempdir().unwrap();
    write_upstream_pack(&tiny(), out.path(), Style::default());
    edit_index(out.path(), |d| {
        d["layers"][0].as_object_mut().unwrap().remove("file_off");
    });
    let err = refused(out.path());
    assert!(matches!(err, PackError::UpstreamJson { .. }), "{err:?}");
    assert!(
        err.to_string().contains("missing field `file_off`"),
        "{err}"
    );
}

#[test]
fn a_k3_pack_is_re_checked_and_keeps_no_upstream_copy() {
    let out = tempfile::tempdir().unwrap();
    let (cfg, ck, b) = load(&tiny());
    let opts = k3_format::pack::PackOptions::default();
    let written = k3_format::write_trunk_pack(&ck, &b, &cfg, out.path(), &opts, &mut |_, _| {});
    let before = written.unwrap().layers().to_vec();
    let adopted = adopt(out.path()).unwrap();
    assert_eq!(adopted.layers(), &before[..]);
    assert!(!out.path().join(UPSTREAM_JSON).exists());
}

#[test]
fn a_run_cut_off_by_the_end_of_the_file_is_refused() {
    let out = tempfile::tempdir().unwrap();
    let style = Style {
        no_tail_padding: true,
        ..Style::default()
    };
    write_upstream_pack(&tiny(), out.path(), style);
    let bin = out.path().join("trunk.bin");
    let len = std::fs::metadata(&bin).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&bin)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let msg = refused(out.path()).to_string();
    assert!(
        msg.contains("layer 12: its") && msg.contains("(1 bytes missing): truncated copy"),
        "{msg}"
    );
}
