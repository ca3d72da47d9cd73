//! The key-value metadata of a GGUF file, in file order, with typed getters.

use std::collections::HashMap;

use fusebox::{Error, Result};

use super::value::{Array, Value};

/// The metadata section: keys (unique, as the format requires) with values.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

fn wrong_type(key: &str, expected: &str, got: &Value) -> Error {
    Error::Io(format!("gguf: metadata '{key}': expected {expected}, got {}", got.describe()))
}

fn missing(key: &str) -> Error {
    Error::Io(format!("gguf: metadata '{key}' is missing"))
}

impl Metadata {
    /// Adds an entry; returns `false` (and keeps the first) when the key is already present.
    pub(crate) fn insert(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// A string value; `Ok(None)` when absent, an error when present with another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| wrong_type(key, "a string", v)),
        }
    }

    /// A non-negative integer of any integer type; `Ok(None)` when absent.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.to_u64().map(Some).ok_or_else(|| wrong_type(key, "a non-negative integer", v)),
        }
    }

    /// A non-negative integer that fits `u32`; `Ok(None)` when absent.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>> {
        match self.get_u64(key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| Error::Io(format!("gguf: metadata '{key}': {v} does not fit a u32"))),
        }
    }

    /// A float (f32 or f64, or an integer); `Ok(None)` when absent.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.to_f64().map(Some).ok_or_else(|| wrong_type(key, "a number", v)),
        }
    }

    /// A bool; `Ok(None)` when absent.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| wrong_type(key, "a bool", v)),
        }
    }

    /// An array; `Ok(None)` when absent.
    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_array().map(Some).ok_or_else(|| wrong_type(key, "an array", v)),
        }
    }

    /// An array of strings; `Ok(None)` when absent.
    pub fn get_strings(&self, key: &str) -> Result<Option<&[String]>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .and_then(Array::as_strings)
                .map(Some)
                .ok_or_else(|| wrong_type(key, "an array of strings", v)),
        }
    }

    /// A string that must be present.
    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.get_str(key)?.ok_or_else(|| missing(key))
    }

    /// A non-negative integer that must be present.
    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.get_u64(key)?.ok_or_else(|| missing(key))
    }

    /// A `u32` that must be present.
    pub fn require_u32(&self, key: &str) -> Result<u32> {
        self.get_u32(key)?.ok_or_else(|| missing(key))
    }

    /// A float that must be present.
    pub fn require_f64(&self, key: &str) -> Result<f64> {
        self.get_f64(key)?.ok_or_else(|| missing(key))
    }

    /// An array of strings that must be present.
    pub fn require_strings(&self, key: &str) -> Result<&[String]> {
        self.get_strings(key)?.ok_or_else(|| missing(key))
    }
}
