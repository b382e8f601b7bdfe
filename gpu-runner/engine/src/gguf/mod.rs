//! GGUF v2/v3 reader: memory-maps a model file, parses its metadata and tensor infos, and
//! hands out tensors as quantized [`QMatrix`] views into the map (no copy) or as
//! dequantized f32 vectors for the small tensors (norms, biases).
//!
//! **Invariant:** every tensor of a [`GgufFile`] lies within the mapped file and has a
//! supported type — checked once in [`GgufFile::open`], so accessors cannot read out of
//! bounds whatever the file said.

mod error;
mod reader;
#[cfg(test)]
mod tests;
mod value;
#[cfg(test)]
pub(crate) mod writer;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::quant::{Activations, GgmlType, Layout, QMatrix, TensorBytes};

pub use error::GgufError;
pub use value::MetaValue;

/// Where one tensor's data is and how it is laid out.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Extent per dimension in ggml order: `dims[0]` is the contiguous (column) dimension.
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements, or `None` on overflow.
    pub fn n_elements(&self) -> Option<u64> {
        self.dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    /// Bytes the data occupies, or `None` if the shape is not whole blocks or overflows.
    pub fn n_bytes(&self) -> Option<u64> {
        let block = self.dtype.block_elems() as u64;
        let cols = self.dims.first().copied().unwrap_or(1);
        if !cols.is_multiple_of(block) {
            return None;
        }
        (self.n_elements()? / block).checked_mul(self.dtype.block_bytes() as u64)
    }
}

/// An opened GGUF file: metadata, tensor infos, and the mapped bytes the tensors live in.
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<TensorInfo>,
    map: Arc<Mmap>,
    data_offset: usize,
    alignment: usize,
    by_name: BTreeMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses `path`, validating that every tensor lies within the file.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let file = File::open(path)?;
        // SAFETY: the map is read-only; like every mmap-based model loader we rely on the
        // model file not being truncated or rewritten while the server runs.
        let map = unsafe { Mmap::map(&file)? };
        let header = reader::parse_header(&map)?;
        let mut by_name = BTreeMap::new();
        for (i, t) in header.tensors.iter().enumerate() {
            by_name.insert(t.name.clone(), i);
        }
        let gguf = GgufFile {
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            map: Arc::new(map),
            data_offset: header.data_offset,
            alignment: header.alignment,
            by_name,
        };
        for t in &gguf.tensors {
            gguf.byte_range(t)?;
        }
        Ok(gguf)
    }

    /// Alignment of the tensor data (`general.alignment`, default 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Absolute file offset where the tensor data section begins.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Size of the mapped file in bytes.
    pub fn file_len(&self) -> usize {
        self.map.len()
    }

    /// Absolute `(offset, len)` of a tensor's bytes in the file, bounds-checked.
    pub fn byte_range(&self, t: &TensorInfo) -> Result<(usize, usize), GgufError> {
        let oob = || GgufError::OutOfBounds {
            tensor: t.name.clone(),
        };
        let len = usize::try_from(t.n_bytes().ok_or_else(oob)?).map_err(|_| oob())?;
        let start = usize::try_from(t.offset)
            .ok()
            .and_then(|o| o.checked_add(self.data_offset))
            .ok_or_else(oob)?;
        match start.checked_add(len) {
            Some(end) if end <= self.map.len() => Ok((start, len)),
            _ => Err(oob()),
        }
    }

    /// The raw bytes of a tensor.
    pub fn tensor_data(&self, t: &TensorInfo) -> Result<&[u8], GgufError> {
        let (start, len) = self.byte_range(t)?;
        Ok(&self.map[start..start + len])
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor as a quantized matrix view into the map. ggml's `[cols, rows]` becomes
    /// `rows × cols`; a 1-D tensor is one row; extra trailing dimensions must be 1.
    pub fn matrix(&self, name: &str) -> Result<QMatrix, GgufError> {
        let t = self
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        let (rows, cols) = matrix_shape(t)?;
        self.view(t, rows, cols)
    }

    /// A 3-D tensor of `slabs` stacked matrices (ggml ne = [cols, rows, slabs]: llama.cpp's
    /// `ffn_*_exps` expert tensors) as one `[slabs × rows, cols]` view, and `slabs`.
    pub fn stacked_matrix(&self, name: &str) -> Result<(QMatrix, usize), GgufError> {
        let t = self
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        let not_stacked = || GgufError::NotAMatrix {
            tensor: t.name.clone(),
            dims: t.dims.len(),
        };
        let dims: Vec<usize> = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| not_stacked()))
            .collect::<Result<_, _>>()?;
        let [cols, rows, slabs] = dims[..] else {
            return Err(not_stacked());
        };
        let all_rows = rows.checked_mul(slabs).ok_or_else(not_stacked)?;
        Ok((self.view(t, all_rows, cols)?, slabs))
    }

    fn view(&self, t: &TensorInfo, rows: usize, cols: usize) -> Result<QMatrix, GgufError> {
        let (offset, len) = self.byte_range(t)?;
        Ok(QMatrix {
            dtype: t.dtype,
            rows,
            cols,
            data: TensorBytes::Mapped {
                map: Arc::clone(&self.map),
                offset,
                len,
            },
            layout: Layout::Rows,
            activations: Activations::Quantized,
        })
    }

    /// Any tensor, whatever its rank and type, dequantized to f32 in ggml element order.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let t = self
            .tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.into()))?;
        let bytes = self.tensor_data(t)?;
        let n = t.n_elements().and_then(|n| usize::try_from(n).ok());
        let n = n.ok_or_else(|| GgufError::OutOfBounds {
            tensor: name.into(),
        })?;
        let mut out = vec![0f32; n];
        crate::quant::dequantize(t.dtype, bytes, &mut out);
        Ok(out)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'a MetaValue) -> Option<T>,
    ) -> Result<T, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| GgufError::MissingKey(key.into()))?;
        convert(v).ok_or_else(|| GgufError::WrongType {
            key: key.into(),
            expected,
            found: v.type_name(),
        })
    }

    /// An integer key that fits in u32 (any integer width accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.typed(key, "u32", |v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok())
        })
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.typed(key, "u64", MetaValue::as_u64)
    }

    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.typed(key, "i64", MetaValue::as_i64)
    }

    /// A float key (integers are converted).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.typed(key, "f32", MetaValue::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.typed(key, "bool", MetaValue::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.typed(key, "string", MetaValue::as_str)
    }

    pub fn get_array(&self, key: &str) -> Result<&[MetaValue], GgufError> {
        self.typed(key, "array", MetaValue::as_array)
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`), borrowed.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.typed(key, "array of string", |v| {
            v.as_array()?.iter().map(MetaValue::as_str).collect()
        })
    }

    /// An array of numbers as f32 (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.typed(key, "array of f32", |v| {
            v.as_array()?.iter().map(MetaValue::as_f32).collect()
        })
    }

    /// An array of integers that fit in i32 (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.typed(key, "array of i32", |v| {
            v.as_array()?
                .iter()
                .map(|x| x.as_i64().and_then(|i| i32::try_from(i).ok()))
                .collect()
        })
    }

    /// An array of non-negative integers as u32.
    pub fn get_u32_array(&self, key: &str) -> Result<Vec<u32>, GgufError> {
        self.typed(key, "array of u32", |v| {
            v.as_array()?
                .iter()
                .map(|x| x.as_u64().and_then(|i| u32::try_from(i).ok()))
                .collect()
        })
    }
}

/// `(rows, cols)` of a tensor viewed as a matrix.
fn matrix_shape(t: &TensorInfo) -> Result<(usize, usize), GgufError> {
    let not_matrix = || GgufError::NotAMatrix {
        tensor: t.name.clone(),
        dims: t.dims.len(),
    };
    if t.dims.iter().skip(2).any(|&d| d != 1) {
        return Err(not_matrix());
    }
    let cols = t.dims.first().copied().unwrap_or(1);
    let rows = t.dims.get(1).copied().unwrap_or(1);
    let to_usize = |v: u64| usize::try_from(v).map_err(|_| not_matrix());
    Ok((to_usize(rows)?, to_usize(cols)?))
}
