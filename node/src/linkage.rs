//! How this process was linked. `tenancy-epilog` is a static PIE (build-support/link.rs): it
//! starts without the dynamic loader, and so cannot load shared libraries such as NVML.

/// True when the dynamic loader started this process, so it can load shared libraries. The
/// kernel starts a static program directly: no interpreter, and AT_BASE (the interpreter's
/// load address) is 0. dlopen in a static glibc program would load a second libc beside the
/// built-in one (the NVML stand-in crashes there), so a layer that needs a library asks first.
pub fn can_load_libraries() -> bool {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave the process.
    unsafe { libc::getauxval(libc::AT_BASE) != 0 }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_test_binary_is_dynamically_linked() {
        // cargo links test harnesses dynamically; a false here would mean AT_BASE is misread.
        assert!(super::can_load_libraries());
    }
}
