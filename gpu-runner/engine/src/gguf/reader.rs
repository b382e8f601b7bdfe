//! Parsing of the GGUF header (magic, version, metadata, tensor infos) from a byte slice.
//!
//! Every read is bounds-checked against the slice, and every length read from the file is
//! checked against the bytes that remain before anything is allocated for it, so a corrupt
//! or truncated file yields [`GgufError::Truncated`] naming what was being read — never a
//! panic and never a huge allocation. Array elements also draw on a budget for the whole
//! file ([`MAX_METADATA_ELEMENTS`]): an in-memory [`MetaValue`] is larger than its bytes,
//! so a corrupt count that swallows the tensor data as `u8`s must not multiply the file size.

use std::collections::BTreeMap;

use super::{GgufError, MetaValue, TensorInfo};
use crate::quant::GgmlType;

/// "GGUF" read as a little-endian u32.
const MAGIC: u32 = 0x4655_4747;
/// Nested arrays deeper than this are treated as corrupt (real files use depth 1).
const MAX_ARRAY_DEPTH: usize = 8;
/// Array elements allowed in all metadata together (real vocabularies: ~10^5–10^6).
const MAX_METADATA_ELEMENTS: usize = 1 << 24;
/// Up-front reservation limit for any count read from the file; beyond it, vectors grow
/// only as elements are actually parsed.
const MAX_RESERVE: usize = 1 << 16;
/// ggml's limit on tensor rank.
const MAX_DIMS: u32 = 4;

/// What the header says; the tensor data section starts at `data_offset`.
pub(super) struct Header {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: usize,
    pub data_offset: usize,
}

/// A little-endian cursor over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Array elements still allowed (see [`MAX_METADATA_ELEMENTS`]).
    element_budget: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated { what: what() });
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in the remaining bytes given each item takes at least
    /// `min_item_bytes`; anything larger is corruption, caught before allocating.
    fn count(
        &mut self,
        min_item_bytes: usize,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let n = self.u64(what)?;
        let max = self.remaining() / min_item_bytes.max(1);
        match usize::try_from(n) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(GgufError::Truncated { what: what() }),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.count(1, what)?;
        let bytes = self.take(len, what)?;
        // Vocabularies of some converters contain invalid UTF-8 fragments; keep them lossy
        // rather than rejecting the whole model.
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(
        &mut self,
        type_id: u32,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<MetaValue, GgufError> {
        Ok(match type_id {
            0 => MetaValue::U8(self.array::<1>(what)?[0]),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(what)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(what)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(what)?)),
            4 => MetaValue::U32(self.u32(what)?),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(what)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(what)?)),
            7 => MetaValue::Bool(self.array::<1>(what)?[0] != 0),
            8 => MetaValue::String(self.string(what)?),
            9 => self.array_value(depth, what)?,
            10 => MetaValue::U64(self.u64(what)?),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(what)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(what)?)),
            _ => {
                return Err(GgufError::Truncated {
                    what: format!("{} (unknown value type {type_id})", what()),
                })
            }
        })
    }

    fn array_value(
        &mut self,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<MetaValue, GgufError> {
        if depth >= MAX_ARRAY_DEPTH {
            return Err(GgufError::Truncated {
                what: format!("{} (arrays nested too deeply)", what()),
            });
        }
        let elem_type = self.u32(what)?;
        let n = self.count(min_value_bytes(elem_type), what)?;
        self.element_budget =
            self.element_budget
                .checked_sub(n)
                .ok_or_else(|| GgufError::Truncated {
                    what: format!("{} (metadata arrays too large)", what()),
                })?;
        let mut items = Vec::with_capacity(n.min(MAX_RESERVE));
        for _ in 0..n {
            items.push(self.value(elem_type, depth + 1, what)?);
        }
        Ok(MetaValue::Array(items))
    }
}

/// The fewest bytes one value of `type_id` can occupy (unknown types: 1, rejected later).
fn min_value_bytes(type_id: u32) -> usize {
    match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

/// Parses the whole header of a GGUF file held in `buf`.
pub(super) fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    parse_header_with_budget(buf, MAX_METADATA_ELEMENTS)
}

/// [`parse_header`] with `element_budget` array elements allowed in all metadata.
pub(super) fn parse_header_with_budget(
    buf: &[u8],
    element_budget: usize,
) -> Result<Header, GgufError> {
    let mut cur = Cursor {
        buf,
        pos: 0,
        element_budget,
    };
    let magic = cur
        .u32(&|| "magic".into())
        .map_err(|_| GgufError::BadMagic)?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic);
    }
    let version = cur.u32(&|| "version".into())?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    // A tensor info takes at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset) bytes;
    // a key/value pair at least 8 (key len) + 4 (type) + 1.
    let n_tensors = cur.count(24, &|| "tensor count".into())?;
    let n_kv = cur.count(13, &|| "metadata count".into())?;
    let metadata = parse_metadata(&mut cur, n_kv)?;
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a as usize,
            _ => {
                return Err(GgufError::Truncated {
                    what: "metadata `general.alignment` (must be a power of two)".into(),
                })
            }
        },
    };
    let mut tensors = Vec::with_capacity(n_tensors.min(MAX_RESERVE));
    for i in 0..n_tensors {
        tensors.push(parse_tensor_info(&mut cur, i)?);
    }
    let data_offset = cur.pos.div_ceil(alignment) * alignment;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn parse_metadata(
    cur: &mut Cursor<'_>,
    n_kv: usize,
) -> Result<BTreeMap<String, MetaValue>, GgufError> {
    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = cur.string(&|| format!("key of metadata entry {i}"))?;
        let what = || format!("metadata `{key}`");
        let type_id = cur.u32(&what)?;
        let value = cur.value(type_id, 0, &what)?;
        metadata.insert(key, value);
    }
    Ok(metadata)
}

fn parse_tensor_info(cur: &mut Cursor<'_>, index: usize) -> Result<TensorInfo, GgufError> {
    let name = cur.string(&|| format!("name of tensor info {index}"))?;
    let what = || format!("tensor info `{name}`");
    let n_dims = cur.u32(&what)?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::OutOfBounds { tensor: name });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(cur.u64(&what)?);
    }
    let type_id = cur.u32(&what)?;
    let offset = cur.u64(&what)?;
    let dtype = GgmlType::from_ggml_id(type_id).ok_or_else(|| GgufError::UnsupportedType {
        tensor: name.clone(),
        type_id,
    })?;
    Ok(TensorInfo {
        name,
        dims,
        dtype,
        offset,
    })
}
