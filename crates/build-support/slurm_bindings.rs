// Shared by the build scripts of spank-tenancy and job-submit-tenancy (included, not a crate).
//
// Slurm's plugins must be built against the headers of the Slurm that loads them (the version
// number they carry is checked at load, and struct layouts change between releases), so the
// bindings are always generated with bindgen from the headers in SLURM_INCLUDE_DIR (default
// /usr/include, package libslurm-dev): there are no checked-in bindings to fall back on, as a
// plugin built for another release would be refused at load or, worse, read the wrong field.
//
// What differs between releases is selected by the headers' SLURM_VERSION_NUMBER, handed to
// the crate as cfg flags (`slurm_ge_MM_mm`: this release or a later one) and as the constant.
// A field the crate reads that the headers lack fails the build with a message naming the
// struct, the field, the release and the folder.

include!("slurm_headers.rs");

/// Writes `OUT_DIR/bindings.rs` for `krate` from `<SLURM_INCLUDE_DIR>/<header>` (parsed through
/// `wrapper`, the C text that includes it), with what `configure` allows; `uses` gives, for the
/// headers' version number, the (struct, field) pairs the crate reads. Panics (fails the build)
/// with the reason and the remedy when the headers, libclang or a field are missing.
fn slurm_bindings(
    krate: &str,
    header: &str,
    wrapper: &str,
    configure: impl FnOnce(bindgen::Builder) -> bindgen::Builder,
    uses: impl FnOnce(u32) -> Vec<(&'static str, &'static str)>,
) {
    use std::path::PathBuf;
    println!("cargo:rerun-if-env-changed=SLURM_INCLUDE_DIR");
    let names: Vec<String> = SLURM_RELEASES
        .iter()
        .map(|(n, _)| format!("slurm_ge_{n}"))
        .collect();
    println!("cargo::rustc-check-cfg=cfg({})", names.join(", "));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("bindings.rs");
    let (include, how) = match std::env::var("SLURM_INCLUDE_DIR") {
        Ok(dir) => (PathBuf::from(dir), "SLURM_INCLUDE_DIR"),
        Err(_) => (PathBuf::from("/usr/include"), "the default, /usr/include"),
    };
    let path = include.join(header);
    let fail = |why: String| -> ! {
        panic!(
            "\n{krate}: cannot build against the Slurm headers in {} ({how}): {why}\n\
             remedy: install the headers of the Slurm that will load the plugin (Debian: \
             apt-get install libslurm-dev) or point SLURM_INCLUDE_DIR at their folder (the one \
             holding {header})\n",
            include.display()
        )
    };
    if !path.is_file() {
        fail(format!("{} not found", path.display()));
    }
    let number = slurm_version_number(&include).unwrap_or_else(|e| fail(e));
    println!("cargo:rerun-if-changed={}", path.display());
    println!(
        "cargo:rerun-if-changed={}",
        include.join("slurm/slurm_version.h").display()
    );
    for (name, at) in SLURM_RELEASES {
        if number >= *at {
            println!("cargo:rustc-cfg=slurm_ge_{name}");
        }
    }
    // clang gets the Slurm folder alone (a copy in OUT_DIR), not all of `include`: that is
    // usually /usr/include, whose C library headers would then come before the ones the
    // target's compiler names (scripts/build-portable's zig, for glibc 2.28: its headers and
    // `__GLIBC_MINOR__` in BINDGEN_EXTRA_CLANG_ARGS) and clash with them.
    let own = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("slurm-include");
    if let Err(e) = copy_slurm_headers(&include, &own) {
        fail(format!("cannot copy the Slurm headers into {}: {e}", own.display()));
    }
    let builder = bindgen::Builder::default()
        .header_contents("wrapper.h", wrapper)
        .clang_arg(format!("-I{}", own.display()))
        .layout_tests(false);
    // bindgen panics when libclang cannot be loaded: say so plainly.
    let generated =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| configure(builder).generate()));
    let bindings = match generated {
        Ok(Ok(b)) => b.to_string(),
        Ok(Err(e)) => fail(format!("bindgen failed on {} ({e})", path.display())),
        Err(_) => fail("libclang not found (apt-get install libclang-dev)".into()),
    };
    if let Err(why) = check_fields(&bindings, number, krate, &uses(number)) {
        fail(why);
    }
    std::fs::write(&out, bindings).expect("write bindings.rs");
}

/// `<include>/slurm/*.h` into `<to>/slurm/`, and nothing else.
fn copy_slurm_headers(include: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    let dest = to.join("slurm");
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(&dest)?;
    for entry in std::fs::read_dir(include.join("slurm"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "h") && path.is_file() {
            std::fs::copy(&path, dest.join(path.file_name().expect("a file name")))?;
        }
    }
    Ok(())
}
