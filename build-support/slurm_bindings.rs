// Shared by the build scripts of spank-tenancy and job-submit-tenancy (included, not a crate).
//
// Slurm's plugins must be built against the headers of the Slurm that loads them (the version
// number they carry is checked at load, and struct layouts change between releases), so the
// bindings are generated from the headers installed on the build host (package libslurm-dev;
// SLURM_INCLUDE_DIR to use others). Without libclang (package libclang-dev) or without the
// header, the crate's checked-in bindings, generated from Slurm 22.05's headers, are used and
// a warning says so.

/// Writes `OUT_DIR/bindings.rs` for `krate` from `include/<header>` (parsed through `wrapper`,
/// the C text that includes it), with what `configure` allows, or copies `src/sys_22_05.rs`.
fn slurm_bindings(
    krate: &str,
    header: &str,
    wrapper: &str,
    configure: impl FnOnce(bindgen::Builder) -> bindgen::Builder,
) {
    use std::path::PathBuf;
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    println!("cargo:rerun-if-changed=src/sys_22_05.rs");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("bindings.rs");
    let include =
        PathBuf::from(std::env::var("SLURM_INCLUDE_DIR").unwrap_or_else(|_| "/usr/include".into()));
    let path = include.join(header);
    let fallback = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"))
        .join("src/sys_22_05.rs");
    let why = if path.is_file() {
        println!("cargo:rerun-if-changed={}", path.display());
        println!(
            "cargo:rerun-if-changed={}",
            include.join("slurm/slurm_version.h").display()
        );
        let builder = bindgen::Builder::default()
            .header_contents("wrapper.h", wrapper)
            .clang_arg(format!("-I{}", include.display()))
            .layout_tests(false);
        // bindgen panics when libclang cannot be loaded: fall back instead of failing the build.
        let generated =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| configure(builder).generate()));
        match generated {
            Ok(Ok(bindings)) => {
                bindings.write_to_file(&out).expect("write bindings.rs");
                return;
            }
            Ok(Err(e)) => format!("bindgen failed on {} ({e})", path.display()),
            Err(_) => "libclang not found (install libclang-dev)".to_string(),
        }
    } else {
        format!("{} not found (install libslurm-dev)", path.display())
    };
    println!("cargo:warning={krate}: {why}; using the checked-in Slurm 22.05 bindings");
    std::fs::copy(&fallback, &out).expect("copy fallback bindings");
}
