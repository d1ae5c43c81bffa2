// The parts of build-support/slurm_bindings.rs that need no bindgen: the headers' version and
// the check that the generated bindings have every field a crate reads (included by the build
// scripts, and by job-submit-tenancy's unit tests).

/// The releases the crates know about, oldest first: `slurm_ge_<name>` is set for every one at
/// or below the headers' version.
const SLURM_RELEASES: &[(&str, u32)] = &[
    ("22_05", 0x16_05_00),
    ("24_11", 0x18_0b_00),
    ("26_05", 0x1a_05_00),
];

/// `SLURM_VERSION_NUMBER` from `<include>/slurm/slurm_version.h`, e.g. 0x180b05 for 24.11.5.
fn slurm_version_number(include: &std::path::Path) -> Result<u32, String> {
    let path = include.join("slurm/slurm_version.h");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("#define") && w.next() == Some("SLURM_VERSION_NUMBER"))
                .then(|| w.next())
                .flatten()
        })
        .and_then(|v| u32::from_str_radix(v.trim_start_matches("0x"), 16).ok())
        .ok_or_else(|| format!("{} defines no SLURM_VERSION_NUMBER", path.display()))
}

/// 0x180b05 as "24.11.5".
fn slurm_version_text(n: u32) -> String {
    format!("{}.{:02}.{}", n >> 16, (n >> 8) & 0xff, n & 0xff)
}

/// Fields of `strukt` (as bindgen names it) in the generated text, or None without the struct.
fn struct_fields(bindings: &str, strukt: &str) -> Option<Vec<String>> {
    let start = bindings.find(&format!("pub struct {strukt} {{"))?;
    let body = &bindings[start..];
    let body = &body[..body.find("\n}")?];
    Some(
        body.lines()
            .filter_map(|l| l.trim().strip_prefix("pub "))
            .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_string()))
            .collect(),
    )
}

/// Every (struct, field) of `uses` in the generated `bindings`, or the message that names
/// what is missing, the release and the crate.
fn check_fields(
    bindings: &str,
    number: u32,
    krate: &str,
    uses: &[(&str, &str)],
) -> Result<(), String> {
    let mut missing = Vec::new();
    for (strukt, field) in uses {
        match struct_fields(bindings, strukt) {
            None => missing.push(format!("struct {strukt} is missing")),
            Some(fields) if !fields.iter().any(|f| f == field) => {
                missing.push(format!("struct {strukt} has no field `{field}`"))
            }
            Some(_) => {}
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "Slurm {} (SLURM_VERSION_NUMBER {number:#x}): {}, which {krate} reads; this release \
         needs code of its own in {krate} (selected by `slurm_ge_*`)",
        slurm_version_text(number),
        missing.join("; ")
    ))
}
