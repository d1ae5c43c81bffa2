// How tenancy-prolog is linked: build-support/link.rs.
include!("../build-support/link.rs");

fn main() {
    if let Some(dir) = link_dir() {
        static_libgcc(&dir);
    }
}
