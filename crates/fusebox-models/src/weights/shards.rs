//! Hugging Face checkpoint directories: `config.json` plus one `model.safetensors` or
//! several shards (named by `model.safetensors.index.json`, or every `*.safetensors`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use fusebox::{Error, Result, Tensor};
use serde_json::Value as Json;

use crate::files::{read_json, MAX_CONFIG_BYTES};
use crate::safetensors::SafeTensors;

/// The safetensors shards of a directory with a name → shard lookup.
pub struct Shards {
    files: Vec<SafeTensors>,
    index: BTreeMap<String, usize>,
    dir: PathBuf,
}

impl Shards {
    /// Reads the shards of `dir`: those `model.safetensors.index.json` names, else every
    /// `*.safetensors`. A tensor in two shards, or one the index places in another shard
    /// than the one holding it, is an error naming it.
    pub fn open(dir: &Path) -> Result<Shards> {
        let io = |e: std::io::Error| Error::Io(format!("{}: {e}", dir.display()));
        let index_path = dir.join("model.safetensors.index.json");
        let mut weight_map: Option<BTreeMap<String, String>> = None;
        let names: Vec<String> = if index_path.exists() {
            let v = read_json(&index_path, "the shard index", MAX_CONFIG_BYTES)?;
            let map = v["weight_map"].as_object().ok_or_else(|| {
                Error::Io(format!(
                    "{}: expected a 'weight_map' object, found {}",
                    index_path.display(),
                    v["weight_map"]
                ))
            })?;
            let mut wm = BTreeMap::new();
            for (tensor, file) in map {
                let file = file.as_str().ok_or_else(|| {
                    Error::Io(format!(
                        "{}: weight_map['{tensor}']: expected a file name, found {file}",
                        index_path.display()
                    ))
                })?;
                wm.insert(tensor.clone(), file.to_owned());
            }
            let mut files: Vec<String> = wm.values().cloned().collect();
            files.sort();
            files.dedup();
            weight_map = Some(wm);
            files
        } else {
            let mut files: Vec<String> = std::fs::read_dir(dir)
                .map_err(io)?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".safetensors"))
                .collect();
            files.sort();
            files
        };
        if names.is_empty() {
            return Err(Error::Io(format!("{}: no *.safetensors files", dir.display())));
        }
        let mut files = Vec::new();
        let mut index = BTreeMap::new();
        for name in &names {
            if name.is_empty() || name.contains('/') || name.contains('\\') || name.starts_with("..") {
                return Err(Error::Io(format!("{}: shard name '{name}' is not a plain file name", dir.display())));
            }
            let path = dir.join(name);
            let st = SafeTensors::read(&path)?;
            for tensor in st.tensors.keys() {
                if let Some(&other) = index.get(tensor) {
                    return Err(Error::Io(format!(
                        "{}: tensor '{tensor}' is in two shards: {} and {name}",
                        dir.display(),
                        names[other]
                    )));
                }
                if let Some(wm) = &weight_map {
                    match wm.get(tensor) {
                        Some(f) if f == name => {}
                        Some(f) => {
                            return Err(Error::Io(format!(
                                "{}: tensor '{tensor}' is in {name}, but the index places it in {f}",
                                dir.display()
                            )))
                        }
                        None => {
                            return Err(Error::Io(format!(
                                "{}: tensor '{tensor}' in {name} is not in the index's weight_map",
                                dir.display()
                            )))
                        }
                    }
                }
                index.insert(tensor.clone(), files.len());
            }
            files.push(st);
        }
        if let Some(wm) = &weight_map {
            if let Some((tensor, file)) = wm.iter().find(|(t, _)| !index.contains_key(*t)) {
                return Err(Error::Io(format!(
                    "{}: the index places tensor '{tensor}' in {file}, which does not hold it",
                    dir.display()
                )));
            }
        }
        Ok(Shards { files, index, dir: dir.to_path_buf() })
    }

    /// Whether a tensor named `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Tensor `name` (host), or an error naming it and the directory.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| Error::Io(format!("{}: missing tensor '{name}'", self.dir.display())))?;
        self.files[i].tensor(name)
    }

    /// Tensor `name` (host) for a loader, which will not read it again: the mapped pages
    /// are given back as it is copied (see
    /// [`SafeTensors::take_tensor`](crate::safetensors::SafeTensors::take_tensor)).
    pub fn take(&self, name: &str) -> Result<Tensor> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| Error::Io(format!("{}: missing tensor '{name}'", self.dir.display())))?;
        self.files[i].take_tensor(name)
    }

    /// Rows `rows` (first axis) of tensor `name`, read as [`take`](Self::take) reads.
    pub fn take_rows(&self, name: &str, rows: std::ops::Range<usize>) -> Result<Tensor> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| Error::Io(format!("{}: missing tensor '{name}'", self.dir.display())))?;
        self.files[i].take_tensor_rows(name, rows)
    }

    /// The dtype of tensor `name`, or an error naming it and the directory.
    pub fn dtype(&self, name: &str) -> Result<fusebox::DType> {
        let &i = self
            .index
            .get(name)
            .ok_or_else(|| Error::Io(format!("{}: missing tensor '{name}'", self.dir.display())))?;
        self.files[i]
            .tensors
            .get(name)
            .map(|t| t.dtype)
            .ok_or_else(|| Error::Io(format!("{}: missing tensor '{name}'", self.dir.display())))
    }
}

/// Reads `dir/config.json` as JSON (a regular file of at most [`MAX_CONFIG_BYTES`]).
pub fn read_config(dir: &Path) -> Result<Json> {
    read_json(&dir.join("config.json"), "config.json", MAX_CONFIG_BYTES)
}
