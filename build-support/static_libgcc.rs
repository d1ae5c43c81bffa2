// Shared by the build scripts of tenancy-prolog and tenancy-epilog (included, not a crate).
//
// Links GCC's unwinder statically (libgcc_eh.a) instead of loading libgcc_s.so.1, as C's
// `-static-libgcc` does. Both binaries start once per job: loading libgcc_s costs a library
// mapping, its relocations and its CPU-model constructor (CPUID, which traps to the hypervisor
// in a VM); measured 0.11 ms per process here (BENCHMARKS.md). rustc always asks the linker
// for `-lgcc_s` on *-linux-gnu, so the build script puts a folder holding `libgcc_s.a` (a link
// to libgcc_eh.a) first on the search path: ld takes the first folder that has either file.
// Anything unexpected (another libc, crt-static, no libgcc_eh.a) keeps the default, and so does
// TENANCY_SHARED_LIBGCC=1 in the build's environment (A/B of the two, BENCHMARKS.md).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=../build-support/static_libgcc.rs");
    println!("cargo:rerun-if-env-changed=TENANCY_SHARED_LIBGCC");
    println!("cargo:rerun-if-env-changed=CC");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if env("CARGO_CFG_TARGET_OS") != "linux"
        || env("CARGO_CFG_TARGET_ENV") != "gnu"
        || env("CARGO_CFG_TARGET_FEATURE")
            .split(',')
            .any(|f| f == "crt-static")
        || std::env::var_os("TENANCY_SHARED_LIBGCC").is_some()
    {
        return;
    }
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let found = std::process::Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute() && p.is_file());
    let Some(eh) = found else {
        println!("cargo:warning=libgcc_eh.a not found through `{cc} -print-file-name`; linking libgcc_s.so.1 (slower start)");
        return;
    };
    let dir = std::path::PathBuf::from(env("OUT_DIR")).join("static-libgcc");
    std::fs::create_dir_all(&dir).expect("create OUT_DIR/static-libgcc");
    let link = dir.join("libgcc_s.a");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&eh, &link).expect("link libgcc_s.a to libgcc_eh.a");
    println!("cargo:rustc-link-search=native={}", dir.display());
}
