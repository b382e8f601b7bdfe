//! The emulated CUDA driver (`cuda::emu::install_driver`), on which the CUDA conformance
//! suite runs where there is no GPU, refuses what a real driver refuses during a graph
//! capture and runs a captured graph only when it is launched: otherwise the suite could pass
//! there on code that fails on a GPU. Its own process (the driver takes the name `libcuda.so`);
//! skipped where a real driver is present or no C++ compiler is.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaStream};
use fallow_engine::backend::cuda::{device, emu};

fn emulated_stream() -> Option<(Arc<CudaContext>, Arc<CudaStream>)> {
    if device::driver_available() {
        eprintln!("SKIPPED: a real NVIDIA driver is here (the conformance suite runs on it)");
        return None;
    }
    if !emu::install_driver().expect("the emulated driver builds") {
        return None;
    }
    let ctx = device::open(0).expect("the emulated device opens");
    let stream = ctx.new_stream().expect("a stream");
    Some((ctx, stream))
}

fn begin(stream: &Arc<CudaStream>) {
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .expect("capture begins");
}

#[test]
fn a_captured_copy_runs_at_each_launch_of_its_graph_not_at_the_capture() {
    let Some((_ctx, stream)) = emulated_stream() else {
        return;
    };
    let src = stream.clone_htod(&[1u32, 2, 3, 4]).expect("upload");
    let mut dst = stream.alloc_zeros::<u32>(4).expect("alloc");
    begin(&stream);
    stream.memcpy_dtod(&src, &mut dst).expect("a captured copy");
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))
        .expect("capture ends")
        .expect("a graph");
    assert_eq!(stream.clone_dtoh(&dst).expect("download"), [0, 0, 0, 0]);
    graph.launch().expect("replay");
    assert_eq!(stream.clone_dtoh(&dst).expect("download"), [1, 2, 3, 4]);
    // A second launch copies again: the graph reads the source when it runs.
    stream
        .memcpy_htod(&[9u32, 9, 9, 9], &mut dst)
        .expect("overwrite");
    graph.launch().expect("replay");
    assert_eq!(stream.clone_dtoh(&dst).expect("download"), [1, 2, 3, 4]);
}

#[test]
fn a_capture_refuses_pageable_host_copies_and_allocations_as_the_driver_does() {
    let Some((_ctx, stream)) = emulated_stream() else {
        return;
    };
    let mut dst = stream.alloc_zeros::<u32>(4).expect("alloc");
    let pageable = vec![5u32; 4];
    begin(&stream);
    assert!(
        stream.memcpy_htod(&pageable, &mut dst).is_err(),
        "a copy from pageable memory inside a capture"
    );
    assert!(
        stream.end_capture(CUgraphInstantiate_flags(0)).is_err(),
        "the refused copy breaks the capture"
    );
    begin(&stream);
    assert!(
        stream.alloc_zeros::<u32>(16).is_err(),
        "an allocation inside a capture"
    );
    assert!(stream.end_capture(CUgraphInstantiate_flags(0)).is_err());
    // Outside a capture both work.
    stream
        .memcpy_htod(&pageable, &mut dst)
        .expect("a plain copy");
    assert_eq!(stream.clone_dtoh(&dst).expect("download"), [5, 5, 5, 5]);
}

#[test]
fn the_emulated_device_names_itself_so_tuning_knows_its_times_are_the_cpus() {
    let Some((ctx, _stream)) = emulated_stream() else {
        return;
    };
    assert_eq!(ctx.name().expect("a name"), device::EMULATED_DEVICE);
    assert!(device::is_emulated(&ctx));
}
