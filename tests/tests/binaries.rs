//! How the job-path binaries are linked: they start once per job (BENCHMARKS.md).

use std::process::Command;
use tenancy_e2e::artifact;

/// The prolog and epilog link GCC's unwinder statically (build-support/static_libgcc.rs): the
/// loader maps no libgcc_s.so.1 and its CPUID-heavy constructor does not run per job. glibc
/// stays shared (NSS modules such as sssd need it).
#[test]
fn prolog_and_epilog_need_only_libc() {
    for name in ["tenancy-prolog", "tenancy-epilog"] {
        let bin = match artifact(name) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("SKIP prolog_and_epilog_need_only_libc: {e}");
                return;
            }
        };
        let out = match Command::new("readelf").arg("-dW").arg(&bin).output() {
            Ok(o) if o.status.success() => o,
            other => {
                eprintln!(
                    "SKIP prolog_and_epilog_need_only_libc: readelf (binutils) unusable: {other:?}"
                );
                return;
            }
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let needed: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(|l| l.split('[').nth(1)?.split(']').next())
            .collect();
        assert!(
            needed.iter().any(|n| n.starts_with("libc.so")),
            "{name}: NEEDED {needed:?}"
        );
        assert!(
            !needed.iter().any(|n| n.starts_with("libgcc_s")),
            "{name} loads libgcc_s at every start: NEEDED {needed:?} (build-support/static_libgcc.rs)"
        );
    }
}
