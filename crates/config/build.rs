// The serialized form of a validated config (job/src/config_cache.rs keeps one) follows the
// types in these sources: any change to them gives another schema id, so no build reads a
// cache written by a build whose types differ.
use sha2::{Digest, Sha256};

fn main() {
    let mut h = Sha256::new();
    for f in [
        "src/lib.rs",
        "src/billing.rs",
        "src/dest.rs",
        "src/ipv4net.rs",
        "src/hostlist.rs",
        "src/scheduler.rs",
    ] {
        println!("cargo:rerun-if-changed={f}");
        h.update(f.as_bytes());
        h.update(std::fs::read(f).unwrap_or_else(|e| panic!("{f}: {e}")));
    }
    let id: String = h.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    println!("cargo:rustc-env=TENANCY_CONFIG_SCHEMA={id}");
}
