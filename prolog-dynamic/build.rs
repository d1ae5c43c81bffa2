// How tenancy-prolog-dynamic is linked: build-support/link.rs (dynamically, against glibc, so
// that it can load NVML and NSS modules; libgcc's unwinder linked in).
include!("../build-support/link.rs");

fn main() {
    if let Some(dir) = link_dir() {
        static_libgcc(&dir);
    }
}
