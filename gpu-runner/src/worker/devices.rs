//! What a runner tells the registry about its hardware: its CPU (cores, memory) and every
//! CUDA device the driver reports (name, memory, compute capability). Without an NVIDIA
//! driver the list simply has no GPU, and the log says so once at start.

use serde_json::{json, Value};

use fallow_engine::backend::cuda::device;

/// The runner's devices as registry JSON: the CPU first, then GPUs by ordinal.
pub fn describe() -> Value {
    let mut list = vec![cpu()];
    match device::probe_all() {
        Ok(gpus) if gpus.is_empty() => tracing::info!("no CUDA device present"),
        Ok(gpus) => {
            for g in gpus {
                tracing::info!(device = %g, "CUDA device");
                list.push(json!({
                    "kind": "cuda",
                    "ordinal": g.ordinal,
                    "name": g.name,
                    "memory_bytes": g.total_bytes,
                    "free_bytes": g.free_bytes,
                    "compute_capability": format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
                }));
            }
        }
        Err(e) => tracing::info!(reason = %e, "no usable CUDA device"),
    }
    Value::Array(list)
}

fn cpu() -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut cpu = json!({ "kind": "cpu", "cores": cores });
    if let Some(bytes) = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .as_deref()
        .and_then(mem_total_bytes)
    {
        cpu["memory_bytes"] = json!(bytes);
    }
    cpu
}

/// `MemTotal:   16384 kB` → bytes.
fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_from_meminfo() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total_bytes(text), Some(24_576_000 * 1024));
        assert_eq!(mem_total_bytes("nothing here"), None);
    }

    #[test]
    fn the_cpu_is_always_listed_first_and_gpus_only_when_present() {
        let devices = describe();
        let list = devices.as_array().expect("a list");
        assert_eq!(list[0]["kind"], "cpu");
        assert!(list[0]["cores"].as_u64().unwrap_or(0) >= 1);
        let gpus = list.iter().filter(|d| d["kind"] == "cuda").count();
        let present = device::probe_all().map(|g| g.len()).unwrap_or(0);
        assert_eq!(gpus, present);
    }
}
