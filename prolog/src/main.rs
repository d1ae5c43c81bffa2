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
pub extern "C" fn main(
    argc: std::os::raw::c_int,
    _argv: *const *const std::os::raw::c_char,
) -> std::os::raw::c_int {
    tenancy_node::run::prolog_main(argc)
}
