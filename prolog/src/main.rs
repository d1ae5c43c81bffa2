#![cfg_attr(not(test), no_main)]
//! `tenancy-prolog`: Slurm runs it as root on the node before the job (Prolog= in slurm.conf).
//! It takes no arguments; the config is found through SLURM_CONF (see tenancy-config).
//! C's `main` is defined here, not Rust's: see `tenancy_node::run::c_main`.

#[cfg(not(test))]
#[no_mangle]
pub extern "C" fn main(
    _argc: std::os::raw::c_int,
    _argv: *const *const std::os::raw::c_char,
) -> std::os::raw::c_int {
    tenancy_node::run::c_main(tenancy_node::run::prolog_status)
}
