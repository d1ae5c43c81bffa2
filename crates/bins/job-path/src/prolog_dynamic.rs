#![cfg_attr(not(test), no_main)]
//! `tenancy-prolog-dynamic`: the prolog (no arguments) and, with `--epilog`, the epilog,
//! dynamically linked. The statically linked `tenancy-prolog` and `tenancy-epilog` start
//! faster but cannot load shared libraries; they hand it, with the same environment, the jobs
//! that need one: a MIG slice (NVML), users or groups that NSS modules such as sssd or LDAP
//! decide (see `tenancy_node::linkage`). A node whose users all come from such a source can
//! name it in Prolog= directly (docs/admin-guide.md). C's `main` is defined here, not Rust's: see
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
