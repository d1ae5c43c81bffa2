#![cfg_attr(not(test), no_main)]
//! `tenancy-epilog`: Slurm runs it as root on the node after the job (Epilog= in slurm.conf).
//! It takes no arguments; the config is found through SLURM_CONF (see tenancy-config).
//! It is statically linked (build-support/link.rs) and hands a job whose teardown needs NVML
//! to `tenancy-prolog-dynamic --epilog` in the same folder (see
//! `tenancy_node::run::epilog_status`).
//! C's `main` is defined here, not Rust's: see `tenancy_node::run::c_main`.

#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(
    _argc: std::os::raw::c_int,
    _argv: *const *const std::os::raw::c_char,
) -> std::os::raw::c_int {
    tenancy_node::run::c_main(tenancy_node::run::epilog_status)
}

/// Built for musl (scripts/build-job-path): dlmalloc instead of musl's allocator, which gives
/// memory back to the kernel at once, an mmap and munmap per allocation group (BENCHMARKS.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;
