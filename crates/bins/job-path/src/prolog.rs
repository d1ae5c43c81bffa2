#![cfg_attr(not(test), no_main)]
//! `tenancy-prolog`: Slurm runs it as root on the node before the job (Prolog= in slurm.conf),
//! without arguments; the config is found through SLURM_CONF (see tenancy-config). It is
//! statically linked (build-support/link.rs) and hands a job that needs a shared library (NVML
//! for a MIG slice, NSS modules for its user or groups) to `tenancy-prolog-dynamic` in the same
//! folder (see `tenancy_node::run::prolog_status`). `tenancy-prolog --epilog` runs the epilog,
//! as `tenancy-epilog` does. C's `main` is defined here, not Rust's: see
//! `tenancy_node::run::c_main`.

#[cfg(not(test))]
#[no_mangle]
/// # Safety
/// Called by the C runtime alone, with its own `argc` and `argv`.
pub unsafe extern "C" fn main(
    argc: std::os::raw::c_int,
    argv: *const *const std::os::raw::c_char,
) -> std::os::raw::c_int {
    // SAFETY: C's own argc and argv.
    unsafe { tenancy_node::run::prolog_main(argc, argv) }
}

/// Built for musl (scripts/build-job-path): dlmalloc instead of musl's allocator, which gives
/// memory back to the kernel at once, an mmap and munmap per allocation group (BENCHMARKS.md).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;
