// How tenancy-epilog is linked: build-support/link.rs.
include!("../build-support/link.rs");

fn main() {
    if let Some(dir) = link_dir() {
        if static_libgcc(&dir) {
            static_glibc(&dir, "tenancy-epilog", "TENANCY_DYNAMIC_EPILOG");
        }
    }
}
