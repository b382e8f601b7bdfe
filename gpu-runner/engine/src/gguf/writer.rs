//! Test helper: serialises a GGUF file (any version, metadata and tensors) so the reader can
//! be tested against hand-built files, including deliberately broken ones.

use super::MetaValue;
use crate::quant::GgmlType;

/// A tensor to write: ggml-order dims, type, and raw data bytes.
pub(crate) struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    pub data: Vec<u8>,
}

/// Builds GGUF bytes. Tensor data is laid out in order, each aligned to `alignment`.
pub(crate) struct GgufWriter {
    pub version: u32,
    pub alignment: usize,
    pub metadata: Vec<(String, MetaValue)>,
    pub tensors: Vec<TensorSpec>,
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => out.push(*x),
        MetaValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => out.push(u8::from(*x)),
        MetaValue::String(s) => put_str(out, s),
        MetaValue::Array(items) => {
            // An empty array's element type is arbitrary; u8 like llama.cpp's writer.
            let elem = items.first().map(type_id).unwrap_or(0);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        MetaValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            alignment: 32,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Adds a key; `general.alignment` also sets the alignment the data is written with.
    pub fn meta(mut self, key: &str, value: MetaValue) -> Self {
        if key == "general.alignment" {
            if let Some(a) = value.as_u64().filter(|a| a.is_power_of_two()) {
                self.alignment = a as usize;
            }
        }
        self.metadata.push((key.into(), value));
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], dtype: GgmlType, data: Vec<u8>) -> Self {
        self.tensors.push(TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            dtype,
            data,
        });
        self
    }

    fn align(&self, n: usize) -> usize {
        n.div_ceil(self.alignment) * self.alignment
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&type_id(value).to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.dtype.ggml_id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = self.align(offset + t.data.len());
        }
        // Padding goes before each tensor (never after the last) so that cutting even one
        // byte off the end truncates real data.
        for t in &self.tensors {
            out.resize(self.align(out.len()), 0);
            out.extend_from_slice(&t.data);
        }
        if self.tensors.is_empty() {
            out.resize(self.align(out.len()), 0);
        }
        out
    }
}
