//! A minimal safetensors reader: an 8-byte little-endian header length, a JSON header
//! (`name → {dtype, shape, data_offsets}`), then raw little-endian tensor bytes — all read
//! through one mmap per shard. Float tensors (F32/F16/BF16) become [`QMatrix`] views into the
//! map without copying.
//!
//! **Invariant:** every tensor kept in a [`SafetensorsFile`] lies within the map and its byte
//! length equals `elements × dtype size`, checked at open.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde_json::Value;

use crate::quant::{GgmlType, QMatrix, TensorBytes};

use super::ModelError;

/// One tensor's place in a shard.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    /// `F32`, `F16`, `BF16`, or another safetensors dtype name we cannot use.
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    pub start: usize,
    pub len: usize,
}

/// One mmapped `.safetensors` file.
pub struct SafetensorsFile {
    pub path: PathBuf,
    map: Arc<Mmap>,
    pub tensors: HashMap<String, TensorEntry>,
}

fn dtype_size(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
        _ => return None,
    })
}

impl SafetensorsFile {
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: read-only map; like every mmap loader we rely on the file not being
        // truncated while the model is loaded.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let tensors = parse_header(path, &map)?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map: Arc::new(map),
            tensors,
        })
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry, ModelError> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    /// A `U8` tensor's shape and bytes (MXFP4 blocks and scales).
    pub fn bytes_u8(&self, name: &str) -> Result<(&[usize], &[u8]), ModelError> {
        let e = self.entry(name)?;
        if e.dtype != "U8" {
            return Err(ModelError::Tensor {
                name: name.into(),
                why: format!("dtype {} where U8 bytes were expected", e.dtype),
            });
        }
        Ok((&e.shape, &self.map[e.start..e.start + e.len]))
    }

    /// A 1-D or 2-D float tensor as a matrix view into the map.
    pub fn matrix(&self, name: &str) -> Result<QMatrix, ModelError> {
        let e = self.entry(name)?;
        let dtype = float_type(name, &e.dtype)?;
        let (rows, cols) = match e.shape.as_slice() {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            other => {
                return Err(ModelError::Tensor {
                    name: name.into(),
                    why: format!("expected a matrix, got shape {other:?}"),
                })
            }
        };
        let data = TensorBytes::Mapped {
            map: Arc::clone(&self.map),
            offset: e.start,
            len: e.len,
        };
        QMatrix::new(dtype, rows, cols, data).map_err(|err| ModelError::Tensor {
            name: name.into(),
            why: err.to_string(),
        })
    }

    /// A 3-D float tensor `[slabs, rows, cols]` (stacked experts) as one `[slabs × rows,
    /// cols]` matrix view, and its slab count.
    pub fn stacked(&self, name: &str) -> Result<(QMatrix, usize), ModelError> {
        let e = self.entry(name)?;
        let dtype = float_type(name, &e.dtype)?;
        let [slabs, rows, cols] = e.shape[..] else {
            return Err(ModelError::Tensor {
                name: name.into(),
                why: format!("expected a 3-D stacked tensor, got shape {:?}", e.shape),
            });
        };
        let data = TensorBytes::Mapped {
            map: Arc::clone(&self.map),
            offset: e.start,
            len: e.len,
        };
        let m =
            QMatrix::new(dtype, slabs * rows, cols, data).map_err(|err| ModelError::Tensor {
                name: name.into(),
                why: err.to_string(),
            })?;
        Ok((m, slabs))
    }

    /// Any float tensor converted to f32, in row-major order.
    pub fn vector(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        let e = self.entry(name)?;
        let bytes = &self.map[e.start..e.start + e.len];
        Ok(match float_type(name, &e.dtype)? {
            GgmlType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            GgmlType::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            _ => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
        })
    }
}

fn float_type(name: &str, dtype: &str) -> Result<GgmlType, ModelError> {
    match dtype {
        "F32" => Ok(GgmlType::F32),
        "F16" => Ok(GgmlType::F16),
        "BF16" => Ok(GgmlType::BF16),
        other => Err(ModelError::Tensor {
            name: name.into(),
            why: format!("unsupported dtype {other} (need F32, F16 or BF16)"),
        }),
    }
}

/// Parses and bounds-checks the header of a mapped safetensors file.
fn parse_header(path: &Path, map: &[u8]) -> Result<HashMap<String, TensorEntry>, ModelError> {
    let bad = |why: String| ModelError::Safetensors {
        path: path.to_path_buf(),
        why,
    };
    let len_bytes: [u8; 8] = map
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| bad("shorter than the 8-byte header length".into()))?;
    let header_len = usize::try_from(u64::from_le_bytes(len_bytes))
        .map_err(|_| bad("header length overflows".into()))?;
    let data_start = 8usize.checked_add(header_len).filter(|&e| e <= map.len());
    let data_start =
        data_start.ok_or_else(|| bad(format!("header length {header_len} exceeds the file")))?;
    let header: Value = serde_json::from_slice(&map[8..data_start])
        .map_err(|e| bad(format!("header JSON: {e}")))?;
    let obj = header
        .as_object()
        .ok_or_else(|| bad("header is not a JSON object".into()))?;
    let mut tensors = HashMap::with_capacity(obj.len());
    for (name, info) in obj {
        if name == "__metadata__" {
            continue;
        }
        let entry = parse_entry(info, data_start, map.len())
            .map_err(|why| bad(format!("tensor `{name}`: {why}")))?;
        tensors.insert(name.clone(), entry);
    }
    Ok(tensors)
}

fn parse_entry(info: &Value, data_start: usize, file_len: usize) -> Result<TensorEntry, String> {
    let dtype = info
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or("missing dtype")?;
    let shape = info
        .get("shape")
        .and_then(Value::as_array)
        .ok_or("missing shape")?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or("shape is not a list of sizes")?;
    let offsets = info
        .get("data_offsets")
        .and_then(Value::as_array)
        .ok_or("missing data_offsets")?;
    let off = |i: usize| {
        offsets
            .get(i)
            .and_then(Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
    };
    let (begin, end) = match (off(0), off(1)) {
        (Some(b), Some(e)) if b <= e && offsets.len() == 2 => (b, e),
        _ => return Err("data_offsets must be [begin, end] with begin <= end".into()),
    };
    let start = data_start.checked_add(begin).ok_or("offset overflows")?;
    let stop = data_start
        .checked_add(end)
        .filter(|&s| s <= file_len)
        .ok_or("data lies outside the file")?;
    let elems = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("shape overflows")?;
    let want = dtype_size(dtype).and_then(|s| elems.checked_mul(s));
    if want.is_some_and(|w| w != end - begin) {
        return Err(format!(
            "{} bytes for shape {shape:?} of {dtype}",
            end - begin
        ));
    }
    Ok(TensorEntry {
        dtype: dtype.to_string(),
        shape,
        start,
        len: stop - start,
    })
}

/// All shards of a checkpoint, with a name → shard index.
pub struct SafetensorsSet {
    files: Vec<SafetensorsFile>,
    index: HashMap<String, usize>,
}

impl SafetensorsSet {
    /// Opens `model.safetensors`, or every shard listed in `model.safetensors.index.json`,
    /// or (failing both) every `*.safetensors` file in `dir`.
    pub fn open_dir(dir: &Path) -> Result<Self, ModelError> {
        let single = dir.join("model.safetensors");
        let index_path = dir.join("model.safetensors.index.json");
        let paths = if single.is_file() {
            vec![single]
        } else if index_path.is_file() {
            shard_paths_from_index(dir, &index_path)?
        } else {
            let io = |source| ModelError::Io {
                path: dir.to_path_buf(),
                source,
            };
            let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            v.sort();
            v
        };
        if paths.is_empty() {
            return Err(ModelError::Safetensors {
                path: dir.to_path_buf(),
                why: "no .safetensors files".into(),
            });
        }
        let files = paths
            .iter()
            .map(|p| SafetensorsFile::open(p))
            .collect::<Result<Vec<_>, _>>()?;
        let mut index = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for name in f.tensors.keys() {
                index.insert(name.clone(), i);
            }
        }
        Ok(SafetensorsSet { files, index })
    }

    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn file(&self, name: &str) -> Result<&SafetensorsFile, ModelError> {
        self.index
            .get(name)
            .map(|&i| &self.files[i])
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    pub fn matrix(&self, name: &str) -> Result<QMatrix, ModelError> {
        self.file(name)?.matrix(name)
    }

    pub fn vector(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        self.file(name)?.vector(name)
    }

    pub fn stacked(&self, name: &str) -> Result<(QMatrix, usize), ModelError> {
        self.file(name)?.stacked(name)
    }

    /// All tensor names (for detecting name prefixes).
    pub fn bytes_u8(&self, name: &str) -> Result<(&[usize], &[u8]), ModelError> {
        self.file(name)?.bytes_u8(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }
}

fn shard_paths_from_index(dir: &Path, index_path: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let text = std::fs::read(index_path).map_err(|source| ModelError::Io {
        path: index_path.to_path_buf(),
        source,
    })?;
    let v: Value = serde_json::from_slice(&text).map_err(|source| ModelError::Json {
        path: index_path.to_path_buf(),
        source,
    })?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| ModelError::Safetensors {
            path: index_path.to_path_buf(),
            why: "no weight_map object".into(),
        })?;
    let mut shards: Vec<&str> = map.values().filter_map(Value::as_str).collect();
    shards.sort_unstable();
    shards.dedup();
    for s in &shards {
        // A shard name is a file in `dir`, never a path elsewhere.
        if s.contains('/') || s.contains('\\') || *s == ".." {
            return Err(ModelError::Safetensors {
                path: index_path.to_path_buf(),
                why: format!("bad shard name {s:?}"),
            });
        }
    }
    Ok(shards.into_iter().map(|s| dir.join(s)).collect())
}
