//! Device memory the backend owns: a typed allocation with its raw address, since kernels
//! and cuBLAS take raw addresses and the backend runs everything on one stream (so cudarc's
//! per-buffer event tracking is switched off and ordering is the stream's).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};

use super::CudaError;

/// A device allocation of `len` elements.
pub struct DeviceBuf<T> {
    slice: CudaSlice<T>,
    ptr: u64,
}

impl<T> DeviceBuf<T> {
    /// Device address of element 0.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Device address of element `i`.
    pub fn at(&self, i: usize) -> u64 {
        self.ptr + (i * std::mem::size_of::<T>()) as u64
    }

    /// Elements allocated.
    pub fn len(&self) -> usize {
        self.slice.len()
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> DeviceBuf<T> {
    /// `len` zeroed elements (at least one, so the address is always valid).
    pub fn zeros(stream: &Arc<CudaStream>, len: usize) -> Result<Self, CudaError> {
        let slice = stream
            .alloc_zeros::<T>(len.max(1))
            .map_err(CudaError::driver)?;
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(stream);
            ptr
        };
        Ok(DeviceBuf { slice, ptr })
    }

    /// A copy of `host` on the device.
    pub fn from_host(stream: &Arc<CudaStream>, host: &[T]) -> Result<Self, CudaError> {
        let mut buf = Self::zeros(stream, host.len())?;
        buf.write(stream, host)?;
        Ok(buf)
    }

    /// Copies `host` to the start of the buffer.
    pub fn write(&mut self, stream: &Arc<CudaStream>, host: &[T]) -> Result<(), CudaError> {
        self.write_at(stream, 0, host)
    }

    /// Copies `host` into the buffer from element `at` on.
    pub fn write_at(
        &mut self,
        stream: &Arc<CudaStream>,
        at: usize,
        host: &[T],
    ) -> Result<(), CudaError> {
        if at + host.len() > self.slice.len() {
            return Err(CudaError::Failure(format!(
                "copy of {} elements from element {at} into a buffer of {}",
                host.len(),
                self.slice.len()
            )));
        }
        if host.is_empty() {
            return Ok(());
        }
        let mut view = self.slice.slice_mut(at..at + host.len());
        stream
            .memcpy_htod(host, &mut view)
            .map_err(CudaError::driver)
    }

    /// The first `len` elements, copied to the host (waits for the stream).
    pub fn read(&self, stream: &Arc<CudaStream>, len: usize) -> Result<Vec<T>, CudaError> {
        let view = self.slice.slice(..len.min(self.slice.len()));
        stream.clone_dtoh(&view).map_err(CudaError::driver)
    }

    /// Makes room for `len` elements, reallocating (contents lost) only when growing.
    /// Returns whether it reallocated (the address changed).
    pub fn ensure(&mut self, stream: &Arc<CudaStream>, len: usize) -> Result<bool, CudaError> {
        if len > self.slice.len() {
            // Grow geometrically so that a slowly rising batch does not reallocate each step.
            *self = Self::zeros(stream, len.max(self.slice.len() * 3 / 2))?;
            return Ok(true);
        }
        Ok(false)
    }
}
