// How tenancy-prolog is linked: build-support/link.rs (a static PIE, as tenancy-epilog).
include!("../build-support/link.rs");

fn main() {
    if let Some(dir) = link_dir() {
        if static_libgcc(&dir) {
            static_glibc(&dir, "tenancy-prolog", "TENANCY_DYNAMIC_PROLOG");
        }
    }
}
