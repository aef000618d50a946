//! Which files make up a checkpoint: `model.safetensors.index.json`'s `weight_map` when present,
//! else every `*.safetensors` file in the directory, sorted by file name.

use crate::error::FormatError;
use crate::header::CowStr;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::Deserializer;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// The parsed `weight_map`, names borrowed from the index file bytes where possible.
#[derive(Debug, Default)]
pub(crate) struct IndexFile<'a> {
    /// `(tensor name, shard number in first-seen order)`.
    pub entries: Vec<(Cow<'a, str>, u32)>,
    /// Shard file names in first-seen order, with the first tensor naming each.
    pub shard_names: Vec<(Cow<'a, str>, usize)>,
    /// First-seen shard number → position in the sorted shard list.
    pub shard_order: Vec<usize>,
}

/// Parses `model.safetensors.index.json`.
pub(crate) fn parse_index<'a>(path: &Path, bytes: &'a [u8]) -> Result<IndexFile<'a>, FormatError> {
    let malformed = |detail: String| FormatError::IndexMalformed {
        index: path.into(),
        detail,
    };
    let mut out = IndexFile::default();
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let found = IndexSeed { out: &mut out }
        .deserialize(&mut de)
        .and_then(|found| de.end().map(|()| found))
        .map_err(|e| malformed(e.to_string()))?;
    if !found {
        return Err(malformed("no \"weight_map\" object".into()));
    }
    if out.shard_names.is_empty() {
        return Err(malformed("\"weight_map\" is empty".into()));
    }
    let mut sorted: Vec<usize> = (0..out.shard_names.len()).collect();
    sorted.sort_by(|&a, &b| out.shard_names[a].0.cmp(&out.shard_names[b].0));
    out.shard_order = vec![0; sorted.len()];
    for (pos, &first_seen) in sorted.iter().enumerate() {
        out.shard_order[first_seen] = pos;
    }
    Ok(out)
}

/// The shard paths of an index, sorted; refuses paths leaving `dir` and missing files.
pub(crate) fn shard_paths(
    dir: &Path,
    index_path: &Path,
    index: &IndexFile<'_>,
) -> Result<Vec<PathBuf>, FormatError> {
    let mut paths = vec![PathBuf::new(); index.shard_names.len()];
    for (first_seen, (name, tensor)) in index.shard_names.iter().enumerate() {
        let rel = Path::new(name.as_ref());
        let escapes = rel.components().any(|c| !matches!(c, Component::Normal(_)));
        if escapes || name.is_empty() {
            return Err(FormatError::IndexBadShardPath {
                index: index_path.into(),
                tensor: index.entries[*tensor].0.to_string(),
                shard: name.to_string(),
            });
        }
        paths[index.shard_order[first_seen]] = dir.join(rel);
    }
    let missing: Vec<String> = paths
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() {
        let mut names = missing
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if missing.len() > 8 {
            names.push_str(", …");
        }
        return Err(FormatError::ShardMissing {
            index: index_path.into(),
            count: missing.len(),
            names,
        });
    }
    Ok(paths)
}

/// Every `*.safetensors` file in `dir`, sorted by file name.
pub(crate) fn list_shards(dir: &Path) -> Result<Vec<PathBuf>, FormatError> {
    let rd = std::fs::read_dir(dir).map_err(|e| FormatError::io(dir, e))?;
    let mut paths = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| FormatError::io(dir, e))?;
        let path = ent.path();
        if path.extension().is_some_and(|x| x == "safetensors") && path.is_file() {
            paths.push(path);
        }
    }
    if paths.is_empty() {
        return Err(FormatError::NoShards { dir: dir.into() });
    }
    paths.sort();
    Ok(paths)
}

struct IndexSeed<'p, 'de> {
    out: &'p mut IndexFile<'de>,
}

impl<'de> DeserializeSeed<'de> for IndexSeed<'_, 'de> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IndexSeed<'_, 'de> {
    type Value = bool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with a \"weight_map\" member")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(CowStr(key)) = map.next_key::<CowStr<'de>>()? {
            if key == "weight_map" && !found {
                found = true;
                map.next_value_seed(WeightMapSeed {
                    out: &mut *self.out,
                })?;
            } else if key == "weight_map" {
                return Err(de::Error::custom("duplicate \"weight_map\""));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

struct WeightMapSeed<'p, 'de> {
    out: &'p mut IndexFile<'de>,
}

impl<'de> DeserializeSeed<'de> for WeightMapSeed<'_, 'de> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for WeightMapSeed<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"weight_map\": an object mapping tensor names to shard file names")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut ids: HashMap<Cow<'de, str>, u32> = HashMap::new();
        let mut last: Option<(Cow<'de, str>, u32)> = None;
        while let Some(CowStr(name)) = map.next_key::<CowStr<'de>>()? {
            let CowStr(shard) = map.next_value::<CowStr<'de>>()?;
            // Consecutive entries almost always share a shard: skip the map lookup then.
            if let Some((prev, id)) = &last {
                if *prev == shard {
                    self.out.entries.push((name, *id));
                    continue;
                }
            }
            let next = self.out.shard_names.len();
            let id = match ids.get(shard.as_ref()) {
                Some(&id) => id,
                None => {
                    let id = u32::try_from(next).map_err(de::Error::custom)?;
                    ids.insert(shard.clone(), id);
                    self.out
                        .shard_names
                        .push((shard.clone(), self.out.entries.len()));
                    id
                }
            };
            last = Some((shard, id));
            self.out.entries.push((name, id));
        }
        Ok(())
    }
}
