//! The checkpoint index: every tensor of every shard, looked up by exact name.
//!
//! Built for the real checkpoint's 96 shards and 497,220 tensors: names are interned into one
//! string arena, shapes into a small table of distinct shapes, and each tensor is a 32-byte
//! `Entry`; the name → entry map is a `hashbrown::HashTable<u32>` over entry indices, so a
//! name is stored exactly once. Shards are memory-mapped and tensor bytes are served zero-copy.

use crate::dtype::Dtype;
use crate::error::FormatError;
use crate::safetensors::ShardHeader;
use crate::shard_list::{self, IndexFile};
use crate::view::TensorView;
use hashbrown::DefaultHashBuilder as RandomState;
use hashbrown::HashTable;
use memmap2::Mmap;
use std::fs::File;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};

/// Name of the Hugging Face shard index file.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One memory-mapped shard file.
#[derive(Debug)]
pub struct Shard {
    path: PathBuf,
    map: Mmap,
    header_len: u64,
    tensors: usize,
}

impl Shard {
    /// The shard's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The whole file, mapped.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
    /// File length in bytes.
    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }
    /// Length of the JSON header.
    pub fn header_len(&self) -> u64 {
        self.header_len
    }
    /// Absolute offset of the data section.
    pub fn data_start(&self) -> u64 {
        8 + self.header_len
    }
    /// Number of tensors in this shard.
    pub fn tensor_count(&self) -> usize {
        self.tensors
    }
}

/// Compact per-tensor record (32 bytes).
#[derive(Clone, Copy, Debug)]
struct Entry {
    offset: u64,
    nbytes: u64,
    name_at: u32,
    name_len: u32,
    shape: u32,
    shard: u16,
    dtype: u8,
}

/// An indexed safetensors checkpoint (a directory of shards).
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    shards: Vec<Shard>,
    names: String,
    entries: Vec<Entry>,
    shapes: Vec<Box<[usize]>>,
    table: HashTable<u32>,
    hasher: RandomState,
}

impl Checkpoint {
    /// Indexes the checkpoint directory `dir`: the shards named by
    /// `model.safetensors.index.json`'s `weight_map` when that file exists (and then every
    /// weight_map entry must be found in the shard it names), else every `*.safetensors` file
    /// in the directory, sorted by name.
    pub fn open(dir: impl AsRef<Path>) -> Result<Checkpoint, FormatError> {
        let dir = dir.as_ref();
        let index_path = dir.join(INDEX_FILE);
        if index_path.is_file() {
            let bytes = map_file(&index_path)?;
            let index = shard_list::parse_index(&index_path, &bytes)?;
            let paths = shard_list::shard_paths(dir, &index_path, &index)?;
            let mut ck = Self::open_files(&paths)?;
            ck.dir = dir.to_path_buf();
            ck.check_index(&index_path, &index, &paths)?;
            return Ok(ck);
        }
        let paths = shard_list::list_shards(dir)?;
        let mut ck = Self::open_files(&paths)?;
        ck.dir = dir.to_path_buf();
        Ok(ck)
    }

    /// Indexes exactly the given shard files, in this order (shard `i` is `paths[i]`).
    pub fn open_files(paths: &[PathBuf]) -> Result<Checkpoint, FormatError> {
        if paths.len() > usize::from(u16::MAX) {
            return Err(FormatError::TooLarge {
                what: "shard count",
                value: paths.len() as u64,
                limit: u64::from(u16::MAX),
            });
        }
        let maps = paths
            .iter()
            .map(|p| map_file(p))
            .collect::<Result<Vec<_>, _>>()?;
        let hasher = RandomState::default();
        let headers = parse_all(paths, &maps, &hasher)?;
        let count = headers.iter().map(|h| h.0.len()).sum();
        let name_bytes = headers
            .iter()
            .flat_map(|h| h.0.iter())
            .map(|t| t.name.len())
            .sum();
        let mut b = Builder::new(count, name_bytes, hasher);
        for (i, (h, hashes)) in headers.iter().enumerate() {
            b.add_shard(i, h, hashes, paths)?;
        }
        let shard_meta: Vec<(u64, usize)> = headers
            .iter()
            .map(|(h, _)| (h.header_len(), h.len()))
            .collect();
        drop(headers);
        let shards = paths
            .iter()
            .zip(maps)
            .zip(shard_meta)
            .map(|((path, map), (header_len, tensors))| Shard {
                path: path.clone(),
                map,
                header_len,
                tensors,
            })
            .collect();
        let dir = paths
            .first()
            .and_then(|p| p.parent())
            .unwrap_or(Path::new(""))
            .to_path_buf();
        Ok(b.finish(dir, shards))
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The shards, in index order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no tensor is indexed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether a tensor of this exact name exists.
    pub fn contains(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// The tensor of this exact name, or `None`.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        self.find(name).map(|i| self.view(i))
    }

    /// The tensor of this exact name, or [`FormatError::TensorNotFound`].
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, FormatError> {
        self.get(name).ok_or_else(|| FormatError::TensorNotFound {
            tensor: name.to_string(),
            count: self.len(),
            shards: self.shards.len(),
        })
    }

    /// Every tensor, shard by shard in header order.
    pub fn iter(&self) -> impl Iterator<Item = TensorView<'_>> + '_ {
        (0..self.entries.len()).map(move |i| self.view(i))
    }

    /// Heap bytes retained by the index itself (arena, entries, shape table, hash table and
    /// shard records; the mapped files are not heap).
    pub fn heap_bytes(&self) -> usize {
        let shapes: usize = self
            .shapes
            .iter()
            .map(|s| s.len() * size_of::<usize>())
            .sum();
        let shards: usize = self
            .shards
            .iter()
            .map(|s| s.path.as_os_str().len())
            .sum::<usize>();
        self.names.capacity()
            + self.entries.capacity() * size_of::<Entry>()
            + self.shapes.capacity() * size_of::<Box<[usize]>>()
            + shapes
            + self.table.allocation_size()
            + self.shards.capacity() * size_of::<Shard>()
            + shards
    }

    fn find(&self, name: &str) -> Option<usize> {
        let hash = self.hasher.hash_one(name);
        self.table
            .find(hash, |&i| {
                entry_name(&self.names, &self.entries[i as usize]) == name
            })
            .map(|&i| i as usize)
    }

    fn view(&self, i: usize) -> TensorView<'_> {
        let e = &self.entries[i];
        let shard = &self.shards[usize::from(e.shard)];
        // Validated at open: offset + nbytes <= file length.
        let start = e.offset as usize;
        TensorView {
            name: entry_name(&self.names, e),
            dtype: Dtype::from_code(e.dtype),
            shape: &self.shapes[e.shape as usize],
            bytes: &shard.map[start..start + e.nbytes as usize],
            shard: usize::from(e.shard),
            shard_path: &shard.path,
            offset: e.offset,
        }
    }

    /// Every weight_map entry must be in the shard the index names (checked in parallel).
    fn check_index(
        &self,
        index_path: &Path,
        index: &IndexFile<'_>,
        paths: &[PathBuf],
    ) -> Result<(), FormatError> {
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .max(1);
        let chunk = index.entries.len().div_ceil(workers).max(1);
        // A part whose thread cannot be spawned is checked inline (`par::run_scoped`).
        let bad = crate::par::run_scoped(
            index
                .entries
                .chunks(chunk)
                .map(|part| move || self.first_misplaced(index, part)),
        )
        .into_iter()
        .find_map(|r| r);
        let Some((name, want, found)) = bad else {
            return Ok(());
        };
        Err(FormatError::TensorMissingFromShard {
            index: index_path.to_path_buf(),
            tensor: name.to_string(),
            shard: paths[want].clone(),
            found: found
                .map(|s| format!(" (it is in {})", paths[s].display()))
                .unwrap_or_default(),
        })
    }

    /// The first `(name, wanted shard, found shard)` whose shard differs from the index's.
    fn first_misplaced<'i>(
        &self,
        index: &IndexFile<'_>,
        part: &'i [(std::borrow::Cow<'_, str>, u32)],
    ) -> Option<(&'i str, usize, Option<usize>)> {
        part.iter().find_map(|(name, shard)| {
            let want = index.shard_order[*shard as usize];
            let found = self.find(name).map(|i| usize::from(self.entries[i].shard));
            (found != Some(want)).then_some((name.as_ref(), want, found))
        })
    }
}

fn entry_name<'n>(names: &'n str, e: &Entry) -> &'n str {
    let at = e.name_at as usize;
    names.get(at..at + e.name_len as usize).unwrap_or("")
}

/// Opens and maps one shard file.
fn map_file(path: &Path) -> Result<Mmap, FormatError> {
    let file = File::open(path).map_err(|e| FormatError::io(path, e))?;
    // SAFETY: the mapping is read-only and private to this index. Modifying or truncating a
    // shard file while it is mapped is outside the contract (as for any mmap reader).
    unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))
}

/// A parsed header with the hash of every tensor name.
type Parsed<'m> = (ShardHeader<'m>, Vec<u64>);

/// Parses every shard header and hashes its names, in parallel over the available cores.
fn parse_all<'m>(
    paths: &[PathBuf],
    maps: &'m [Mmap],
    hasher: &RandomState,
) -> Result<Vec<Parsed<'m>>, FormatError> {
    let parse = |p: &PathBuf, m: &'m Mmap| -> Result<Parsed<'m>, FormatError> {
        let h = ShardHeader::parse(p, m)?;
        let hashes = h.iter().map(|t| hasher.hash_one(t.name)).collect();
        Ok((h, hashes))
    };
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(maps.len());
    if workers <= 1 {
        return paths.iter().zip(maps).map(|(p, m)| parse(p, m)).collect();
    }
    let chunk = maps.len().div_ceil(workers);
    // A part whose thread cannot be spawned is parsed inline (`par::run_scoped`).
    let parts: Vec<Result<Vec<Parsed<'m>>, FormatError>> = crate::par::run_scoped(
        paths
            .chunks(chunk)
            .zip(maps.chunks(chunk))
            .map(|(ps, ms)| move || ps.iter().zip(ms).map(|(p, m)| parse(p, m)).collect()),
    );
    let mut out = Vec::with_capacity(maps.len());
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}

/// Accumulates entries while shards are added.
struct Builder {
    names: String,
    entries: Vec<Entry>,
    shapes: Vec<Box<[usize]>>,
    shape_ids: hashbrown::HashMap<Box<[usize]>, u32>,
    table: HashTable<u32>,
    hasher: RandomState,
    dims: Vec<usize>,
}

impl Builder {
    fn new(capacity: usize, name_bytes: usize, hasher: RandomState) -> Self {
        Builder {
            names: String::with_capacity(name_bytes),
            entries: Vec::with_capacity(capacity),
            shapes: Vec::new(),
            shape_ids: hashbrown::HashMap::default(),
            table: HashTable::with_capacity(capacity),
            hasher,
            dims: Vec::new(),
        }
    }

    fn add_shard(
        &mut self,
        shard: usize,
        h: &ShardHeader<'_>,
        hashes: &[u64],
        paths: &[PathBuf],
    ) -> Result<(), FormatError> {
        for (t, &hash) in h.iter().zip(hashes) {
            let (names, entries) = (&self.names, &self.entries);
            let dup = self
                .table
                .find(hash, |&i| entry_name(names, &entries[i as usize]) == t.name)
                .map(|&i| usize::from(entries[i as usize].shard));
            if let Some(first) = dup {
                return Err(FormatError::DuplicateTensor {
                    tensor: t.name.to_string(),
                    first: paths[first].clone(),
                    second: paths[shard].clone(),
                });
            }
            let entry = Entry {
                offset: t.offset,
                nbytes: t.end - t.start,
                name_at: self.intern_name(t.name)?,
                name_len: t.name.len() as u32,
                shape: self.intern_shape(t.shape)?,
                shard: shard as u16,
                dtype: t.dtype.code(),
            };
            let idx = self.entries.len() as u32;
            self.entries.push(entry);
            let (names, entries, hasher) = (&self.names, &self.entries, &self.hasher);
            self.table.insert_unique(hash, idx, |&i| {
                hasher.hash_one(entry_name(names, &entries[i as usize]))
            });
        }
        Ok(())
    }

    fn intern_name(&mut self, name: &str) -> Result<u32, FormatError> {
        let at = self.names.len();
        let end = at as u64 + name.len() as u64;
        if end > u64::from(u32::MAX) {
            return Err(FormatError::TooLarge {
                what: "tensor name bytes",
                value: end,
                limit: u64::from(u32::MAX),
            });
        }
        self.names.push_str(name);
        Ok(at as u32)
    }

    fn intern_shape(&mut self, shape: &[u64]) -> Result<u32, FormatError> {
        self.dims.clear();
        for &d in shape {
            self.dims
                .push(usize::try_from(d).map_err(|_| FormatError::TooLarge {
                    what: "tensor dimension",
                    value: d,
                    limit: usize::MAX as u64,
                })?);
        }
        if let Some(&id) = self.shape_ids.get(self.dims.as_slice()) {
            return Ok(id);
        }
        let id = self.shapes.len() as u32;
        let boxed: Box<[usize]> = self.dims.as_slice().into();
        self.shapes.push(boxed.clone());
        self.shape_ids.insert(boxed, id);
        Ok(id)
    }

    fn finish(mut self, dir: PathBuf, shards: Vec<Shard>) -> Checkpoint {
        self.names.shrink_to_fit();
        self.entries.shrink_to_fit();
        self.shapes.shrink_to_fit();
        // The table was sized for every entry up front; shrinking would rehash every name.
        Checkpoint {
            dir,
            shards,
            names: self.names,
            entries: self.entries,
            shapes: self.shapes,
            table: self.table,
            hasher: self.hasher,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn entry_is_32_bytes() {
        assert_eq!(size_of::<super::Entry>(), 32);
    }
}
