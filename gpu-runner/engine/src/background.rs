//! Work beside the engine's steps (the grammar vocabulary build, preparing requests) runs on
//! threads that take a CPU only when the steps leave one: on a small CPU runner they would
//! otherwise take a core from the requests being served.

/// Makes the calling thread the last to get a CPU (nice 19); best effort.
pub fn lower_this_threads_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: plain syscalls on the calling thread (Linux applies nice per thread, and
        // `gettid` names this one); a failure only leaves the priority as it was.
        unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, 19);
        }
    }
}
