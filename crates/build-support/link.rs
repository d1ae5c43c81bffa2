// Shared by the build scripts of the job path (crates/bins/job-path: tenancy-prolog,
// tenancy-epilog, tenancy-prolog-dynamic) and the NVML stand-in (included, not a crate).
//
// The prolog and epilog start once per job, so how they are linked is part of the job path's
// cost (BENCHMARKS.md). rustc offers no per-binary `crt-static` on a stable toolchain, so the
// build scripts steer the linker through its library search path: folders in OUT_DIR come
// first on it, and hold the static archives that should win over the shared libraries of the
// same names (the linker takes the first folder that has either file). One folder serves every
// program of the package (libgcc); each static program adds a folder of its own (glibc's
// archives), named on its link line alone, so the three programs of one package link each
// their own way.
//
// - `static_libgcc` (all four): GCC's unwinder from libgcc_eh.a instead of loading
//   libgcc_s.so.1, as C's `-static-libgcc` does (rustc always asks for `-lgcc_s` on
//   *-linux-gnu). Loading libgcc_s costs a library mapping, its relocations and its CPU-model
//   constructor (CPUID, which traps to the hypervisor in a VM): 0.11 ms per process here.
// - `static_glibc` (tenancy-prolog and tenancy-epilog): glibc's archives too, and
//   `-static-pie`: no dynamic loader, no libc.so.6 to map, relocate and bind; 0.26 ms less per
//   epilog and 0.5 ms less per prolog here. Still PIEs (ASLR). A static program cannot load
//   shared libraries: NVML for a MIG slice, NSS modules (sssd, LDAP, systemd) for users and
//   groups, which a static glibc can only load from the exact glibc build it was linked with.
//   So the two hand the jobs that need one to tenancy-prolog-dynamic, the same code linked
//   dynamically, installed beside them (node/src/run.rs, node/src/linkage.rs): a MIG job, and
//   on nodes whose users and groups come from more than /etc/passwd and /etc/group, every job
//   (such a site can name tenancy-prolog-dynamic in Prolog= directly). A static binary keeps
//   the glibc it was built with: rebuild and reinstall it after a glibc security update.
//
// This is how `cargo build` links them. What a node installs is scripts/build-job-path's build
// of the same two for musl (`--target <arch>-unknown-linux-musl`, where Rust links static PIEs
// by itself and this script does nothing): musl starts without glibc's CPUID probing.
//
// Anything unexpected (another libc, crt-static already, an archive missing) keeps the
// default linking; so do TENANCY_SHARED_LIBGCC=1, TENANCY_DYNAMIC_PROLOG=1 and
// TENANCY_DYNAMIC_EPILOG=1 in the build's environment (A/B of the two, BENCHMARKS.md).

/// The folder put first on the linker's search path of every program of the package, or None
/// when this target is not Linux with glibc (or crt-static is on already).
fn link_dirs() -> Option<std::path::PathBuf> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={}", file!());
    println!("cargo:rerun-if-env-changed=CC");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if env("CARGO_CFG_TARGET_OS") != "linux"
        || env("CARGO_CFG_TARGET_ENV") != "gnu"
        || env("CARGO_CFG_TARGET_FEATURE")
            .split(',')
            .any(|f| f == "crt-static")
    {
        return None;
    }
    let dir = std::path::PathBuf::from(env("OUT_DIR")).join("link");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create OUT_DIR/link");
    println!("cargo:rustc-link-search=native={}", dir.display());
    Some(dir)
}

/// Where the C compiler finds `file` (`cc -print-file-name`), when it does.
fn c_library(file: &str) -> Option<std::path::PathBuf> {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    std::process::Command::new(&cc)
        .arg(format!("-print-file-name={file}"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute() && p.is_file())
}

/// `dir/name` becomes a link to `target`.
fn put(dir: &std::path::Path, name: &str, target: &std::path::Path) {
    std::os::unix::fs::symlink(target, dir.join(name))
        .unwrap_or_else(|e| panic!("link {name} to {}: {e}", target.display()));
}

/// libgcc_s.a (a link to libgcc_eh.a) in `dir`; false when libgcc_eh.a is not found.
fn static_libgcc(dir: &std::path::Path) -> bool {
    println!("cargo:rerun-if-env-changed=TENANCY_SHARED_LIBGCC");
    if std::env::var_os("TENANCY_SHARED_LIBGCC").is_some() {
        return false;
    }
    let Some(eh) = c_library("libgcc_eh.a") else {
        println!("cargo:warning=libgcc_eh.a not found through `cc -print-file-name`; linking libgcc_s.so.1 (slower start)");
        return false;
    };
    put(dir, "libgcc_s.a", &eh);
    true
}

/// Links binary `bin` as a static PIE: glibc's archives in a folder of its own beside `dir`,
/// searched by its link alone (rustc asks for these libraries by name), and `-static-pie`,
/// which picks the start files that relocate the program itself. Needs static_libgcc first (a
/// static link cannot take libgcc_s.so.1). `opt_out`: the build environment variable that
/// keeps `bin` dynamically linked.
#[allow(dead_code)] // the NVML stand-in's build script includes this file too
fn static_glibc(dir: &std::path::Path, bin: &str, opt_out: &str) {
    println!("cargo:rerun-if-env-changed={opt_out}");
    // Architectures whose glibc and rustc build static PIEs (x86_64 is the one measured here).
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if std::env::var_os(opt_out).is_some()
        || !matches!(arch.as_str(), "x86_64" | "aarch64")
    {
        return;
    }
    let names = ["c", "m", "pthread", "dl", "rt", "util"];
    let mut found = Vec::new();
    for n in names {
        let file = format!("lib{n}.a");
        match c_library(&file) {
            Some(p) => found.push((file, p)),
            None => {
                println!("cargo:warning={file} not found through `cc -print-file-name` (libc6-dev); {bin} stays dynamically linked (slower start)");
                return;
            }
        }
    }
    if c_library("rcrt1.o").is_none() {
        println!("cargo:warning=rcrt1.o (static-pie start file) not found; {bin} stays dynamically linked (slower start)");
        return;
    }
    let own = dir.with_file_name(format!("link-{bin}"));
    let _ = std::fs::remove_dir_all(&own);
    std::fs::create_dir_all(&own).expect("create OUT_DIR/link-<bin>");
    for (file, path) in &found {
        put(&own, file, path);
    }
    // GNU ld takes every -L for every -l, in command-line order; no folder before this one
    // holds these names (the shared one has libgcc alone, the rest are Rust's own).
    println!("cargo:rustc-link-arg-bin={bin}=-L{}", own.display());
    println!("cargo:rustc-link-arg-bin={bin}=-static-pie");
}
