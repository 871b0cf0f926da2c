//! Metadata that travels with a tensor: an insertion-ordered map of string keys to JSON-like values (plus bytes
//! and tuples), the same model as C++'s `tw::Metadata` and Python's dicts.
use std::os::raw::{c_char, c_int};
use std::ptr::NonNull;

use crate::error::{check, Error, ErrorKind, Result};
use crate::ffi;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    Dict(Metadata),
}

/// Insertion-ordered string keys to `Value`s. Inserting an existing key replaces its value in place.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
}

impl Metadata {
    pub fn new() -> Metadata {
        Metadata::default()
    }
    /// Inserts or replaces `key` (a replaced key keeps its position).
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Metadata {
        let key = key.into();
        let value = value.into();
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.entries.push((key, value)),
        }
        self
    }
    /// Builder form of `insert`.
    pub fn with(mut self, key: impl Into<String>, value: impl Into<Value>) -> Metadata {
        self.insert(key, value);
        self
    }
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(i).1)
    }
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Entries in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }
}

impl<K: Into<String>, V: Into<Value>> FromIterator<(K, V)> for Metadata {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Metadata {
        let mut m = Metadata::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}
macro_rules! int_values {
    ($($t:ty),*) => {$(
        impl From<$t> for Value { fn from(v: $t) -> Value { Value::Int(i64::from(v)) } }
    )*};
}
int_values!(i8, i16, i32, i64, u8, u16, u32);
impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}
impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::Float(f64::from(v))
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Str(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Str(v)
    }
}
impl From<Metadata> for Value {
    fn from(v: Metadata) -> Value {
        Value::Dict(v)
    }
}
impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::None, Into::into)
    }
}

// ---- conversion through the C ABI's tw_value trees ---------------------------------------------------------------

/// An owned tw_value tree, freed on drop.
pub(crate) struct RawValue(NonNull<ffi::tw_value>);

impl RawValue {
    /// Takes ownership of a tree the C ABI returned (NULL: the constructor failed, out of memory).
    ///
    /// # Safety
    /// `p` is null or an owned tree nothing else frees.
    pub(crate) unsafe fn new(p: *mut ffi::tw_value) -> Result<RawValue> {
        NonNull::new(p).map(RawValue).ok_or_else(|| Error::from_status(ffi::TW_ERR_OUT_OF_MEMORY))
    }
    pub(crate) fn as_ptr(&self) -> *const ffi::tw_value {
        self.0.as_ptr()
    }
    fn into_raw(self) -> *mut ffi::tw_value {
        let p = self.0.as_ptr();
        std::mem::forget(self);
        p
    }
}

impl Drop for RawValue {
    fn drop(&mut self) {
        // SAFETY: we own the tree.
        unsafe { ffi::tw_value_free(self.0.as_ptr()) }
    }
}

/// Nesting deeper than this is refused, as the encoding refuses it: checked before recursing, so a hostile depth
/// is an error rather than an overflowed stack.
const MAX_DEPTH: usize = 64;

pub(crate) fn metadata_to_raw(m: &Metadata) -> Result<RawValue> {
    dict_to_raw(m, 0)
}

fn dict_to_raw(m: &Metadata, depth: usize) -> Result<RawValue> {
    if depth > MAX_DEPTH {
        return Err(Error::new(ErrorKind::InvalidArgument, format!("metadata nested deeper than {MAX_DEPTH} levels")));
    }
    // SAFETY: constructors return owned trees or NULL.
    let dict = unsafe { RawValue::new(ffi::tw_value_dict()) }?;
    for (k, v) in &m.entries {
        let item = value_to_raw(v, depth + 1)?;
        // SAFETY: dict is a live dict; item's ownership moves to the call (consumed even on failure).
        check(unsafe { ffi::tw_value_dict_set(dict.0.as_ptr(), k.as_ptr() as *const c_char, k.len(), item.into_raw()) })?;
    }
    Ok(dict)
}

fn value_to_raw(v: &Value, depth: usize) -> Result<RawValue> {
    if depth > MAX_DEPTH {
        return Err(Error::new(ErrorKind::InvalidArgument, format!("metadata nested deeper than {MAX_DEPTH} levels")));
    }
    // SAFETY (every call below): constructors return owned trees or NULL; containers consume what they are given.
    unsafe {
        match v {
            Value::None => RawValue::new(ffi::tw_value_none()),
            Value::Bool(b) => RawValue::new(ffi::tw_value_bool(c_int::from(*b))),
            Value::Int(i) => RawValue::new(ffi::tw_value_int(*i)),
            Value::Float(f) => RawValue::new(ffi::tw_value_float(*f)),
            Value::Str(s) => RawValue::new(ffi::tw_value_string(s.as_ptr() as *const c_char, s.len())),
            Value::Bytes(b) => RawValue::new(ffi::tw_value_bytes(b.as_ptr().cast(), b.len())),
            Value::List(items) | Value::Tuple(items) => {
                let c = RawValue::new(if matches!(v, Value::List(_)) { ffi::tw_value_list() } else { ffi::tw_value_tuple() })?;
                for item in items {
                    let raw = value_to_raw(item, depth + 1)?;
                    check(ffi::tw_value_append(c.0.as_ptr(), raw.into_raw()))?;
                }
                Ok(c)
            }
            Value::Dict(m) => dict_to_raw(m, depth),
        }
    }
}

/// Reads a dict tree (from another process, perhaps: every string is checked to be UTF-8).
pub(crate) fn metadata_from_raw(p: *const ffi::tw_value) -> Result<Metadata> {
    match value_from_raw(p)? {
        Value::Dict(m) => Ok(m),
        other => Err(Error::new(ErrorKind::TypeMismatch, format!("metadata is not a dict: {other:?}"))),
    }
}

/// A copy of a string or bytes value's contents (the tree owns the original).
fn bytes_of(p: *const ffi::tw_value) -> Result<Vec<u8>> {
    let mut data: *const c_char = std::ptr::null();
    let mut len = 0usize;
    check(unsafe { ffi::tw_value_get_data(p, &mut data, &mut len) })?;
    if len == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: p is a live string/bytes value: data points at len bytes owned by the tree, copied here at once.
    Ok(unsafe { std::slice::from_raw_parts(data as *const u8, len) }.to_vec())
}

fn string_of(p: *const ffi::tw_value, what: &str) -> Result<String> {
    String::from_utf8(bytes_of(p)?)
        .map_err(|_| Error::new(ErrorKind::InvalidArgument, format!("metadata {what} is not valid UTF-8")))
}

fn value_from_raw(p: *const ffi::tw_value) -> Result<Value> {
    // SAFETY: p is a live value of a tree the caller owns; items and keys are borrowed from it and copied.
    unsafe {
        Ok(match ffi::tw_value_get_kind(p) {
            ffi::TW_VALUE_NONE => Value::None,
            ffi::TW_VALUE_BOOL => {
                let mut b = 0;
                check(ffi::tw_value_get_bool(p, &mut b))?;
                Value::Bool(b != 0)
            }
            ffi::TW_VALUE_INT => {
                let mut i = 0;
                check(ffi::tw_value_get_int(p, &mut i))?;
                Value::Int(i)
            }
            ffi::TW_VALUE_FLOAT => {
                let mut f = 0.0;
                check(ffi::tw_value_get_float(p, &mut f))?;
                Value::Float(f)
            }
            ffi::TW_VALUE_STRING => Value::Str(string_of(p, "string")?),
            ffi::TW_VALUE_BYTES => Value::Bytes(bytes_of(p)?),
            k @ (ffi::TW_VALUE_LIST | ffi::TW_VALUE_TUPLE) => {
                let n = ffi::tw_value_len(p);
                let mut items = Vec::with_capacity(n.min(1 << 16));
                for i in 0..n {
                    items.push(value_from_raw(ffi::tw_value_item(p, i))?);
                }
                if k == ffi::TW_VALUE_LIST {
                    Value::List(items)
                } else {
                    Value::Tuple(items)
                }
            }
            ffi::TW_VALUE_DICT => {
                let n = ffi::tw_value_len(p);
                let mut m = Metadata { entries: Vec::with_capacity(n.min(1 << 16)) };
                for i in 0..n {
                    let mut key: *const c_char = std::ptr::null();
                    let mut len = 0usize;
                    check(ffi::tw_value_key(p, i, &mut key, &mut len))?;
                    let key = String::from_utf8(std::slice::from_raw_parts(key as *const u8, len).to_vec())
                        .map_err(|_| Error::new(ErrorKind::InvalidArgument, "metadata key is not valid UTF-8"))?;
                    m.entries.push((key, value_from_raw(ffi::tw_value_item(p, i))?));
                }
                Value::Dict(m)
            }
            k => return Err(Error::new(ErrorKind::Unsupported, format!("metadata value of unknown kind {k}"))),
        })
    }
}
