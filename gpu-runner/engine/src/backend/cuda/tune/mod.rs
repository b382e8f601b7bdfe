//! Load-time choices measured on the user's own GPU: which decode GEMV variant serves each
//! shape ([`gemv_tune`], among those [`gemv_check`] finds correct on this GPU), and whether
//! the int8 tensor-core products serve a quantized shape ([`mmq_check`], [`mmq_tune`]).
//! Both time through [`launch_timer`]. Nothing here changes what a kernel computes: it only
//! picks among kernels that agree.

pub mod gemv_check;
pub mod gemv_tune;
pub mod launch_timer;
pub mod mmq_check;
pub mod mmq_tune;
